// optim.cpp: see optim.hpp for the formulas (verl's schedules, torch's AdamW).
#include "workers/fsdp/optim.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>

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

void add_sum_of_squares(at::Tensor& total, const at::Tensor& t, int64_t chunk) {
  const at::Tensor flat = t.reshape({-1});
  for (int64_t begin = 0; begin < flat.numel(); begin += chunk) {
    const at::Tensor part = flat.narrow(0, begin, std::min(chunk, flat.numel() - begin)).to(at::kDouble);
    total.add_(at::dot(part, part));
  }
}

void adamw_step(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                const std::vector<AdamWState*>& states, const AdamWOptions& o, double lr, int64_t step) {
  // The fused kernel takes tensors of one device and dtype per call (torch groups them the same way).
  struct Group {
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
  };
  std::map<std::pair<std::string, c10::ScalarType>, Group> groups;
  std::map<std::string, at::Tensor> step_tensors;  // one read-only step counter per device
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    AdamWState& st = *states[i];
    if (!st.exp_avg.defined()) {
      st.exp_avg = at::zeros_like(p);
      st.exp_avg_sq = at::zeros_like(p);
    }
    const std::string device = p.device().str();
    auto [it, fresh] = step_tensors.try_emplace(device);
    if (fresh) it->second = at::full({}, static_cast<double>(step), p.options().dtype(at::kFloat));
    Group& g = groups[{device, p.scalar_type()}];
    g.params.push_back(p);
    g.grads.push_back(grads[i].scalar_type() == p.scalar_type() ? grads[i] : grads[i].to(p.scalar_type()));
    g.exp_avgs.push_back(st.exp_avg);
    g.exp_avg_sqs.push_back(st.exp_avg_sq);
    g.steps.push_back(it->second);
  }
  for (auto& [key, g] : groups) {
    at::_fused_adamw_(g.params, g.grads, g.exp_avgs, g.exp_avg_sqs, /*max_exp_avg_sqs=*/{}, g.steps, lr, o.beta1,
                      o.beta2, o.weight_decay, o.eps, /*amsgrad=*/false, /*maximize=*/false);
  }
}

}  // namespace tessera::fsdp
