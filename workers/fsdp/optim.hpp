// optim.hpp: verl's LR schedules and AdamW on flat shards.
//
// LR schedules are verl's (verl/utils/torch_functional.py, v0.5), applied like torch's LambdaLR:
// lr(step) = base_lr * lambda(step), where `step` counts scheduler_step() calls (0 before the
// first), so the first optimizer step uses lambda(0).
//   constant: lambda(s) = s / max(1, warmup) while s < warmup, else 1.
//   cosine:   lambda(s) = min_lr_ratio + (1 - min_lr_ratio) * s / max(1, warmup) while s < warmup,
//             else max(min_lr_ratio, cos(pi * num_cycles * 2 * progress) * (1 - min_lr_ratio)/2
//                                      + (1 + min_lr_ratio)/2),
//             progress = (s - warmup) / max(1, total - warmup).
//   warmup = lr_warmup_steps if >= 0, else int(lr_warmup_steps_ratio * total_training_steps).
// AdamW is torch.optim.AdamW (amsgrad off, maximize off): p *= 1 - lr*wd; m = b1 m + (1-b1) g;
// v = b2 v + (1-b2) g^2; p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps). Every operation is
// element-wise, so running it on shards equals running it on the full tensors. It runs as torch's
// fused kernel: equal to torch::optim::AdamW up to float rounding (not bitwise: the kernel
// evaluates the same formula in another order).
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "workers/fsdp/options.hpp"

namespace tessera::fsdp {

/// The warmup length verl derives from lr_warmup_steps / lr_warmup_steps_ratio.
int64_t resolve_warmup_steps(const LrScheduleOptions& options);

/// lambda(step) for `options` (see the header comment).
double lr_lambda(const LrScheduleOptions& options, int64_t step);

/// A LambdaLR over one base lr. Plain value; thread-compatible.
class LrScheduler {
 public:
  LrScheduler(double base_lr, LrScheduleOptions options) : base_lr_(base_lr), options_(options) {}
  /// The lr the next optimizer step uses.
  double current_lr() const { return base_lr_ * lr_lambda(options_, step_); }
  /// Advances the schedule by one (verl calls this once per update_actor).
  void step() { ++step_; }
  /// Number of step() calls so far (LambdaLR's last_epoch).
  int64_t last_step() const { return step_; }
  /// Restores the counter (checkpoint load).
  void set_last_step(int64_t step) { step_ = step; }
  double base_lr() const { return base_lr_; }

 private:
  double base_lr_;
  LrScheduleOptions options_;
  int64_t step_ = 0;
};

/// AdamW moments for one flat shard.
struct AdamWState {
  at::Tensor exp_avg;     ///< Same shape and dtype as the shard.
  at::Tensor exp_avg_sq;  ///< Same shape and dtype as the shard.
};

/// One AdamW update of every params[i] in place with grads[i] and the moments states[i], at step
/// `step` (1-based, after incrementing), learning rate `lr`: torch's fused AdamW kernel
/// (at::_fused_adamw_, what torch.optim.AdamW(fused=True) runs), one launch per device and dtype
/// instead of ~10 element-wise kernels per shard. Allocates missing moments (zeros).
/// REQUIRES: the three lists have one entry per parameter; grads[i] has params[i]'s shape and
/// device; step >= 1.
void adamw_step(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                const std::vector<AdamWState*>& states, const AdamWOptions& options, double lr, int64_t step);

/// Adds sum(t^2) in float64 to `total` (a float64 tensor on t's device), widening `chunk`
/// elements of t at a time: the temporary is at most `chunk` float64s, not a float64 copy of t
/// (17 GB for a 7B model's embedding-and-head gradients). No host synchronisation.
void add_sum_of_squares(at::Tensor& total, const at::Tensor& t, int64_t chunk = int64_t{1} << 26);

}  // namespace tessera::fsdp
