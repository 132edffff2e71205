// advantage_group.cpp: the outcome estimators that compare a sample with its prompt group
// (grpo, grpo_passk, reinforce_plus_plus_baseline, rloo, opo, gpg).
//
// verl loops over rows in Python, filling dicts keyed by uid. Here the groups are numbered once
// (internal/groups.hpp) and the statistics are index_add reductions, which gives the same numbers
// (to rounding) in O(bs) tensor ops. Groups of one follow verl: mean 0 and std 1.
//
// Known sub-1e-7 deviations, kept on purpose: verl builds the singleton std as a float32
// torch.tensor(1.0), so its `std + epsilon` is rounded to float32 (1.00000095 instead of 1.000001,
// a 5e-8 relative difference); and gpg's alpha is a float32 tensor in verl. Both stay in the
// scores' dtype here.
#include "workers/algos/advantage.hpp"

#include <torch/torch.h>

#include "workers/algos/internal/advantage_check.hpp"
#include "workers/algos/internal/check.hpp"
#include "workers/algos/internal/groups.hpp"
#include "workers/algos/internal/ops.hpp"

namespace tessera::algos {

namespace {

using internal::as_value_mask;

// Broadcasts per-row scores over the response tokens: scores.unsqueeze(-1) * mask.
AdvantageReturn outcome(const at::Tensor& scores, const at::Tensor& response_mask) {
  const at::Tensor adv = scores.unsqueeze(-1) * as_value_mask(response_mask, scores);
  return AdvantageReturn{adv, adv};
}

}  // namespace

Result<AdvantageReturn> compute_grpo_outcome_advantage(const at::Tensor& token_level_rewards,
                                                       const at::Tensor& response_mask,
                                                       const std::vector<std::string>& index, double epsilon,
                                                       bool norm_adv_by_std_in_grpo) {
  constexpr const char* fn = "compute_grpo_outcome_advantage";
  TESSERA_RETURN_IF_ERROR(internal::check_grouped(fn, token_level_rewards, response_mask, index));
  return internal::guarded(fn, [&]() -> Result<AdvantageReturn> {
    torch::NoGradGuard no_grad;
    const at::Tensor scores = token_level_rewards.sum(-1);
    const internal::Groups groups = internal::group_rows(index, scores);
    at::Tensor adv = scores - internal::group_mean(scores, groups);
    if (norm_adv_by_std_in_grpo) adv = adv / (internal::group_std(scores, groups) + epsilon);
    return outcome(adv, response_mask);
  });
}

Result<AdvantageReturn> compute_grpo_passk_outcome_advantage(const at::Tensor& token_level_rewards,
                                                             const at::Tensor& response_mask,
                                                             const std::vector<std::string>& index, double epsilon,
                                                             bool norm_adv_by_std_in_grpo) {
  constexpr const char* fn = "compute_grpo_passk_outcome_advantage";
  TESSERA_RETURN_IF_ERROR(internal::check_grouped(fn, token_level_rewards, response_mask, index));
  return internal::guarded(fn, [&]() -> Result<AdvantageReturn> {
    torch::NoGradGuard no_grad;
    const at::Tensor scores = token_level_rewards.sum(-1);
    const internal::Groups groups = internal::group_rows(index, scores);
    at::Tensor advantages = at::zeros_like(scores);
    const auto long_opts = at::TensorOptions().dtype(at::kLong).device(scores.device());
    for (size_t g = 0; g < groups.rows.size(); ++g) {
      const auto& rows = groups.rows[g];
      if (rows.size() < 2) {
        return make_error(ErrorCode::invalid_argument,
                          "{}: Pass@k requires at least 2 samples per group. Got {} for group '{}'", fn, rows.size(),
                          groups.uids[g]);
      }
      const at::Tensor row_idx = at::tensor(rows, long_opts.device(at::kCPU)).to(scores.device());
      const at::Tensor rewards = scores.index_select(0, row_idx);
      auto [topk, topk_idx] = at::topk(rewards, 2);
      at::Tensor advantage = topk[0] - topk[1];
      if (norm_adv_by_std_in_grpo) advantage = advantage / (rewards.std() + epsilon);
      const int64_t i_max = rows[static_cast<size_t>(topk_idx[0].item<int64_t>())];
      advantages.select(0, i_max).copy_(advantage);
    }
    return outcome(advantages, response_mask);
  });
}

Result<AdvantageReturn> compute_reinforce_plus_plus_baseline_outcome_advantage(
    const at::Tensor& token_level_rewards, const at::Tensor& response_mask, const std::vector<std::string>& index,
    double /*epsilon*/) {
  constexpr const char* fn = "compute_reinforce_plus_plus_baseline_outcome_advantage";
  TESSERA_RETURN_IF_ERROR(internal::check_grouped(fn, token_level_rewards, response_mask, index));
  return internal::guarded(fn, [&]() -> Result<AdvantageReturn> {
    torch::NoGradGuard no_grad;
    const at::Tensor mask = as_value_mask(response_mask, token_level_rewards);
    const at::Tensor scores = token_level_rewards.sum(-1);
    const internal::Groups groups = internal::group_rows(index, scores);
    const at::Tensor centered = scores - internal::group_mean(scores, groups);
    const at::Tensor tiled = centered.unsqueeze(-1).expand_as(mask) * mask;
    auto whitened = internal::masked_whiten(tiled, mask, /*shift_mean=*/true);
    if (!whitened.ok()) return whitened.status().with_context(fn);
    const at::Tensor adv = *whitened * mask;
    return AdvantageReturn{adv, adv};
  });
}

Result<AdvantageReturn> compute_rloo_outcome_advantage(const at::Tensor& token_level_rewards,
                                                       const at::Tensor& response_mask,
                                                       const std::vector<std::string>& index, double /*epsilon*/) {
  constexpr const char* fn = "compute_rloo_outcome_advantage";
  TESSERA_RETURN_IF_ERROR(internal::check_grouped(fn, token_level_rewards, response_mask, index));
  return internal::guarded(fn, [&]() -> Result<AdvantageReturn> {
    torch::NoGradGuard no_grad;
    const at::Tensor scores = token_level_rewards.sum(-1);
    const internal::Groups groups = internal::group_rows(index, scores);
    const at::Tensor n = internal::group_size(groups);
    const at::Tensor mean = internal::group_mean(scores, groups);
    const at::Tensor loo = scores * n / (n - 1) - mean * n / (n - 1);
    return outcome(at::where(n > 1, loo, scores), response_mask);
  });
}

Result<AdvantageReturn> compute_opo_outcome_advantage(const at::Tensor& token_level_rewards,
                                                      const at::Tensor& response_mask,
                                                      const std::vector<std::string>& index, double /*epsilon*/) {
  constexpr const char* fn = "compute_opo_outcome_advantage";
  TESSERA_RETURN_IF_ERROR(internal::check_grouped(fn, token_level_rewards, response_mask, index));
  return internal::guarded(fn, [&]() -> Result<AdvantageReturn> {
    torch::NoGradGuard no_grad;
    const at::Tensor scores = token_level_rewards.sum(-1);
    const at::Tensor length = as_value_mask(response_mask, scores).sum(-1);
    const internal::Groups groups = internal::group_rows(index, scores);
    const at::Tensor weighted = internal::group_sum(length * scores, groups) / internal::group_sum(length, groups);
    const at::Tensor baseline =
        at::where(internal::group_size(groups) > 1, internal::per_row(weighted, groups), at::zeros({}, scores.options()));
    return outcome(scores - baseline, response_mask);
  });
}

Result<AdvantageReturn> compute_gpg_outcome_advantage(const at::Tensor& token_level_rewards,
                                                      const at::Tensor& response_mask,
                                                      const std::vector<std::string>& index, double /*epsilon*/,
                                                      double f_norm) {
  constexpr const char* fn = "compute_gpg_outcome_advantage";
  TESSERA_RETURN_IF_ERROR(internal::check_grouped(fn, token_level_rewards, response_mask, index));
  if (f_norm == 0.0) return make_error(ErrorCode::invalid_argument, "{}: f_norm must be non-zero", fn);
  return internal::guarded(fn, [&]() -> Result<AdvantageReturn> {
    torch::NoGradGuard no_grad;
    const at::Tensor scores = token_level_rewards.sum(-1);
    const int64_t bsz = scores.size(0);
    const int64_t nonzero = at::count_nonzero(scores).item<int64_t>();
    const double alpha = static_cast<double>(bsz) / static_cast<double>(std::max<int64_t>(nonzero, 1));
    const internal::Groups groups = internal::group_rows(index, scores);
    return outcome(alpha * (scores - internal::group_mean(scores, groups)) / f_norm, response_mask);
  });
}

}  // namespace tessera::algos
