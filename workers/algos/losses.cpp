#include "workers/algos/losses.hpp"

#include <utility>

#include <torch/torch.h>

#include "workers/algos/internal/check.hpp"
#include "workers/algos/internal/losses.hpp"
#include "workers/algos/internal/ops.hpp"

namespace tessera::algos {

namespace internal {
namespace {

using AggFn = at::Tensor (*)(const at::Tensor& loss_mat, const at::Tensor& mask);

at::Tensor token_mean(const at::Tensor& loss_mat, const at::Tensor& mask) {
  return internal::masked_mean(loss_mat, mask, std::nullopt);
}

at::Tensor seq_mean_token_sum(const at::Tensor& loss_mat, const at::Tensor& mask) {
  return (loss_mat * mask).sum(-1).mean();
}

at::Tensor seq_mean_token_mean(const at::Tensor& loss_mat, const at::Tensor& mask) {
  return ((loss_mat * mask).sum(-1) / mask.sum(-1)).mean();
}

at::Tensor seq_mean_token_sum_norm(const at::Tensor& loss_mat, const at::Tensor& mask) {
  // v0.5.0 divides by the padded response length (a constant), not by the token count.
  return (loss_mat * mask).sum(-1).sum() / static_cast<double>(mask.size(-1));
}

const std::vector<std::pair<std::string, AggFn>>& agg_table() {
  static const std::vector<std::pair<std::string, AggFn>> table = {
      {"token-mean", &token_mean},
      {"seq-mean-token-sum", &seq_mean_token_sum},
      {"seq-mean-token-mean", &seq_mean_token_mean},
      {"seq-mean-token-sum-norm", &seq_mean_token_sum_norm},
  };
  return table;
}

}  // namespace

Result<at::Tensor> agg_loss(const at::Tensor& loss_mat, const at::Tensor& loss_mask, const std::string& mode) {
  for (const auto& [name, fn] : agg_table()) {
    if (name == mode) return fn(loss_mat, as_value_mask(loss_mask, loss_mat));
  }
  return make_error(ErrorCode::invalid_argument, "agg_loss: invalid loss_agg_mode '{}' (known: {})", mode,
                    fmt::join(agg_loss_modes(), ", "));
}

}  // namespace internal

std::vector<std::string> agg_loss_modes() {
  std::vector<std::string> names;
  for (const auto& entry : internal::agg_table()) names.push_back(entry.first);
  return names;
}

Result<at::Tensor> agg_loss(const at::Tensor& loss_mat, const at::Tensor& loss_mask, const std::string& loss_agg_mode) {
  TESSERA_RETURN_IF_ERROR(internal::check_matrix_and_mask("agg_loss", "loss_mat", loss_mat, "loss_mask", loss_mask));
  return internal::guarded("agg_loss", [&] { return internal::agg_loss(loss_mat, loss_mask, loss_agg_mode); });
}

Result<ValueLossOutput> compute_value_loss(const at::Tensor& vpreds, const at::Tensor& returns,
                                           const at::Tensor& values, const at::Tensor& response_mask,
                                           double cliprange_value, const std::string& loss_agg_mode) {
  constexpr const char* fn = "compute_value_loss";
  TESSERA_RETURN_IF_ERROR(internal::check_matrix_and_mask(fn, "vpreds", vpreds, "response_mask", response_mask));
  TESSERA_RETURN_IF_ERROR(internal::check_same_shape(fn, "vpreds", vpreds, "returns", returns));
  TESSERA_RETURN_IF_ERROR(internal::check_same_shape(fn, "vpreds", vpreds, "values", values));
  if (!(cliprange_value >= 0.0)) {
    return make_error(ErrorCode::invalid_argument, "{}: cliprange_value must be >= 0, got {}", fn, cliprange_value);
  }
  return internal::guarded(fn, [&]() -> Result<ValueLossOutput> {
    const at::Tensor vpredclipped = at::max(at::min(vpreds, values + cliprange_value), values - cliprange_value);
    const at::Tensor vf_losses1 = (vpreds - returns).square();
    const at::Tensor vf_losses2 = (vpredclipped - returns).square();
    const at::Tensor clipped_vf_losses = at::max(vf_losses1, vf_losses2);
    TESSERA_ASSIGN_OR_RETURN(at::Tensor agg, internal::agg_loss(clipped_vf_losses, response_mask, loss_agg_mode));
    const at::Tensor clipped = at::gt(vf_losses2, vf_losses1).to(vpreds.scalar_type());
    return ValueLossOutput{0.5 * agg, internal::masked_mean(clipped, response_mask, std::nullopt)};
  });
}

Result<at::Tensor> compute_entropy_loss(const at::Tensor& logits, const at::Tensor& response_mask,
                                        const std::string& loss_agg_mode) {
  constexpr const char* fn = "compute_entropy_loss";
  TESSERA_RETURN_IF_ERROR(internal::check_dim(fn, "logits", logits, 3));
  TESSERA_RETURN_IF_ERROR(internal::check_floating(fn, "logits", logits));
  TESSERA_RETURN_IF_ERROR(internal::check_dim(fn, "response_mask", response_mask, 2));
  if (logits.size(0) != response_mask.size(0) || logits.size(1) != response_mask.size(1)) {
    return make_error(ErrorCode::invalid_argument, "{}: 'logits' shape {} does not match 'response_mask' shape {}",
                      fn, internal::shape_str(logits), internal::shape_str(response_mask));
  }
  return internal::guarded(fn, [&]() -> Result<at::Tensor> {
    const at::Tensor token_entropy = at::logsumexp(logits, {-1}) - (at::softmax(logits, -1) * logits).sum(-1);
    return internal::agg_loss(token_entropy, response_mask, loss_agg_mode);
  });
}

}  // namespace tessera::algos
