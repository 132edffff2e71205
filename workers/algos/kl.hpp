// kl.hpp: KL estimators, KL controllers and KL-penalised rewards from verl's core_algos.py (v0.5.0).
//
// kl_penalty is used both for the in-reward KL (`algorithm.kl_penalty`, with a KL controller)
// and for the actor's KL loss (`actor.kl_loss_type`). Functions are pure and thread-safe; the
// controllers are plain values owned by one trainer (not synchronised).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "proto/status.hpp"

namespace tessera::algos {

/// The kl_penalty names accepted: kl, k1, abs, mse, k2, low_var_kl, k3 (and "full", which is unimplemented).
std::vector<std::string> kl_penalty_types();

/// Per-token KL estimate between logprob and ref_logprob (Δ = logprob - ref_logprob):
/// kl/k1 = Δ; abs = |Δ|; mse/k2 = Δ²/2; low_var_kl/k3 = e^{-Δ} + Δ - 1 with -Δ clamped to [-20, 20]
/// and the result clamped to [-10, 10]. "full" gives an unimplemented error, as verl raises.
// REQUIRES: logprob and ref_logprob floating with the same shape.
Result<at::Tensor> kl_penalty(const at::Tensor& logprob, const at::Tensor& ref_logprob, const std::string& kl_penalty);

/// token_level_scores - kl_ratio * (old_log_prob - ref_log_prob) (verl's compute_rewards).
// REQUIRES: the three tensors floating with the same shape.
Result<at::Tensor> compute_rewards(const at::Tensor& token_level_scores, const at::Tensor& old_log_prob,
                                   const at::Tensor& ref_log_prob, double kl_ratio);

/// A KL coefficient β that may adapt to the observed KL (verl's kl_ctrl objects).
class KLController {
 public:
  virtual ~KLController() = default;
  /// The current coefficient β.
  virtual double value() const = 0;
  /// Feeds the KL measured over `n_steps` samples.
  virtual void update(double current_kl, int64_t n_steps) = 0;
};

/// Adaptive controller (Ziegler et al. 2019): β *= 1 + clip(kl/target - 1, ±0.2) * n_steps / horizon.
class AdaptiveKLController final : public KLController {
 public:
  // REQUIRES: horizon > 0 and target_kl != 0 (get_kl_controller checks both for config input).
  AdaptiveKLController(double init_kl_coef, double target_kl, int64_t horizon);
  double value() const override { return value_; }
  void update(double current_kl, int64_t n_steps) override;

 private:
  double value_;
  double target_;
  int64_t horizon_;
};

/// Constant coefficient; update() is a no-op.
class FixedKLController final : public KLController {
 public:
  explicit FixedKLController(double kl_coef) : value_(kl_coef) {}
  double value() const override { return value_; }
  void update(double /*current_kl*/, int64_t /*n_steps*/) override {}

 private:
  double value_;
};

/// `algorithm.kl_ctrl`: type ("fixed" | "adaptive"), kl_coef, horizon, target_kl (verl's defaults).
struct KLControlConfig {
  std::string type = "fixed";
  double kl_coef = 0.001;
  int64_t horizon = 10000;
  double target_kl = 0.1;
};

/// Builds the controller named by config.type; errors on an unknown type or horizon <= 0.
Result<std::unique_ptr<KLController>> get_kl_controller(const KLControlConfig& config);

}  // namespace tessera::algos
