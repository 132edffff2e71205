#include "workers/algos/policy_loss.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <torch/torch.h>

#include "workers/algos/internal/check.hpp"
#include "workers/algos/internal/losses.hpp"
#include "workers/algos/internal/ops.hpp"
#include "workers/algos/internal/registry.hpp"

namespace tessera::algos {

namespace {

using internal::as_value_mask;
using internal::masked_mean;

constexpr auto kAll = std::nullopt;

Status check_inputs(const char* fn, const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                    const at::Tensor& advantages, const at::Tensor& response_mask) {
  TESSERA_RETURN_IF_ERROR(internal::check_matrix_and_mask(fn, "log_prob", log_prob, "response_mask", response_mask));
  TESSERA_RETURN_IF_ERROR(internal::check_same_shape(fn, "log_prob", log_prob, "old_log_prob", old_log_prob));
  return internal::check_same_shape(fn, "log_prob", log_prob, "advantages", advantages);
}

at::Tensor zero_like_scalar(const at::Tensor& like) { return at::zeros({}, like.options()); }

// The vanilla maths with resolved clip ranges (shared by compute_policy_loss and the registry).
Result<PolicyLossOutput> vanilla(const at::Tensor& old_log_prob, const at::Tensor& log_prob, const at::Tensor& adv,
                                 const at::Tensor& response_mask, const std::string& loss_agg_mode,
                                 double cliprange_low, double cliprange_high, double clip_ratio_c) {
  const at::Tensor mask = as_value_mask(response_mask, log_prob);
  const auto dtype = log_prob.scalar_type();
  const at::Tensor negative_approx_kl = at::clamp(log_prob - old_log_prob, -20.0, 20.0);
  const at::Tensor ratio = at::exp(negative_approx_kl);
  const at::Tensor ppo_kl = masked_mean(-negative_approx_kl, mask, kAll);

  const at::Tensor pg_losses1 = -adv * ratio;
  const at::Tensor pg_losses2 = -adv * at::clamp(ratio, 1.0 - cliprange_low, 1.0 + cliprange_high);
  const at::Tensor clip_pg_losses1 = at::maximum(pg_losses1, pg_losses2);
  const at::Tensor pg_clipfrac = masked_mean(at::gt(pg_losses2, pg_losses1).to(dtype), mask, kAll);

  const at::Tensor pg_losses3 = -adv * clip_ratio_c;
  const at::Tensor clip_pg_losses2 = at::minimum(pg_losses3, clip_pg_losses1);
  const at::Tensor negative = adv < 0;
  const at::Tensor lower = at::logical_and(at::gt(clip_pg_losses1, pg_losses3), negative).to(dtype);
  const at::Tensor pg_clipfrac_lower = masked_mean(lower, mask, kAll);

  const at::Tensor pg_losses = at::where(negative, clip_pg_losses2, clip_pg_losses1);
  TESSERA_ASSIGN_OR_RETURN(at::Tensor pg_loss, internal::agg_loss(pg_losses, mask, loss_agg_mode));
  return PolicyLossOutput{pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower};
}

Status check_clip_ratio_c(double clip_ratio_c) {
  if (clip_ratio_c > 1.0) return Status();
  return make_error(ErrorCode::invalid_argument,
                    "actor.clip_ratio_c: the lower bound of the clip_ratio_c for dual-clip PPO should be greater "
                    "than 1.0, but got {}",
                    clip_ratio_c);
}

// Flat positions -> a bool (bs, T) mask with those positions set.
at::Tensor flat_selection(const at::Tensor& like, const at::Tensor& flat_positions) {
  at::Tensor sel = at::zeros({like.numel()}, like.options().dtype(at::kBool));
  if (flat_positions.numel() > 0) sel.index_fill_(0, flat_positions, true);
  return sel.view(like.sizes());
}

// GSPO (arXiv 2507.18071; verl's compute_policy_loss_gspo, after v0.5.0): one importance ratio per
// sequence, the geometric mean of its tokens' ratios, s_i = exp(mean_t(logp - old)), carried by
// each token as s_i,t = sg[s_i] * p_t / sg[p_t] (so its gradient is s_i's times the token's
// log-prob gradient), clamped in log space at 10, PPO-clipped with ε_low / ε_high; aggregated
// seq-mean-token-mean whatever loss_agg_mode says, as verl does. pg_clipfrac_lower is 0.
Result<PolicyLossOutput> compute_policy_loss_gspo(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                                  const at::Tensor& advantages, const at::Tensor& response_mask,
                                                  const std::string& /*loss_agg_mode*/, const PolicyLossConfig& config) {
  constexpr const char* fn = "compute_policy_loss_gspo";
  TESSERA_RETURN_IF_ERROR(check_inputs(fn, old_log_prob, log_prob, advantages, response_mask));
  const double low = config.clip_ratio_low.value_or(config.clip_ratio);
  const double high = config.clip_ratio_high.value_or(config.clip_ratio);
  return internal::guarded(fn, [&]() -> Result<PolicyLossOutput> {
    const at::Tensor mask = as_value_mask(response_mask, log_prob);
    const at::Tensor negative_approx_kl = log_prob - old_log_prob;
    const at::Tensor lengths = mask.sum(-1).clamp_min(1);
    const at::Tensor seq_kl = (negative_approx_kl * mask).sum(-1) / lengths;
    const at::Tensor log_ratio =
        at::clamp_max(log_prob - log_prob.detach() + seq_kl.detach().unsqueeze(-1), 10.0);
    const at::Tensor ratio = at::exp(log_ratio);
    const at::Tensor pg_losses1 = -advantages * ratio;
    const at::Tensor pg_losses2 = -advantages * at::clamp(ratio, 1.0 - low, 1.0 + high);
    TESSERA_ASSIGN_OR_RETURN(at::Tensor pg_loss,
                             internal::agg_loss(at::maximum(pg_losses1, pg_losses2), mask, "seq-mean-token-mean"));
    const at::Tensor pg_clipfrac = masked_mean(at::gt(pg_losses2, pg_losses1).to(log_prob.scalar_type()), mask, kAll);
    const at::Tensor ppo_kl = masked_mean(-negative_approx_kl, mask, kAll);
    return PolicyLossOutput{pg_loss, pg_clipfrac, ppo_kl, zero_like_scalar(log_prob)};
  });
}

internal::Registry<PolicyLossFn>& registry() {
  static internal::Registry<PolicyLossFn> r("policy loss", "actor.policy_loss.loss_mode",
                                            {{"vanilla", &compute_policy_loss_vanilla},
                                             {"gpg", &compute_policy_loss_gpg},
                                             {"clip_cov", &compute_policy_loss_clip_cov},
                                             {"kl_cov", &compute_policy_loss_kl_cov},
                                             {"gspo", &compute_policy_loss_gspo}});
  return r;
}

}  // namespace

Status register_policy_loss(const std::string& name, PolicyLossFn fn) { return registry().add(name, std::move(fn)); }

Result<PolicyLossFn> get_policy_loss_fn(const std::string& name) { return registry().get(name); }

std::vector<std::string> registered_policy_losses() { return registry().names(); }

Result<PolicyLossOutput> compute_policy_loss_vanilla(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                                     const at::Tensor& advantages, const at::Tensor& response_mask,
                                                     const std::string& loss_agg_mode,
                                                     const PolicyLossConfig& config) {
  constexpr const char* fn = "compute_policy_loss_vanilla";
  TESSERA_RETURN_IF_ERROR(check_inputs(fn, old_log_prob, log_prob, advantages, response_mask));
  TESSERA_RETURN_IF_ERROR(check_clip_ratio_c(config.clip_ratio_c));
  const double low = config.clip_ratio_low.value_or(config.clip_ratio);
  const double high = config.clip_ratio_high.value_or(config.clip_ratio);
  return internal::guarded(fn, [&] {
    return vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, low, high, config.clip_ratio_c);
  });
}

