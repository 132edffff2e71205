// fsdp_step.cpp: the optimizer step (global-norm clipping, non-finite skip, AdamW on shards) and
// parameter / optimizer-state offload. See Note [FSDP engine] in fsdp_module.hpp.
//
// Note [Streamed optimizer step]
// With optimizer_offload the AdamW moments live in host buffers (pinned on CUDA) between steps.
// verl loads all of them onto the device before update_actor and offloads them after, so the
// update holds parameters, gradients and both moments at once: 16 bytes per parameter in fp32,
// 122 GB for a 7B model, more than an 80 GB card. Here the moments never leave the host for
// longer than their own unit's update: step() copies one unit's moments in (without blocking,
// from pinned memory), runs that unit's AdamW, and queues their copy back, unit after unit; the
// device holds the parameters and gradients (8 bytes per parameter: 61 GB at 7B) and at most two
// units' moments (below; ~6 GB at 7B: the last layer's and the untied head's). The bytes moved per
// step are verl's (every moment in and out once), and so are the numbers, bit for bit: AdamW is
// element-wise, and the fused kernel computes each element alike whatever shares its launch.
// The moments are created on the host too (init_moments), and a checkpoint restores them there,
// so a 7B model's moments never touch the device all at once. step() returns once the host
// buffers hold the new moments (one synchronisation per step).
//
// On a GPU the copies home run on a stream of their own: unit i's moments go back to the host
// while unit i+1's come in and step, so the two directions of the link overlap (PCIe is full
// duplex, and each direction has its own copy engine) and the step moves 2 x 8 bytes per
// parameter in about the time of one direction: ~60 GB each way at 7B, 1-2 s saved per step.
// The working copies come from the caching allocator on the compute stream, which knows nothing
// of the copy stream, so their reuse is ordered by hand: unit i-1's copies are held until unit
// i's are allocated, and before they are freed the compute stream is made to wait for their copy
// home (so unit i+1's load, which may land in them, follows it). The device holds at most two
// units' moments at a time; copying both ways on the compute stream, it held one.
//
// Note [Clean offload]
// With param_offload a worker loads the shards for each phase and offloads them after it
// (OffloadScope). Only update_actor changes them; after the rollout's hand-off, the log-prob
// passes and every phase of a frozen module (the reference, the reward model) the host buffers
// still hold exactly what the device holds. offload_params() then only frees the working copies
// instead of copying them back: per GRPO step of a 7B model with param offload that is the
// actor's fp32 shards twice (30 GB each) and the bf16 reference once (15 GB) not moved over
// PCIe. verl copies them back every time. Each unit's host_current says its buffer is current:
// offload_params() sets it, load_params() keeps it, and whatever may write a shard clears it:
// step() for the units it updates (before AdamW runs, so a failure part way leaves it cleared)
// and the write accessor unit_state() (checkpoint restore, tests). Per unit, so a LoRA actor's
// frozen base (Note [Attached units]) is never copied back: only its adapters change.
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "proto/device.hpp"
#include "proto/host_transfer.hpp"
#include "workers/fsdp/fsdp_module.hpp"
#include "workers/fsdp/internal/streamed_moments.hpp"

