#include "workers/algos/kl.hpp"

#include <algorithm>
#include <utility>

#include <torch/torch.h>

#include "workers/algos/internal/check.hpp"

namespace tessera::algos {

namespace {

using KLFn = at::Tensor (*)(const at::Tensor& logprob, const at::Tensor& ref_logprob);

at::Tensor kl_k1(const at::Tensor& logprob, const at::Tensor& ref_logprob) { return logprob - ref_logprob; }

at::Tensor kl_abs(const at::Tensor& logprob, const at::Tensor& ref_logprob) { return (logprob - ref_logprob).abs(); }

at::Tensor kl_k2(const at::Tensor& logprob, const at::Tensor& ref_logprob) {
  return 0.5 * (logprob - ref_logprob).square();
}

// J. Schulman, "Approximating KL divergence" (2020): k3 = r - log r - 1 with r = p_ref / p.
at::Tensor kl_k3(const at::Tensor& logprob, const at::Tensor& ref_logprob) {
  const at::Tensor kl = at::clamp(ref_logprob - logprob, -20.0, 20.0);
  const at::Tensor kld = (at::exp(kl) - kl - 1).contiguous();
  return at::clamp(kld, -10.0, 10.0);
}

const std::vector<std::pair<std::string, KLFn>>& kl_table() {
  static const std::vector<std::pair<std::string, KLFn>> table = {
      {"kl", &kl_k1},  {"k1", &kl_k1},         {"abs", &kl_abs}, {"mse", &kl_k2},
      {"k2", &kl_k2},  {"low_var_kl", &kl_k3}, {"k3", &kl_k3},
  };
  return table;
}

}  // namespace

std::vector<std::string> kl_penalty_types() {
  std::vector<std::string> names;
  for (const auto& entry : kl_table()) names.push_back(entry.first);
  names.push_back("full");
  return names;
}

Result<at::Tensor> kl_penalty(const at::Tensor& logprob, const at::Tensor& ref_logprob, const std::string& kl_penalty) {
  constexpr const char* fn = "kl_penalty";
  TESSERA_RETURN_IF_ERROR(internal::check_floating(fn, "logprob", logprob));
  TESSERA_RETURN_IF_ERROR(internal::check_floating(fn, "ref_logprob", ref_logprob));
  TESSERA_RETURN_IF_ERROR(internal::check_same_shape(fn, "logprob", logprob, "ref_logprob", ref_logprob));
  if (kl_penalty == "full") {
    return make_error(ErrorCode::unimplemented,
                      "kl_penalty: type 'full' needs full-vocabulary logits and is not implemented (as in verl)");
  }
  for (const auto& [name, kl_fn] : kl_table()) {
    if (name == kl_penalty) {
      return internal::guarded(fn, [&, f = kl_fn]() -> Result<at::Tensor> { return f(logprob, ref_logprob); });
    }
  }
  return make_error(ErrorCode::invalid_argument, "kl_penalty: unknown type '{}' (known: {})", kl_penalty,
                    fmt::join(kl_penalty_types(), ", "));
}

Result<at::Tensor> compute_rewards(const at::Tensor& token_level_scores, const at::Tensor& old_log_prob,
                                   const at::Tensor& ref_log_prob, double kl_ratio) {
  constexpr const char* fn = "compute_rewards";
  TESSERA_RETURN_IF_ERROR(internal::check_floating(fn, "token_level_scores", token_level_scores));
  TESSERA_RETURN_IF_ERROR(internal::check_same_shape(fn, "token_level_scores", token_level_scores, "old_log_prob",
                                                     old_log_prob));
  TESSERA_RETURN_IF_ERROR(internal::check_same_shape(fn, "token_level_scores", token_level_scores, "ref_log_prob",
                                                     ref_log_prob));
  return internal::guarded(fn, [&]() -> Result<at::Tensor> {
    return token_level_scores - (old_log_prob - ref_log_prob) * kl_ratio;
  });
}

AdaptiveKLController::AdaptiveKLController(double init_kl_coef, double target_kl, int64_t horizon)
    : value_(init_kl_coef), target_(target_kl), horizon_(horizon) {}

void AdaptiveKLController::update(double current_kl, int64_t n_steps) {
  const double proportional_error = std::clamp(current_kl / target_ - 1.0, -0.2, 0.2);
  const double mult = 1.0 + proportional_error * static_cast<double>(n_steps) / static_cast<double>(horizon_);
  value_ *= mult;
}

Result<std::unique_ptr<KLController>> get_kl_controller(const KLControlConfig& config) {
  if (config.type == "fixed") {
    return std::unique_ptr<KLController>(std::make_unique<FixedKLController>(config.kl_coef));
  }
  if (config.type == "adaptive") {
    if (config.horizon <= 0) {
      return make_error(ErrorCode::invalid_argument, "algorithm.kl_ctrl.horizon must be larger than 0, got {}",
                        config.horizon);
    }
    if (config.target_kl == 0.0) {
      return make_error(ErrorCode::invalid_argument, "algorithm.kl_ctrl.target_kl must be non-zero");
    }
    return std::unique_ptr<KLController>(
        std::make_unique<AdaptiveKLController>(config.kl_coef, config.target_kl, config.horizon));
  }
  return make_error(ErrorCode::invalid_argument, "algorithm.kl_ctrl.type '{}' is unknown (known: fixed, adaptive)",
                    config.type);
}

}  // namespace tessera::algos