Result<PolicyLossOutput> compute_policy_loss(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                             const at::Tensor& advantages, const at::Tensor& response_mask,
                                             std::optional<double> cliprange, std::optional<double> cliprange_low,
                                             std::optional<double> cliprange_high, double clip_ratio_c,
                                             const std::string& loss_agg_mode) {
  constexpr const char* fn = "compute_policy_loss";
  TESSERA_RETURN_IF_ERROR(check_inputs(fn, old_log_prob, log_prob, advantages, response_mask));
  TESSERA_RETURN_IF_ERROR(check_clip_ratio_c(clip_ratio_c));
  if (!cliprange_low) cliprange_low = cliprange;
  if (!cliprange_high) cliprange_high = cliprange;
  if (!cliprange_low || !cliprange_high) {
    return make_error(ErrorCode::invalid_argument, "{}: cliprange (or both cliprange_low and cliprange_high) is required",
                      fn);
  }
  return internal::guarded(fn, [&] {
    return vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, *cliprange_low,
                   *cliprange_high, clip_ratio_c);
  });
}

Result<PolicyLossOutput> compute_policy_loss_gpg(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                                 const at::Tensor& advantages, const at::Tensor& response_mask,
                                                 const std::string& loss_agg_mode, const PolicyLossConfig& /*config*/) {
  constexpr const char* fn = "compute_policy_loss_gpg";
  TESSERA_RETURN_IF_ERROR(check_inputs(fn, old_log_prob, log_prob, advantages, response_mask));
  return internal::guarded(fn, [&]() -> Result<PolicyLossOutput> {
    TESSERA_ASSIGN_OR_RETURN(at::Tensor pg_loss, internal::agg_loss(-log_prob * advantages, response_mask, loss_agg_mode));
    const at::Tensor zero = zero_like_scalar(log_prob);
    return PolicyLossOutput{pg_loss, zero, zero, zero};
  });
}