#if TESSERA_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace tessera::fsdp {
namespace {

// The offload destination: a separate host buffer (page-locked at its size when the working copy
// is on a GPU, so the copies can be asynchronous on CUDA builds).
at::Tensor host_buffer_like(const at::Tensor& t) {
  return proto::offload_buffer(t.sizes(), t.scalar_type(), t.device());
}

// Copies `src` into the (reused) host buffer `dst`. The copy is synchronous: the working copy is
// freed right after, and the host buffer must hold the bytes before anything reads it.
void offload_into(at::Tensor& dst, const at::Tensor& src) {
  if (!dst.defined() || dst.sizes() != src.sizes() || dst.scalar_type() != src.scalar_type()) {
    dst = host_buffer_like(src);
  }
  dst.copy_(src);
}

// A fresh working copy of `host` on `device` (bitwise). From pinned memory the copy is queued on
// the current stream, ahead of every kernel that reads it; the host buffer is kept for the next
// offload, so it outlives the copy.
at::Tensor load_from(const at::Tensor& host, const c10::Device& device) {
  at::Tensor working = at::empty(host.sizes(), host.options().device(device).pinned_memory(false));
  working.copy_(host, /*non_blocking=*/host.is_pinned());
  return working;
}

int64_t bytes_of(const at::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : 0; }

#if TESSERA_WITH_CUDA
void stream_moments_cuda(const std::vector<AdamWState*>& home, const c10::Device& device,
                         const internal::UnitAdamW& adamw) {
  const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device.index());
  const c10::cuda::CUDAStream back = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
  // Every return, a throw included, waits for the copies home still reading freed working copies
  // (nothing allocates between a throw and this wait).
  struct WaitForCopies {
    cudaStream_t stream;
    ~WaitForCopies() {
      if (cudaStreamSynchronize(stream) != cudaSuccess) (void)cudaGetLastError();  // the throw in flight says why
    }
  } wait_for_copies{back.stream()};
  std::vector<at::cuda::CUDAEvent> copied(home.size());
  AdamWState held;  // unit i-1's working copies, freed once unit i's are allocated
  for (size_t i = 0; i < home.size(); ++i) {
    AdamWState working{load_from(home[i]->exp_avg, device), load_from(home[i]->exp_avg_sq, device)};
    adamw(i, working);
    at::cuda::CUDAEvent stepped;
    stepped.record(compute);
    stepped.block(back);
    {
      c10::cuda::CUDAStreamGuard on_back(back);
      home[i]->exp_avg.copy_(working.exp_avg, /*non_blocking=*/true);
      home[i]->exp_avg_sq.copy_(working.exp_avg_sq, /*non_blocking=*/true);
    }
    copied[i].record(back);
    // Unit i-1's blocks go back to the allocator here, to be reused on the compute stream: it
    // waits for their copy home first.
    if (i >= 1) copied[i - 1].block(compute);
    held = std::move(working);
  }
  back.synchronize();  // the host buffers hold the new moments before anything reads them
}
#endif

}  // namespace

namespace internal {

void stream_moments(const std::vector<AdamWState*>& home, const c10::Device& device, const UnitAdamW& adamw) {
#if TESSERA_WITH_CUDA
  if (device.is_cuda()) return stream_moments_cuda(home, device, adamw);
#endif
  for (size_t i = 0; i < home.size(); ++i) {
    AdamWState working{load_from(home[i]->exp_avg, device), load_from(home[i]->exp_avg_sq, device)};
    adamw(i, working);
    home[i]->exp_avg.copy_(working.exp_avg);
    home[i]->exp_avg_sq.copy_(working.exp_avg_sq);
  }
}

}  // namespace internal

Result<double> FsdpModule::global_grad_norm() {
  // Summed in float64 on the device a chunk at a time (add_sum_of_squares), one host read at the
  // end (the step needs the norm to clip or skip).
  at::Tensor total = at::zeros({1}, at::TensorOptions(at::kDouble).device(device_));
  for (auto& s : units_) {
    if (s->shard_grad.defined()) add_sum_of_squares(total, s->shard_grad);
  }
  if (shard_group_) {
    Status st = shard_group_->all_reduce(total, collective::ReduceOp::sum, options_.comm);
    if (!st.ok()) return st.with_context("FSDP grad norm");
  }
  return std::sqrt(total.item<double>());
}

void FsdpModule::init_moments(UnitState& state) {
  if (!options_.optimizer_offload) {
    state.adam.exp_avg = at::zeros_like(state.shard);
    state.adam.exp_avg_sq = at::zeros_like(state.shard);
    return;
  }
  state.offload_adam.exp_avg = host_buffer_like(state.shard).zero_();  // Note [Streamed optimizer step]
  state.offload_adam.exp_avg_sq = host_buffer_like(state.shard).zero_();
}

Result<StepResult> FsdpModule::step() {
  TESSERA_RETURN_IF_ERROR(check_trainable("step"));
  TESSERA_RETURN_IF_ERROR(check_loaded("step"));
  if (in_forward_) {
    return make_error(ErrorCode::invalid_argument, "FSDP step: a forward is still in progress");
  }
  StepResult result;
  result.lr = scheduler_.current_lr();
  try {
    TESSERA_ASSIGN_OR_RETURN(result.grad_norm, global_grad_norm());
    if (!std::isfinite(result.grad_norm)) {
      result.skipped = true;
      result.optimizer_steps = optimizer_steps_;
      zero_grad();
      return result;
    }
    double clip = optim_.clip_grad;
    double coef = clip > 0 ? clip / (result.grad_norm + 1e-6) : 1.0;
    std::vector<UnitState*> stepped;
    std::vector<at::Tensor> params, grads;
    std::vector<AdamWState*> states;
    for (auto& s : units_) {
      if (!s->shard_grad.defined() || !s->trainable) continue;
      s->host_current = false;  // AdamW writes the shard (Note [Clean offload])
      stepped.push_back(s.get());
      params.push_back(s->shard);
      grads.push_back(s->shard_grad);
      states.push_back(&s->adam);
    }
    if (coef < 1.0 && !grads.empty()) at::_foreach_mul_(grads, coef);
    if (!optimizer_offloaded_) {
      adamw_step(params, grads, states, optim_.adamw, result.lr, optimizer_steps_ + 1);
    } else {
      std::vector<AdamWState*> home;
      for (UnitState* s : stepped) home.push_back(&s->offload_adam);
      internal::stream_moments(home, device_, [&](size_t i, AdamWState& working) {  // Note [Streamed optimizer step]
        adamw_step({params[i]}, {grads[i]}, {&working}, optim_.adamw, result.lr, optimizer_steps_ + 1);
      });
    }
    ++optimizer_steps_;  // once every unit has stepped
  } catch (...) {
    return proto::status_from_current_exception("FSDP step");  // a device OOM stays resource_exhausted
  }
  zero_grad();
  result.optimizer_steps = optimizer_steps_;
  return result;
}

