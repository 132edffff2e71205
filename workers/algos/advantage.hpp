// advantage.hpp: the advantage estimators of verl's core_algos.py (v0.5.0) and their registry,
// looked up by `algorithm.adv_estimator` (verl's register_adv_est / get_adv_estimator_fn).
//
// Every estimator maps (bs, T) token-level rewards plus a response mask to (bs, T) advantages and
// returns, on the inputs' device and dtype, without autograd (verl runs them under no_grad).
// Group estimators take `index`: one uid string per row; rows sharing a uid are one prompt's
// samples. Outcome estimators use the sequence score s = Σ_t r_t. Bad arguments give an
// invalid_argument Status naming the function and the argument; nothing throws. The registry is
// process-wide and mutex-guarded; the estimators are pure and thread-safe.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "proto/status.hpp"

namespace tessera::algos {

/// (advantages, returns), as verl's estimators return them (both (bs, T)).
struct AdvantageReturn {
  at::Tensor advantages;
  at::Tensor returns;
};

/// The `algorithm.*` knobs the estimators read (verl's defaults).
struct AdvantageConfig {
  double gamma = 1.0;                   ///< algorithm.gamma (gae, reinforce_plus_plus).
  double lam = 1.0;                     ///< algorithm.lam (gae).
  bool norm_adv_by_std_in_grpo = true;  ///< algorithm.norm_adv_by_std_in_grpo (grpo, grpo_passk).
  double epsilon = 1e-6;                ///< Added to the group std before dividing.
};

/// Everything an estimator may need; each estimator reads only its own fields.
struct AdvantageInputs {
  at::Tensor token_level_rewards;  ///< (bs, T), required.
  at::Tensor response_mask;        ///< (bs, T), required.
  at::Tensor values;               ///< (bs, T): critic values (gae).
  at::Tensor reward_baselines;     ///< (bs,): greedy-rollout rewards (remax).
  std::vector<std::string> index;  ///< bs uids (group estimators).
  AdvantageConfig config;
};

/// Signature of a registered estimator.
using AdvantageEstimatorFn = std::function<Result<AdvantageReturn>(const AdvantageInputs&)>;

/// Registers `fn` under `name`; already_exists if the name is taken (as verl raises).
Status register_adv_est(const std::string& name, AdvantageEstimatorFn fn);

/// The estimator registered under `name`; not_found naming it and listing the known names otherwise.
/// Built in: gae, grpo, grpo_passk, reinforce_plus_plus, reinforce_plus_plus_baseline, remax, rloo, opo, gpg.
Result<AdvantageEstimatorFn> get_adv_estimator_fn(const std::string& name);

/// Registered estimator names, sorted.
std::vector<std::string> registered_adv_estimators();

/// GAE: δ_t = r_t + γV_{t+1} - V_t, A_t = δ_t + γλA_{t+1}; on mask-0 tokens V_next and A carry
/// through unchanged. returns = A + V; advantages = masked_whiten(A) over the batch.
// REQUIRES: all three (bs, T); the mask sums to at least 2 (whitening).
Result<AdvantageReturn> compute_gae_advantage_return(const at::Tensor& token_level_rewards, const at::Tensor& values,
                                                     const at::Tensor& response_mask, double gamma, double lam);

/// GRPO: A = (s - mean_g) / (std_g + epsilon) (unbiased std), or s - mean_g without the std
/// (Dr.GRPO); a single-sample group uses mean 0, std 1. Broadcast over tokens × mask; returns = A.
// REQUIRES: (bs, T) inputs; index.size() == bs.
Result<AdvantageReturn> compute_grpo_outcome_advantage(const at::Tensor& token_level_rewards,
                                                       const at::Tensor& response_mask,
                                                       const std::vector<std::string>& index, double epsilon = 1e-6,
                                                       bool norm_adv_by_std_in_grpo = true);

/// Pass@k GRPO: only each group's best sample gets A = s_max - s_2nd [/ (std_g + epsilon)].
// REQUIRES: as grpo, and every group has at least 2 samples.
Result<AdvantageReturn> compute_grpo_passk_outcome_advantage(const at::Tensor& token_level_rewards,
                                                             const at::Tensor& response_mask,
                                                             const std::vector<std::string>& index,
                                                             double epsilon = 1e-6,
                                                             bool norm_adv_by_std_in_grpo = true);

/// REINFORCE++ baseline: (s - mean_g) tiled over tokens × mask, masked-whitened over the batch, × mask.
// REQUIRES: as grpo; the mask sums to at least 2.
Result<AdvantageReturn> compute_reinforce_plus_plus_baseline_outcome_advantage(
    const at::Tensor& token_level_rewards, const at::Tensor& response_mask, const std::vector<std::string>& index,
    double epsilon = 1e-6);

/// RLOO: A_i = n/(n-1) · (s_i - mean_g) (s_i minus the leave-one-out mean); groups of one keep s_i.
// REQUIRES: as grpo.
Result<AdvantageReturn> compute_rloo_outcome_advantage(const at::Tensor& token_level_rewards,
                                                       const at::Tensor& response_mask,
                                                       const std::vector<std::string>& index, double epsilon = 1e-6);

/// OPO: A = s - Σ_g(len·s)/Σ_g len, len = response length; groups of one use baseline 0.
// REQUIRES: as grpo.
Result<AdvantageReturn> compute_opo_outcome_advantage(const at::Tensor& token_level_rewards,
                                                      const at::Tensor& response_mask,
                                                      const std::vector<std::string>& index, double epsilon = 1e-6);

/// REINFORCE++: G_t = r_t + γG_{t+1}, reset after EOS (× mask); A = masked_whiten(G) × mask; returns = G.
// REQUIRES: (bs, T) inputs; the mask sums to at least 2.
Result<AdvantageReturn> compute_reinforce_plus_plus_outcome_advantage(const at::Tensor& token_level_rewards,
                                                                      const at::Tensor& response_mask, double gamma);

/// ReMax: returns = reverse cumsum of r·mask; A = returns - reward_baselines·mask.
// REQUIRES: (bs, T) inputs; reward_baselines (bs,).
Result<AdvantageReturn> compute_remax_outcome_advantage(const at::Tensor& token_level_rewards,
                                                        const at::Tensor& reward_baselines,
                                                        const at::Tensor& response_mask);

/// GPG: A = α(s - mean_g)/f_norm with α = bs / max(#nonzero s, 1); groups of one use mean 0.
// REQUIRES: as grpo; f_norm != 0.
Result<AdvantageReturn> compute_gpg_outcome_advantage(const at::Tensor& token_level_rewards,
                                                      const at::Tensor& response_mask,
                                                      const std::vector<std::string>& index, double epsilon = 1e-6,
                                                      double f_norm = 1.0);

}  // namespace tessera::algos
