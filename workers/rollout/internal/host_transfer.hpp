// host_transfer.hpp (internal): the generation loop's small host <-> device copies, made so that
// they never stall the host on the device's queue.
//
// Note [Host transfers in decode]
// A copy from pageable host memory to a CUDA device waits for the stream to drain first, and a
// copy back to pageable memory waits for the copy itself: either one makes the host idle while
// the device finishes the step, and the device idle while the host prepares the next. Uploads
// here go through pinned memory (the caching host allocator keeps a block alive until its copy
// has run), and HostReadback copies into pinned memory in stream order and records an event that
// the host waits on only when it needs the values (Note [Lagged token reads] in
// generation_loop.cpp). Off CUDA both are plain tensors.
//
// Thread-safety: one thread per object.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tessera::rollout::internal {

/// A host tensor of `sizes` and `dtype` that copies to `device` without stalling: pinned memory
/// when `device` is CUDA, pageable otherwise.
at::Tensor staging_tensor(at::IntArrayRef sizes, c10::ScalarType dtype, c10::Device device);

/// `values` on `device` (1-D), copied through pinned memory when `device` is CUDA.
at::Tensor upload(const std::vector<int64_t>& values, c10::Device device);
at::Tensor upload(const std::vector<double>& values, c10::Device device);

/// A device tensor's values on their way to the host: on CUDA a copy into pinned memory queued
/// on the current stream with an event behind it; elsewhere the tensor itself.
class HostReadback {
 public:
  HostReadback();
  explicit HostReadback(const at::Tensor& source);
  HostReadback(HostReadback&&) noexcept;
  HostReadback& operator=(HostReadback&&) noexcept;
  ~HostReadback();

  /// Blocks until the copy has landed; the values (CPU, contiguous).
  const at::Tensor& wait();

 private:
  struct Event;  // the CUDA event (host_transfer.cpp)
  at::Tensor host_;
  std::unique_ptr<Event> event_;
};

}  // namespace tessera::rollout::internal