Status FsdpModule::offload_params() {
  if (in_forward_) {
    return make_error(ErrorCode::invalid_argument, "FSDP offload_params: a forward is in progress");
  }
  if (params_offloaded_) return Status();
  // All or nothing: the copies first (a failure leaves every working shard in place, still
  // loaded), then the working copies are dropped.
  try {
    for (auto& s : units_) {
      const bool current = s->host_current && s->offload_shard.defined() &&
                           s->offload_shard.sizes() == s->shard.sizes() &&
                           s->offload_shard.scalar_type() == s->shard.scalar_type();
      if (!current) offload_into(s->offload_shard, s->shard);  // Note [Clean offload]
    }
  } catch (...) {
    return proto::status_from_current_exception("FSDP offload_params");
  }
  for (auto& s : units_) {
    s->shard = at::Tensor();  // frees the working copies
    s->host_current = true;
  }
  params_offloaded_ = true;
  return Status();
}

Status FsdpModule::load_params() {
  if (!params_offloaded_) return Status();
  std::vector<at::Tensor> loaded;  // all or nothing: a failure (a device OOM) leaves them offloaded
  try {
    for (auto& s : units_) loaded.push_back(load_from(s->offload_shard, device_));
  } catch (...) {
    return proto::status_from_current_exception("FSDP load_params");
  }
  for (size_t u = 0; u < units_.size(); ++u) units_[u]->shard = std::move(loaded[u]);
  params_offloaded_ = false;
  return Status();
}

Status FsdpModule::offload_optimizer() {
  if (optimizer_offloaded_ || options_.frozen) return Status();  // frozen: nothing to move
  try {
    for (auto& s : units_) {
      if (!s->trainable) continue;  // a frozen unit has no moments (Note [Attached units])
      offload_into(s->offload_adam.exp_avg, s->adam.exp_avg);
      offload_into(s->offload_adam.exp_avg_sq, s->adam.exp_avg_sq);
    }
  } catch (...) {
    return proto::status_from_current_exception("FSDP offload_optimizer");
  }
  for (auto& s : units_) s->adam = AdamWState{};
  optimizer_offloaded_ = true;
  return Status();
}

Status FsdpModule::load_optimizer() {
  if (!optimizer_offloaded_) return Status();  // also a frozen module (never offloaded)
  std::vector<AdamWState> loaded;
  try {
    for (auto& s : units_) {
      if (!s->trainable) {  // a frozen unit has no moments (Note [Attached units])
        loaded.emplace_back();
        continue;
      }
      loaded.push_back(AdamWState{load_from(s->offload_adam.exp_avg, device_),
                                  load_from(s->offload_adam.exp_avg_sq, device_)});
    }
  } catch (...) {
    return proto::status_from_current_exception("FSDP load_optimizer");
  }
  for (size_t u = 0; u < units_.size(); ++u) units_[u]->adam = std::move(loaded[u]);
  optimizer_offloaded_ = false;
  return Status();
}

int64_t FsdpModule::optimizer_state_bytes() const {
  int64_t total = 0;
  for (const auto& s : units_) {
    total += bytes_of(s->adam.exp_avg) + bytes_of(s->adam.exp_avg_sq) +
             bytes_of(s->offload_adam.exp_avg) + bytes_of(s->offload_adam.exp_avg_sq);
  }
  return total;
}

int64_t FsdpModule::resident_bytes() const {
  int64_t total = 0;
  for (const auto& s : units_) {
    total += bytes_of(s->shard) + bytes_of(s->shard_grad) + bytes_of(s->adam.exp_avg) +
             bytes_of(s->adam.exp_avg_sq);
  }
  return total;
}

}  // namespace tessera::fsdp
