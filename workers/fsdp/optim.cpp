// optim.cpp: see optim.hpp for the formulas (verl's schedules, torch's AdamW).
#include "workers/fsdp/optim.hpp"

#include <torch/torch.h>

#include <cmath>

namespace tessera::fsdp {

int64_t resolve_warmup_steps(const LrScheduleOptions& o) {
  if (o.warmup_steps >= 0) return o.warmup_steps;
  return static_cast<int64_t>(o.warmup_steps_ratio * static_cast<double>(o.total_training_steps));
}

double lr_lambda(const LrScheduleOptions& o, int64_t step) {
  const int64_t warmup = resolve_warmup_steps(o);
  const double s = static_cast<double>(step);
  if (o.kind == LrScheduleKind::constant) {
    if (step < warmup) return s / std::max<double>(1.0, static_cast<double>(warmup));
    return 1.0;
  }
  const double m = o.min_lr_ratio;
  if (step < warmup) return m + (1.0 - m) * (s / static_cast<double>(std::max<int64_t>(1, warmup)));
  const double progress = (s - static_cast<double>(warmup)) /
                          static_cast<double>(std::max<int64_t>(1, o.total_training_steps - warmup));
  const double x = std::cos(M_PI * o.num_cycles * 2.0 * progress);
  return std::max(m, x * (1.0 - m) * 0.5 + (1.0 + m) * 0.5);
}

void adamw_update(at::Tensor& param, const at::Tensor& grad, AdamWState& state,
                  const AdamWOptions& o, double lr, int64_t step) {
  if (!state.exp_avg.defined()) {
    state.exp_avg = at::zeros_like(param);
    state.exp_avg_sq = at::zeros_like(param);
  }
  param.mul_(1.0 - lr * o.weight_decay);
  state.exp_avg.mul_(o.beta1).add_(grad, 1.0 - o.beta1);
  state.exp_avg_sq.mul_(o.beta2).addcmul_(grad, grad, 1.0 - o.beta2);
  const double bias_correction1 = 1.0 - std::pow(o.beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(o.beta2, static_cast<double>(step));
  const double step_size = lr / bias_correction1;
  at::Tensor denom = (state.exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(o.eps);
  param.addcdiv_(state.exp_avg, denom, -step_size);
}

}  // namespace tessera::fsdp
