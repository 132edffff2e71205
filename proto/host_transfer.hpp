// host_transfer.hpp: small host <-> device copies (indices, offsets, sampled tokens) made so
// that they never stall the host on the device's queue.
//
// Note [Host transfers]
// A blocking copy to or from a CUDA device (Tensor::to without non_blocking) waits for the
// stream to drain: the host idles while the device finishes the queued work, then the device
// idles while the host prepares and launches the next. In a decode step or a micro-batch that is
// launch-bound, that gap is the cost. Uploads here go through pinned memory without blocking (the
// caching host allocator keeps a block alive until its copy has run), and HostReadback copies
// into pinned memory in stream order and records an event that the host waits on only when it
// needs the values (Note [Lagged token reads] in the rollout's generation_loop.cpp). Off CUDA
// both are plain tensors.
//
// Thread-safety: one thread per object.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tessera::proto {

/// A host tensor of `sizes` and `dtype` that copies to `device` without stalling: pinned memory
/// when `device` is CUDA, pageable otherwise.
at::Tensor staging_tensor(at::IntArrayRef sizes, c10::ScalarType dtype, c10::Device device);

/// A long-lived host buffer that working copies on `device` are offloaded into (FSDP's parameter
/// and optimizer offload): on CUDA, page-locked at exactly its size (cudaHostRegister), so copies
/// to and from it need no staging and can run without blocking; pageable elsewhere. Pinned
/// tensors from the caching host allocator are rounded up to a power of two: a 7B model's 4.4 GB
/// embedding-and-head shard would pin 8 GB, and its offloaded shards and moments ~17 GB more
/// host memory than they hold. Throws c10::Error naming the bytes when the host cannot give them.
at::Tensor offload_buffer(at::IntArrayRef sizes, c10::ScalarType dtype, c10::Device device);

/// `values` on `device` (1-D), copied through pinned memory when `device` is CUDA.
at::Tensor upload(const std::vector<int64_t>& values, c10::Device device);
at::Tensor upload(const std::vector<int32_t>& values, c10::Device device);
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

}  // namespace tessera::proto
