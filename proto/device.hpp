// device.hpp: the one seam between Tessera and device-specific (CUDA) calls.
//
// Everything above proto/ is device-agnostic: it takes the device of its inputs, or the worker's
// device from parse_device(), and builds tensors with at::TensorOptions().device(d). What only a
// GPU has (the current device of a thread, synchronisation, the caching allocator's figures,
// out-of-memory errors) goes through the functions here. In a build without CUDA
// (TESSERA_WITH_CUDA unset) they are CPU no-ops, so the same code compiles and runs everywhere.
// Calls whose spelling differs between LibTorch versions also live in device.cpp alone.
//
// Why proto/: it is the bottom of the stack, and every component that holds tensors (models,
// FSDP, rollout, the collectives, the worker shell) already sits on it.
//
// Note [Crossing the worker boundary]: a DataProto crosses a worker's boundary on the CPU, so the
// driver, the dispatch layer and the wire only ever see host tensors. A worker method moves its
// argument to the worker's device (DataProto::to(device, non_blocking): queued on the current
// stream) and its result back (into pinned host memory, one synchronisation per result). Tensors
// already on the target device are not copied, so on a CPU worker both moves cost nothing.
//
// Thread-safety: every function is safe from any thread; a DeviceScope belongs to the thread that
// made it.
#pragma once

#include <cstdint>
#include <exception>
#include <string>

#include <c10/core/Device.h>

#include "proto/status.hpp"

namespace tessera::proto {

/// Parses a worker's device name: "cpu", "cpu:N" (a CPU "device" for tests and small runs; every
/// cpu:N is the host CPU) or "cuda", "cuda:I". Errors name the text. A cuda device is refused
/// here only for its spelling: whether it exists is checked by require_device().
Result<c10::Device> parse_device(const std::string& name);

/// The number of CUDA devices this process sees (0 in a build without CUDA or without a driver).
int cuda_device_count();

/// OK if `device` can hold tensors in this process: always for cpu; for cuda, a CUDA build that
/// sees a device with that ordinal. The error names the device and what is missing.
Status require_device(const c10::Device& device);

/// Makes `device` the current CUDA device of this thread for the scope, and restores the previous
/// one on exit (c10::cuda::CUDAGuard). No-op for a CPU device.
class DeviceScope {
 public:
  explicit DeviceScope(const c10::Device& device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;  ///< The CUDA device current before; -1: nothing to restore.
};

/// Waits until the work queued on `device`'s current stream has finished (CPU: returns at once).
void synchronize(const c10::Device& device);

/// The caching allocator's figures for one device, in bytes (all 0 for a CPU device).
struct DeviceMemory {
  int64_t allocated = 0;
  int64_t reserved = 0;
  int64_t max_allocated = 0;  ///< Peak since the last reset_peak_memory().
  int64_t max_reserved = 0;
};

/// The allocator's figures for `device`.
DeviceMemory memory_stats(const c10::Device& device);

/// Starts a new peak for max_allocated / max_reserved.
void reset_peak_memory(const c10::Device& device);

/// The dense bf16 peak of `device` in FLOP/s, by GPU model as verl's get_device_flops lists them
/// (H100/H200/H800 989e12, A100/A800 312e12, ...); 0 for a CPU device or an unlisted GPU.
double device_peak_flops(const c10::Device& device);

/// The compute capability's major number of `device` (9 for an H100 or H200); 0 for a CPU device
/// or a build without CUDA.
int cuda_compute_major(const c10::Device& device);

/// True for LibTorch's out-of-memory error (c10::OutOfMemoryError), whichever device raised it.
bool is_out_of_memory(const std::exception& e);

/// The first line of an out-of-memory message ("Tried to allocate 2.00 GiB. GPU 0 has a total
/// capacity of ..."), which holds the sizes, without the allocator's advice that follows.
std::string out_of_memory_summary(const std::exception& e);

/// Converts the in-flight exception (call from inside a catch block) into a one-line Status:
/// c10::Error without its backtrace, std::exception by what(). `context` prefixes the message. A
/// device running out of memory is ErrorCode::resource_exhausted with the allocator's summary
/// (what it tried to allocate, what was free), without its advice.
Status status_from_current_exception(const std::string& context);

}  // namespace tessera::proto
