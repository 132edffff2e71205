// activation_stash.cpp: see internal/activation_stash.hpp.
//
// Note [Activation offload]
// verl's model.enable_activation_offload moves what backward keeps of each layer to host memory
// during forward and brings it back for backward. With gradient checkpointing (Note [Recompute
// unit]) a decoder layer keeps one tensor, its input (tokens x hidden), so that is what moves: a
// 7B micro-batch of 16k tokens keeps 28 x 117 MB = 3.3 GB of layer inputs on the device without
// it. As verl does, the last layer's input stays: a slot's copy to host starts when the next slot
// is filled, so the layer whose backward comes first never makes the round trip. On a GPU that
// copy goes to pinned host memory on a side stream, after the work queued so far on the compute
// stream, so it runs while the next layers compute; the device tensor is recorded on the side
// stream and released at once. In backward the layers come back in reverse order: when a
// layer's recompute takes its input, the input of the layer whose backward comes next is
// prefetched on the same side stream (after its own copy out), so its upload overlaps this
// layer's recompute and backward; take() makes the caller's stream wait for the upload's event.
// A host tensor (a CPU device) stays as it is. The numbers are those without offload: the values
// only travel. As save_for_backward does, take() refuses an input that was modified in place
// after its forward.
#include "workers/fsdp/internal/activation_stash.hpp"

#include <torch/torch.h>

#include <map>
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
  at::Tensor resident;  // still on its device: the last slot filled, not copied out yet
  at::Tensor host;      // the parked copy (or, on the host, the tensor itself)
  at::Tensor device;    // on its way back, or back
  c10::Device home = c10::Device(c10::DeviceType::CPU);
  c10::VariableVersion version{c10::VariableVersion::DISABLED};  // the input's in-place counter
  uint32_t saved_version = 0;
#if TESSERA_WITH_CUDA
  std::optional<c10::cuda::CUDAStream> side;  // both copies of the slot, in order
  at::cuda::CUDAEvent uploaded;
#endif
};

struct ActivationStash::Streams {
#if TESSERA_WITH_CUDA
  std::map<c10::DeviceIndex, c10::cuda::CUDAStream> side;
  c10::cuda::CUDAStream get(c10::DeviceIndex device) {
    auto it = side.find(device);
    if (it == side.end()) it = side.emplace(device, c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device)).first;
    return it->second;
  }
#endif
};

ActivationStash::ActivationStash(bool copy_on_host) : copy_on_host_(copy_on_host), streams_(new Streams) {}

ActivationStash::~ActivationStash() = default;

void ActivationStash::put(size_t slot, const at::Tensor& x) {
  if (slots_.size() <= slot) slots_.resize(slot + 1);
  TORCH_CHECK(!slots_[slot], "ActivationStash::put: slot ", slot, " is in use");
  if (last_ && *last_ != slot) offload(*last_);  // the previous slot is no longer the last
  auto s = std::make_unique<Slot>();
  s->home = x.device();
  s->resident = x;
  if (!x.is_inference()) {  // inference tensors have no version counter
    s->version = x.unsafeGetTensorImpl()->version_counter();
    s->saved_version = x._version();
  }
  slots_[slot] = std::move(s);
  last_ = slot;
}

void ActivationStash::offload(size_t slot) {
  if (slot >= slots_.size() || !slots_[slot] || !slots_[slot]->resident.defined()) return;
  Slot& s = *slots_[slot];
  at::Tensor x = std::move(s.resident);
#if TESSERA_WITH_CUDA
  if (x.is_cuda()) {
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(x.device().index());
    const c10::cuda::CUDAStream side = streams_->get(x.device().index());
    at::cuda::CUDAEvent computed;
    computed.record(compute);
    computed.block(side);
    {
      c10::cuda::CUDAStreamGuard on_side(side);
      // Host boundary, deliberate: parking the input in host memory is what the option asks for.
      // Pinned memory from the caching host allocator, which records the copies' streams on the
      // block, so it is not handed out again before the copy back has read it.
      at::Tensor host = at::empty_like(x, x.options().device(at::kCPU).pinned_memory(true));
      host.copy_(x, /*non_blocking=*/true);
      s.host = std::move(host);
    }
    x.record_stream(side);  // x's blocks are not reused before the copy has read them
    s.side = side;
    return;
  }
#endif
  s.host = copy_on_host_ ? x.clone() : x;
}

void ActivationStash::prefetch(size_t slot) {
  if (slot >= slots_.size() || !slots_[slot]) return;
  Slot& s = *slots_[slot];
  if (s.resident.defined() || s.device.defined()) return;  // never left, or already coming back
#if TESSERA_WITH_CUDA
  if (s.home.is_cuda()) {
    c10::cuda::CUDAStreamGuard on_side(*s.side);
    at::Tensor device = at::empty_like(s.host, s.host.options().device(s.home).pinned_memory(false));
    device.copy_(s.host, /*non_blocking=*/true);
    s.uploaded.record(*s.side);
    s.device = std::move(device);  // only once the upload and its event are queued
    return;
  }
#endif
  s.device = copy_on_host_ ? s.host.clone() : s.host;
}

at::Tensor ActivationStash::take(size_t slot) {
  if (slot >= slots_.size() || !slots_[slot]) {
    throw std::runtime_error("activation offload: no parked input in slot " + std::to_string(slot) +
                             " (a second backward through the same graph is not supported)");
  }
  prefetch(slot);
  std::unique_ptr<Slot> s = std::move(slots_[slot]);
  if (last_ == slot) last_.reset();
  if (s->version.enabled() && s->version.current_version() != s->saved_version) {
    throw std::runtime_error("activation offload: a checkpointed layer's input was modified by an in-place "
                             "operation after its forward (version " + std::to_string(s->version.current_version()) +
                             ", expected " + std::to_string(s->saved_version) + ")");
  }
  if (s->resident.defined()) return s->resident;
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
  last_.reset();
}

size_t ActivationStash::size() const {
  size_t n = 0;
  for (const auto& s : slots_) n += s ? 1 : 0;
  return n;
}

size_t ActivationStash::resident() const {
  size_t n = 0;
  for (const auto& s : slots_) n += s && s->resident.defined() ? 1 : 0;
  return n;
}

}  // namespace tessera::fsdp::internal
