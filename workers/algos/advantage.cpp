// advantage.cpp: the registry plus the per-token estimators (gae, reinforce_plus_plus, remax).
// The group (outcome) estimators live in advantage_group.cpp.
#include "workers/algos/advantage.hpp"

#include <torch/torch.h>

#include "workers/algos/internal/advantage_check.hpp"
#include "workers/algos/internal/check.hpp"
#include "workers/algos/internal/ops.hpp"
#include "workers/algos/internal/registry.hpp"

namespace tessera::algos {

namespace internal {

Status check_rewards_and_mask(const char* fn, const at::Tensor& token_level_rewards, const at::Tensor& response_mask) {
  return check_matrix_and_mask(fn, "token_level_rewards", token_level_rewards, "response_mask", response_mask);
}

Status check_grouped(const char* fn, const at::Tensor& token_level_rewards, const at::Tensor& response_mask,
                     const std::vector<std::string>& index) {
  TESSERA_RETURN_IF_ERROR(check_rewards_and_mask(fn, token_level_rewards, response_mask));
  const auto bs = static_cast<size_t>(token_level_rewards.size(0));
  if (index.size() == bs) return Status();
  return make_error(ErrorCode::invalid_argument, "{}: 'index' has {} uids but token_level_rewards has {} rows", fn,
                    index.size(), bs);
}

}  // namespace internal

namespace {

using internal::as_value_mask;

// The backward GAE recursion; returns the raw (unwhitened) advantages.
at::Tensor gae_backward(const at::Tensor& rewards, const at::Tensor& values, const at::Tensor& mask, double gamma,
                        double lam) {
  const int64_t gen_len = rewards.size(1);
  at::Tensor nextvalues = at::zeros({rewards.size(0)}, values.options());
  at::Tensor lastgaelam = at::zeros({rewards.size(0)}, values.options());
  std::vector<at::Tensor> advantages(static_cast<size_t>(gen_len));
  for (int64_t t = gen_len - 1; t >= 0; --t) {
    const at::Tensor m = mask.select(1, t);
    const at::Tensor v = values.select(1, t);
    const at::Tensor delta = rewards.select(1, t) + gamma * nextvalues - v;
    const at::Tensor lastgaelam_ = delta + gamma * lam * lastgaelam;
    // Skip values and TD-error on observation (mask 0) tokens: carry the next ones through.
    nextvalues = v * m + (1 - m) * nextvalues;
    lastgaelam = lastgaelam_ * m + (1 - m) * lastgaelam;
    advantages[static_cast<size_t>(t)] = lastgaelam;
  }
  return at::stack(advantages, 1);
}

Result<AdvantageReturn> gae(const AdvantageInputs& in) {
  return compute_gae_advantage_return(in.token_level_rewards, in.values, in.response_mask, in.config.gamma,
                                      in.config.lam);
}

Result<AdvantageReturn> grpo(const AdvantageInputs& in) {
  return compute_grpo_outcome_advantage(in.token_level_rewards, in.response_mask, in.index, in.config.epsilon,
                                        in.config.norm_adv_by_std_in_grpo);
}

Result<AdvantageReturn> grpo_passk(const AdvantageInputs& in) {
  return compute_grpo_passk_outcome_advantage(in.token_level_rewards, in.response_mask, in.index, in.config.epsilon,
                                              in.config.norm_adv_by_std_in_grpo);
}

Result<AdvantageReturn> reinforce_plus_plus(const AdvantageInputs& in) {
  return compute_reinforce_plus_plus_outcome_advantage(in.token_level_rewards, in.response_mask, in.config.gamma);
}

Result<AdvantageReturn> reinforce_plus_plus_baseline(const AdvantageInputs& in) {
  return compute_reinforce_plus_plus_baseline_outcome_advantage(in.token_level_rewards, in.response_mask, in.index,
                                                                in.config.epsilon);
}

Result<AdvantageReturn> remax(const AdvantageInputs& in) {
  return compute_remax_outcome_advantage(in.token_level_rewards, in.reward_baselines, in.response_mask);
}

Result<AdvantageReturn> rloo(const AdvantageInputs& in) {
  return compute_rloo_outcome_advantage(in.token_level_rewards, in.response_mask, in.index, in.config.epsilon);
}

Result<AdvantageReturn> opo(const AdvantageInputs& in) {
  return compute_opo_outcome_advantage(in.token_level_rewards, in.response_mask, in.index, in.config.epsilon);
}

Result<AdvantageReturn> gpg(const AdvantageInputs& in) {
  return compute_gpg_outcome_advantage(in.token_level_rewards, in.response_mask, in.index, in.config.epsilon);
}

internal::Registry<AdvantageEstimatorFn>& registry() {
  static internal::Registry<AdvantageEstimatorFn> r(
      "advantage estimator", "algorithm.adv_estimator",
      {{"gae", &gae},
       {"grpo", &grpo},
       {"grpo_passk", &grpo_passk},
       {"reinforce_plus_plus", &reinforce_plus_plus},
       {"reinforce_plus_plus_baseline", &reinforce_plus_plus_baseline},
       {"remax", &remax},
       {"rloo", &rloo},
       {"opo", &opo},
       {"gpg", &gpg}});
  return r;
}

}  // namespace

Status register_adv_est(const std::string& name, AdvantageEstimatorFn fn) { return registry().add(name, std::move(fn)); }

Result<AdvantageEstimatorFn> get_adv_estimator_fn(const std::string& name) { return registry().get(name); }

std::vector<std::string> registered_adv_estimators() { return registry().names(); }

Result<AdvantageReturn> compute_gae_advantage_return(const at::Tensor& token_level_rewards, const at::Tensor& values,
                                                     const at::Tensor& response_mask, double gamma, double lam) {
  constexpr const char* fn = "compute_gae_advantage_return";
  TESSERA_RETURN_IF_ERROR(internal::check_rewards_and_mask(fn, token_level_rewards, response_mask));
  TESSERA_RETURN_IF_ERROR(internal::check_same_shape(fn, "token_level_rewards", token_level_rewards, "values", values));
  TESSERA_RETURN_IF_ERROR(internal::check_floating(fn, "values", values));
  return internal::guarded(fn, [&]() -> Result<AdvantageReturn> {
    torch::NoGradGuard no_grad;
    const at::Tensor mask = as_value_mask(response_mask, values);
    const at::Tensor advantages = gae_backward(token_level_rewards, values, mask, gamma, lam);
    const at::Tensor returns = advantages + values;
    auto whitened = internal::masked_whiten(advantages, mask, /*shift_mean=*/true);
    if (!whitened.ok()) return whitened.status().with_context(fn);
    return AdvantageReturn{*whitened, returns};
  });
}

Result<AdvantageReturn> compute_reinforce_plus_plus_outcome_advantage(const at::Tensor& token_level_rewards,
                                                                      const at::Tensor& response_mask, double gamma) {
  constexpr const char* fn = "compute_reinforce_plus_plus_outcome_advantage";
  TESSERA_RETURN_IF_ERROR(internal::check_rewards_and_mask(fn, token_level_rewards, response_mask));
  return internal::guarded(fn, [&]() -> Result<AdvantageReturn> {
    torch::NoGradGuard no_grad;
    const at::Tensor mask = as_value_mask(response_mask, token_level_rewards);
    at::Tensor returns = at::zeros_like(token_level_rewards);
    at::Tensor running_return = at::zeros({token_level_rewards.size(0)}, token_level_rewards.options());
    for (int64_t t = token_level_rewards.size(1) - 1; t >= 0; --t) {
      running_return = token_level_rewards.select(1, t) + gamma * running_return;
      returns.select(1, t).copy_(running_return);
      running_return = running_return * mask.select(1, t);  // reset after EOS
    }
    auto whitened = internal::masked_whiten(returns, mask, /*shift_mean=*/true);
    if (!whitened.ok()) return whitened.status().with_context(fn);
    return AdvantageReturn{*whitened * mask, returns};
  });
}

Result<AdvantageReturn> compute_remax_outcome_advantage(const at::Tensor& token_level_rewards,
                                                        const at::Tensor& reward_baselines,
                                                        const at::Tensor& response_mask) {
  constexpr const char* fn = "compute_remax_outcome_advantage";
  TESSERA_RETURN_IF_ERROR(internal::check_rewards_and_mask(fn, token_level_rewards, response_mask));
  TESSERA_RETURN_IF_ERROR(internal::check_dim(fn, "reward_baselines", reward_baselines, 1));
  if (reward_baselines.size(0) != token_level_rewards.size(0)) {
    return make_error(ErrorCode::invalid_argument, "{}: 'reward_baselines' has shape {} but token_level_rewards has {} rows",
                      fn, internal::shape_str(reward_baselines), token_level_rewards.size(0));
  }
  return internal::guarded(fn, [&]() -> Result<AdvantageReturn> {
    torch::NoGradGuard no_grad;
    const at::Tensor mask = as_value_mask(response_mask, token_level_rewards);
    const at::Tensor returns = (token_level_rewards * mask).flip({-1}).cumsum(-1).flip({-1});
    const at::Tensor advantages = returns - reward_baselines.unsqueeze(-1) * mask;
    return AdvantageReturn{advantages, returns};
  });
}

}  // namespace tessera::algos
