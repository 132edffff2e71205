#include "workers/algos/torch_functional.hpp"

#include <torch/torch.h>

#include "workers/algos/internal/check.hpp"
#include "workers/algos/internal/ops.hpp"

namespace tessera::algos {

using internal::guarded;

namespace {

Status check_values_mask(const char* fn, const at::Tensor& values, const at::Tensor& mask) {
  TESSERA_RETURN_IF_ERROR(internal::check_floating(fn, "values", values));
  return internal::check_same_shape(fn, "values", values, "mask", mask);
}

Status check_axis(const char* fn, const at::Tensor& values, std::optional<int64_t> axis) {
  if (!axis) return Status();
  const int64_t d = values.dim();
  if (*axis >= -d && *axis < d) return Status();
  return make_error(ErrorCode::out_of_range, "{}: axis {} is out of range for shape {}", fn, *axis,
                    internal::shape_str(values));
}

}  // namespace

Result<at::Tensor> masked_sum(const at::Tensor& values, const at::Tensor& mask, std::optional<int64_t> axis) {
  TESSERA_RETURN_IF_ERROR(check_values_mask("masked_sum", values, mask));
  TESSERA_RETURN_IF_ERROR(check_axis("masked_sum", values, axis));
  return guarded("masked_sum", [&]() -> Result<at::Tensor> { return internal::masked_sum(values, mask, axis); });
}

Result<at::Tensor> masked_mean(const at::Tensor& values, const at::Tensor& mask, std::optional<int64_t> axis) {
  TESSERA_RETURN_IF_ERROR(check_values_mask("masked_mean", values, mask));
  TESSERA_RETURN_IF_ERROR(check_axis("masked_mean", values, axis));
  return guarded("masked_mean", [&]() -> Result<at::Tensor> { return internal::masked_mean(values, mask, axis); });
}

Result<at::Tensor> masked_var(const at::Tensor& values, const at::Tensor& mask, bool unbiased) {
  TESSERA_RETURN_IF_ERROR(check_values_mask("masked_var", values, mask));
  return guarded("masked_var", [&] { return internal::masked_var(values, mask, unbiased); });
}

Result<at::Tensor> masked_whiten(const at::Tensor& values, const at::Tensor& mask, bool shift_mean) {
  TESSERA_RETURN_IF_ERROR(check_values_mask("masked_whiten", values, mask));
  return guarded("masked_whiten", [&] { return internal::masked_whiten(values, mask, shift_mean); });
}

Result<at::Tensor> clip_by_value(const at::Tensor& x, const at::Tensor& tensor_min, const at::Tensor& tensor_max) {
  TESSERA_RETURN_IF_ERROR(internal::check_floating("clip_by_value", "x", x));
  TESSERA_RETURN_IF_ERROR(internal::check_floating("clip_by_value", "tensor_min", tensor_min));
  TESSERA_RETURN_IF_ERROR(internal::check_floating("clip_by_value", "tensor_max", tensor_max));
  return guarded("clip_by_value", [&]() -> Result<at::Tensor> {
    return at::max(at::min(x, tensor_max), tensor_min);
  });
}

Result<at::Tensor> entropy_from_logits(const at::Tensor& logits) {
  TESSERA_RETURN_IF_ERROR(internal::check_min_dim("entropy_from_logits", "logits", logits, 1));
  TESSERA_RETURN_IF_ERROR(internal::check_floating("entropy_from_logits", "logits", logits));
  return guarded("entropy_from_logits", [&]() -> Result<at::Tensor> {
    const at::Tensor pd = at::softmax(logits, -1);
    return at::logsumexp(logits, {-1}) - (pd * logits).sum(-1);
  });
}

namespace {

Status check_labels(const at::Tensor& logits, const at::Tensor& labels) {
  constexpr const char* fn = "logprobs_from_logits";
  TESSERA_RETURN_IF_ERROR(internal::check_min_dim(fn, "logits", logits, 1));
  TESSERA_RETURN_IF_ERROR(internal::check_floating(fn, "logits", logits));
  TESSERA_RETURN_IF_ERROR(internal::check_dim(fn, "labels", labels, logits.dim() - 1));
  if (labels.sizes() != logits.sizes().slice(0, logits.dim() - 1)) {
    return make_error(ErrorCode::invalid_argument, "{}: 'labels' shape {} does not match 'logits' shape {} minus the vocab dim",
                      fn, internal::shape_str(labels), internal::shape_str(logits));
  }
  if (at::isFloatingType(labels.scalar_type()) || labels.scalar_type() == at::kBool) {
    return make_error(ErrorCode::invalid_argument, "{}: 'labels' must be an integer tensor", fn);
  }
  if (labels.numel() == 0) return Status();
  const int64_t vocab = logits.size(-1);
  const int64_t lo = labels.min().item<int64_t>();
  const int64_t hi = labels.max().item<int64_t>();
  if (lo < 0 || hi >= vocab) {
    return make_error(ErrorCode::out_of_range, "{}: label {} is outside the vocab [0, {})", fn, lo < 0 ? lo : hi,
                      vocab);
  }
  return Status();
}

}  // namespace

Result<at::Tensor> logprobs_from_logits(const at::Tensor& logits, const at::Tensor& labels) {
  TESSERA_RETURN_IF_ERROR(guarded("logprobs_from_logits", [&] { return check_labels(logits, labels); }));
  return guarded("logprobs_from_logits", [&]() -> Result<at::Tensor> {
    const at::Tensor index = labels.to(at::kLong).unsqueeze(-1);
    if (logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kDouble) {
      // verl's logprobs_from_logits_v2: x_label - logsumexp(x), no (.., V) log-softmax buffer.
      return logits.gather(-1, index).squeeze(-1) - at::logsumexp(logits, {-1});
    }
    // Low precision: logsumexp is unstable in bf16, so verl falls back to log_softmax.
    return at::log_softmax(logits, -1).gather(-1, index).squeeze(-1);
  });
}

}  // namespace tessera::algos