namespace {

Result<PolicyLossOutput> clip_cov(const at::Tensor& old_log_prob, const at::Tensor& log_prob, const at::Tensor& adv,
                                  const at::Tensor& response_mask, const std::string& loss_agg_mode,
                                  const PolicyLossConfig& config) {
  const at::Tensor mask = as_value_mask(response_mask, log_prob);
  const double low = config.clip_ratio_low.value_or(config.clip_ratio);
  const double high = config.clip_ratio_high.value_or(config.clip_ratio);
  const at::Tensor negative_approx_kl = log_prob - old_log_prob;
  const at::Tensor ratio = at::exp(negative_approx_kl);
  const at::Tensor ppo_kl = masked_mean(-negative_approx_kl, mask, kAll);
  const at::Tensor pg_losses1 = -adv * ratio;
  const at::Tensor pg_losses2 = -adv * at::clamp(ratio, 1.0 - low, 1.0 + high);
  const at::Tensor valid = mask > 0;
  const at::Tensor clip_by_origin = at::logical_and(pg_losses2 > pg_losses1, valid);

  // Selection only: computed without autograd.
  const at::Tensor logp = log_prob.detach();
  const at::Tensor a = adv.detach();
  at::Tensor cov_all = (a - masked_mean(a, mask, kAll)) * (logp - masked_mean(logp, mask, kAll));
  cov_all = cov_all.masked_fill(at::logical_or(at::logical_not(valid), clip_by_origin),
                                -std::numeric_limits<double>::infinity());
  const int64_t clip_num =
      std::max<int64_t>(static_cast<int64_t>(config.clip_cov_ratio * mask.sum().item<double>()), 1);
  const at::Tensor window = at::logical_and(at::logical_and(cov_all < config.clip_cov_ub, cov_all > config.clip_cov_lb),
                                            valid);
  at::Tensor candidates = at::nonzero(window.reshape({-1})).reshape({-1});
  if (candidates.numel() > 0) {
    const at::Tensor perm = at::randperm(candidates.numel(), candidates.options());
    candidates = candidates.index_select(0, perm.slice(0, 0, std::min<int64_t>(clip_num, candidates.numel())));
  }
  const at::Tensor detached = flat_selection(adv, candidates);
  const at::Tensor corr = at::logical_not(detached).to(log_prob.scalar_type());
  const at::Tensor pg_clipfrac = masked_mean(detached.to(log_prob.scalar_type()), mask, kAll);
  const at::Tensor pg_losses = at::maximum(pg_losses1, pg_losses2) * corr;
  TESSERA_ASSIGN_OR_RETURN(at::Tensor pg_loss, internal::agg_loss(pg_losses, mask, loss_agg_mode));
  return PolicyLossOutput{pg_loss, pg_clipfrac, ppo_kl, zero_like_scalar(log_prob)};
}

Result<PolicyLossOutput> kl_cov(const at::Tensor& old_log_prob, const at::Tensor& log_prob, const at::Tensor& adv,
                                const at::Tensor& response_mask, const std::string& loss_agg_mode,
                                const PolicyLossConfig& config) {
  const at::Tensor mask = as_value_mask(response_mask, log_prob);
  const at::Tensor negative_approx_kl = log_prob - old_log_prob;
  const at::Tensor abs_kl = negative_approx_kl.abs();
  const at::Tensor ratio = at::exp(negative_approx_kl);
  const at::Tensor ppo_kl_abs = masked_mean(abs_kl, mask, kAll);
  const at::Tensor pg_losses1 = -adv * ratio;
  const at::Tensor pg_losses_kl = pg_losses1 + config.ppo_kl_coef * abs_kl;

  const at::Tensor valid = (mask > 0).reshape({-1});
  const at::Tensor valid_idx = at::nonzero(valid).reshape({-1});
  at::Tensor chosen = valid_idx.slice(0, 0, 0);
  if (valid_idx.numel() > 0) {
    const at::Tensor a = adv.detach().reshape({-1}).index_select(0, valid_idx);
    const at::Tensor lp = log_prob.detach().reshape({-1}).index_select(0, valid_idx);
    const at::Tensor cov = (a - a.mean()) * (lp - lp.mean());
    const int64_t k = std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(cov.numel()) * config.kl_cov_ratio));
    chosen = valid_idx.index_select(0, std::get<1>(at::topk(cov, k, -1, /*largest=*/true)));
  }
  const at::Tensor pg_losses = at::where(flat_selection(adv, chosen), pg_losses_kl, pg_losses1);
  TESSERA_ASSIGN_OR_RETURN(at::Tensor pg_loss, internal::agg_loss(pg_losses, mask, loss_agg_mode));
  const at::Tensor zero = zero_like_scalar(log_prob);
  return PolicyLossOutput{pg_loss, zero, ppo_kl_abs, zero};
}

}  // namespace

