// activation_stash.cpp: see internal/activation_stash.hpp.
//
// Note [Activation offload]
// verl's model.enable_activation_offload moves what backward keeps of each layer to host memory
// during forward and brings it back for backward. With gradient checkpointing (Note [Recompute
// unit]) a decoder layer keeps one tensor, its input (tokens x hidden), so that is what moves: a
// 7B micro-batch of 16k tokens keeps 28 x 117 MB = 3.3 GB of layer inputs on the device without
// it. On a GPU, put() queues the copy to pinned host memory on a side stream after the layer's
// input is computed, so it runs while the next layers compute; the device copy is released as
// soon as the forward drops it (the side stream is recorded on it). In backward the units come
// back in reverse order: when a unit's recompute takes its input, the input of the unit whose
// backward comes next is prefetched on the side stream, so its upload overlaps this unit's
// recompute and backward; take() makes the caller's stream wait for the upload's event. Both
// copies of a slot run on the one side stream, in order. Host tensors (a CPU device) stay where
// they are. The numbers are the same as without offload: the values only travel.
#include "workers/fsdp/internal/activation_stash.hpp"

#include <torch/torch.h>

#include <optional>
#include <stdexcept>
#include <string>

#if TESSERA_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace tessera::fsdp::internal {

struct ActivationStash::Slot {
  at::Tensor host;    // the parked copy (or the tensor itself, on the host)
  at::Tensor device;  // on its way back, or back
  c10::Device home = c10::Device(c10::DeviceType::CPU);
#if TESSERA_WITH_CUDA
  at::cuda::CUDAEvent uploaded;
#endif
};

struct ActivationStash::Streams {
#if TESSERA_WITH_CUDA
  std::optional<c10::cuda::CUDAStream> side;
  c10::cuda::CUDAStream get(c10::DeviceIndex device) {
    if (!side || side->device_index() != device) side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device);
    return *side;
  }
#endif
};

ActivationStash::ActivationStash(bool copy_on_host) : copy_on_host_(copy_on_host), streams_(new Streams) {}

ActivationStash::~ActivationStash() = default;

void ActivationStash::put(size_t slot, const at::Tensor& x) {
  if (slots_.size() <= slot) slots_.resize(slot + 1);
  TORCH_CHECK(!slots_[slot], "ActivationStash::put: slot ", slot, " is in use");
  auto s = std::make_unique<Slot>();
  s->home = x.device();
#if TESSERA_WITH_CUDA
  if (x.is_cuda()) {
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(x.device().index());
    const c10::cuda::CUDAStream side = streams_->get(x.device().index());
    at::cuda::CUDAEvent computed;
    computed.record(compute);
    computed.block(side);
    {
      c10::cuda::CUDAStreamGuard on_side(side);
      // Pinned memory from the caching host allocator: the copy records its stream there, so the
      // block is not handed out again before the copy back has read it.
      s->host = at::empty(x.sizes(), x.options().device(at::kCPU).pinned_memory(true));
      s->host.copy_(x, /*non_blocking=*/true);
    }
    x.record_stream(side);  // the caller may drop x before the copy has run
    slots_[slot] = std::move(s);
    return;
  }
#endif
  s->host = copy_on_host_ ? x.clone() : x;
  slots_[slot] = std::move(s);
}

void ActivationStash::prefetch(size_t slot) {
  if (slot >= slots_.size() || !slots_[slot] || slots_[slot]->device.defined()) return;
  Slot& s = *slots_[slot];
#if TESSERA_WITH_CUDA
  if (s.home.is_cuda()) {
    const c10::cuda::CUDAStream side = streams_->get(s.home.index());
    c10::cuda::CUDAStreamGuard on_side(side);
    s.device = at::empty(s.host.sizes(), s.host.options().device(s.home).pinned_memory(false));
    s.device.copy_(s.host, /*non_blocking=*/true);
    s.uploaded.record(side);
    return;
  }
#endif
  s.device = copy_on_host_ ? s.host.clone() : s.host;
}

at::Tensor ActivationStash::take(size_t slot) {
  if (slot >= slots_.size() || !slots_[slot]) {
    throw std::runtime_error("activation offload: no parked input in slot " + std::to_string(slot));
  }
  prefetch(slot);
  std::unique_ptr<Slot> s = std::move(slots_[slot]);
#if TESSERA_WITH_CUDA
  if (s->home.is_cuda()) {
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(s->home.index());
    s->uploaded.block(compute);
    s->device.record_stream(compute);  // allocated on the side stream, used and freed on this one
  }
#endif
  return s->device;
}

void ActivationStash::clear() {
  slots_.clear();  // pinned blocks return to the caching host allocator, which waits for their copies
}

size_t ActivationStash::size() const {
  size_t n = 0;
  for (const auto& s : slots_) n += s ? 1 : 0;
  return n;
}

}  // namespace tessera::fsdp::internal
