// policy_loss.hpp: PPO policy losses of verl's core_algos.py (v0.5.0), in a registry looked up by
// `actor.policy_loss.loss_mode` (verl's register_policy_loss / get_policy_loss_fn).
//
// Built in: vanilla (PPO clip with clip-higher and dual-clip), gpg, clip_cov, kl_cov, and gspo
// (sequence-level ratios, from verl after v0.5.0). Users may
// register more by name. All outputs are 0-dim tensors; pg_loss is differentiable w.r.t. log_prob.
// The registry is process-wide and guarded by a mutex, so lookups and registrations may come from
// any thread; the loss functions themselves are pure (clip_cov draws from LibTorch's global RNG).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "proto/status.hpp"

namespace tessera::algos {

/// The actor keys the policy losses read (`actor.clip_ratio*`, `actor.policy_loss.*`), verl's defaults.
struct PolicyLossConfig {
  double clip_ratio = 0.2;                ///< ε for PPO clipping.
  std::optional<double> clip_ratio_low;   ///< ε_low; defaults to clip_ratio.
  std::optional<double> clip_ratio_high;  ///< ε_high; defaults to clip_ratio (DAPO clip-higher: > ε_low).
  double clip_ratio_c = 3.0;              ///< Dual-clip lower bound c (must be > 1).
  double clip_cov_ratio = 0.0002;         ///< clip_cov: fraction of tokens to detach.
  double clip_cov_lb = 1.0;               ///< clip_cov: covariance window lower bound.
  double clip_cov_ub = 5.0;               ///< clip_cov: covariance window upper bound.
  double kl_cov_ratio = 0.0002;           ///< kl_cov: fraction of tokens given the KL term.
  double ppo_kl_coef = 0.1;               ///< kl_cov: coefficient of |log ratio|.
};

/// The four values every policy loss returns, named as verl returns them (0-dim tensors).
struct PolicyLossOutput {
  at::Tensor pg_loss;
  at::Tensor pg_clipfrac;
  at::Tensor ppo_kl;
  at::Tensor pg_clipfrac_lower;
};

/// Signature of a registered policy loss (verl's PolicyLossFn).
using PolicyLossFn = std::function<Result<PolicyLossOutput>(
    const at::Tensor& old_log_prob, const at::Tensor& log_prob, const at::Tensor& advantages,
    const at::Tensor& response_mask, const std::string& loss_agg_mode, const PolicyLossConfig& config)>;

/// Registers `fn` under `name`; already_exists if the name is taken.
Status register_policy_loss(const std::string& name, PolicyLossFn fn);

/// The loss registered under `name`; not_found naming it and listing the known modes otherwise.
Result<PolicyLossFn> get_policy_loss_fn(const std::string& name);

/// Registered loss modes, sorted.
std::vector<std::string> registered_policy_losses();

/// PPO clipped objective with clip-higher and dual-clip (verl's compute_policy_loss_vanilla):
/// ratio = exp(clamp(logp - old, ±20)); L = max(-Aρ, -A·clip(ρ, 1-ε_low, 1+ε_high)), and for A<0
/// L = min(L, -A·c). ppo_kl = masked mean of (old - logp); pg_clipfrac = frac(clipped term larger);
/// pg_clipfrac_lower = frac(A<0 and L > -A·c).
// REQUIRES: the four tensors (bs, T), floating, same shape; config.clip_ratio_c > 1.
Result<PolicyLossOutput> compute_policy_loss_vanilla(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                                     const at::Tensor& advantages, const at::Tensor& response_mask,
                                                     const std::string& loss_agg_mode,
                                                     const PolicyLossConfig& config);

/// GPG: agg(-log_prob · A); the three metrics are 0.
// REQUIRES: as compute_policy_loss_vanilla (old_log_prob is checked but unused).
Result<PolicyLossOutput> compute_policy_loss_gpg(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                                 const at::Tensor& advantages, const at::Tensor& response_mask,
                                                 const std::string& loss_agg_mode, const PolicyLossConfig& config);

/// Clip-Cov: PPO clip, plus a random clip_cov_ratio share of the unclipped tokens whose
/// covariance (A - mean A)(logp - mean logp) lies in (clip_cov_lb, clip_cov_ub) get no gradient.
// REQUIRES: as compute_policy_loss_vanilla; config.clip_cov_ratio > 0.
Result<PolicyLossOutput> compute_policy_loss_clip_cov(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                                      const at::Tensor& advantages,
                                                      const at::Tensor& response_mask,
                                                      const std::string& loss_agg_mode,
                                                      const PolicyLossConfig& config);

/// KL-Cov: -Aρ, plus ppo_kl_coef·|logp - old| on the top kl_cov_ratio share of tokens by covariance;
/// ppo_kl is the masked mean of |logp - old|.
// REQUIRES: as compute_policy_loss_vanilla; config.kl_cov_ratio > 0.
Result<PolicyLossOutput> compute_policy_loss_kl_cov(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                                    const at::Tensor& advantages, const at::Tensor& response_mask,
                                                    const std::string& loss_agg_mode,
                                                    const PolicyLossConfig& config);

/// verl's older entry point: vanilla with cliprange_low/high defaulting to cliprange.
// REQUIRES: cliprange, or both cliprange_low and cliprange_high; clip_ratio_c > 1.
Result<PolicyLossOutput> compute_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                             const at::Tensor& advantages, const at::Tensor& response_mask,
                                             std::optional<double> cliprange = std::nullopt,
                                             std::optional<double> cliprange_low = std::nullopt,
                                             std::optional<double> cliprange_high = std::nullopt,
                                             double clip_ratio_c = 3.0,
                                             const std::string& loss_agg_mode = "token-mean");

}  // namespace tessera::algos