Result<PolicyLossOutput> compute_policy_loss_clip_cov(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                                      const at::Tensor& advantages,
                                                      const at::Tensor& response_mask,
                                                      const std::string& loss_agg_mode,
                                                      const PolicyLossConfig& config) {
  constexpr const char* fn = "compute_policy_loss_clip_cov";
  TESSERA_RETURN_IF_ERROR(check_inputs(fn, old_log_prob, log_prob, advantages, response_mask));
  if (!(config.clip_cov_ratio > 0.0)) {
    return make_error(ErrorCode::invalid_argument, "actor.policy_loss.clip_cov_ratio must be > 0, got {}",
                      config.clip_cov_ratio);
  }
  return internal::guarded(fn, [&] {
    return clip_cov(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config);
  });
}

Result<PolicyLossOutput> compute_policy_loss_kl_cov(const at::Tensor& old_log_prob, const at::Tensor& log_prob,
                                                    const at::Tensor& advantages, const at::Tensor& response_mask,
                                                    const std::string& loss_agg_mode,
                                                    const PolicyLossConfig& config) {
  constexpr const char* fn = "compute_policy_loss_kl_cov";
  TESSERA_RETURN_IF_ERROR(check_inputs(fn, old_log_prob, log_prob, advantages, response_mask));
  if (!(config.kl_cov_ratio > 0.0 && config.kl_cov_ratio <= 1.0)) {
    return make_error(ErrorCode::invalid_argument, "actor.policy_loss.kl_cov_ratio must be in (0, 1], got {}",
                      config.kl_cov_ratio);
  }
  return internal::guarded(fn, [&] {
    return kl_cov(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config);
  });
}

}  // namespace tessera::algos
