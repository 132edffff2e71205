// device.cpp: the CUDA calls behind device.hpp, and their CPU no-ops.
#include "proto/device.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <utility>

#include <c10/util/Exception.h>
#include <fmt/format.h>

#ifdef TESSERA_WITH_CUDA
#include <cuda_runtime_api.h>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace tessera::proto {
namespace {

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

}  // namespace

Result<c10::Device> parse_device(const std::string& name) {
  const auto colon = name.find(':');
  const std::string kind = name.substr(0, colon);
  const std::string index = colon == std::string::npos ? "" : name.substr(colon + 1);
  if (colon != std::string::npos && (!all_digits(index) || index.size() > 3)) {
    return make_error(ErrorCode::invalid_argument, "device '{}': expected cpu, cpu:N, cuda or cuda:I", name);
  }
  if (kind == "cpu") return c10::Device(c10::DeviceType::CPU);
  if (kind == "cuda") {
    const int i = index.empty() ? 0 : std::stoi(index);
    return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(i));
  }
  return make_error(ErrorCode::invalid_argument, "device '{}': expected cpu, cpu:N, cuda or cuda:I", name);
}

int cuda_device_count() {
#ifdef TESSERA_WITH_CUDA
  return static_cast<int>(c10::cuda::device_count());
#else
  return 0;
#endif
}

Status require_device(const c10::Device& device) {
  if (device.is_cpu()) return Status();
  if (!device.is_cuda()) {
    return make_error(ErrorCode::invalid_argument, "device {}: only cpu and cuda devices are supported", device.str());
  }
#ifndef TESSERA_WITH_CUDA
  return make_error(ErrorCode::unavailable,
                    "device {}: this Tessera was built without CUDA (configure with TESSERA_WITH_CUDA=ON)",
                    device.str());
#else
  const int n = cuda_device_count();
  if (device.index() >= n) {
    return make_error(ErrorCode::unavailable, "device {}: this process sees {} CUDA device(s){}", device.str(), n,
                      n == 0 ? " (no GPU or no driver on this machine)" : "");
  }
  return Status();
#endif
}

DeviceScope::DeviceScope(const c10::Device& device) {
#ifdef TESSERA_WITH_CUDA
  if (!device.is_cuda()) return;
  const c10::DeviceIndex want = device.has_index() ? device.index() : 0;
  const c10::DeviceIndex now = c10::cuda::current_device();
  if (now == want) return;
  previous_ = now;
  c10::cuda::set_device(want);
#else
  (void)device;
#endif
}

DeviceScope::~DeviceScope() {
#ifdef TESSERA_WITH_CUDA
  if (previous_ >= 0) c10::cuda::set_device(static_cast<c10::DeviceIndex>(previous_));
#endif
}

void synchronize(const c10::Device& device) {
#ifdef TESSERA_WITH_CUDA
  if (!device.is_cuda()) return;
  c10::cuda::getCurrentCUDAStream(device.has_index() ? device.index() : c10::cuda::current_device()).synchronize();
#else
  (void)device;
#endif
}

DeviceMemory memory_stats(const c10::Device& device) {
  DeviceMemory m;
#ifdef TESSERA_WITH_CUDA
  if (!device.is_cuda() || cuda_device_count() == 0) return m;
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
  constexpr size_t kAggregate = 0;  // c10's StatType::AGGREGATE
  m.allocated = stats.allocated_bytes[kAggregate].current;
  m.reserved = stats.reserved_bytes[kAggregate].current;
  m.max_allocated = stats.allocated_bytes[kAggregate].peak;
  m.max_reserved = stats.reserved_bytes[kAggregate].peak;
#else
  (void)device;
#endif
  return m;
}

void reset_peak_memory(const c10::Device& device) {
#ifdef TESSERA_WITH_CUDA
  if (device.is_cuda() && cuda_device_count() > 0) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#else
  (void)device;
#endif
}

double device_peak_flops(const c10::Device& device) {
#ifdef TESSERA_WITH_CUDA
  if (!device.is_cuda() || device.index() >= cuda_device_count()) return 0.0;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device.index()) != cudaSuccess) return 0.0;
  const std::string name = prop.name;
  // verl/utils/device.py get_device_flops (dense bf16, TFLOP/s); the first listed substring wins.
  static const std::pair<const char*, double> kPeaks[] = {
      {"GB200", 2500}, {"B200", 2250}, {"B100", 1750}, {"H200", 989}, {"H100", 989}, {"H800", 989},
      {"H20", 148},    {"A100", 312},  {"A800", 312},  {"L40S", 362}, {"L40", 181.05}, {"L20", 119.5},
      {"A40", 149.7},  {"A10", 125},   {"4090", 165.2}};
  for (const auto& [model, tflops] : kPeaks) {
    if (name.find(model) != std::string::npos) return tflops * 1e12;
  }
#else
  (void)device;
#endif
  return 0.0;
}

int cuda_compute_major(const c10::Device& device) {
#ifdef TESSERA_WITH_CUDA
  if (!device.is_cuda() || device.index() >= cuda_device_count()) return 0;
  int index = device.index();
  if (!device.has_index() && cudaGetDevice(&index) != cudaSuccess) return 0;
  // Asked per MoE layer and forward: looked up once per device.
  static std::array<std::atomic<int>, 64> known{};
  std::atomic<int>* slot = index >= 0 && index < 64 ? &known[static_cast<size_t>(index)] : nullptr;
  if (slot != nullptr && slot->load(std::memory_order_relaxed) > 0) return slot->load(std::memory_order_relaxed);
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index) != cudaSuccess) return 0;
  if (slot != nullptr) slot->store(major, std::memory_order_relaxed);
  return major;
#else
  (void)device;
  return 0;
#endif
}

bool is_out_of_memory(const std::exception& e) { return dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr; }

std::string out_of_memory_summary(const std::exception& e) {
  std::string text;
  if (const auto* c10e = dynamic_cast<const c10::Error*>(&e)) {
    text = c10e->what_without_backtrace();
  } else {
    text = e.what();
  }
  // "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.1 GiB of
  // which 1.2 GiB is free. ... If reserved but unallocated memory is large try setting ...":
  // keep what precedes the allocator's advice.
  for (const char* advice : {" Of the allocated memory", " If reserved but unallocated", "\n"}) {
    const auto at = text.find(advice);
    if (at != std::string::npos) text.resize(at);
  }
  return text;
}

Status status_from_current_exception(const std::string& context) {
  try {
    throw;
  } catch (const c10::OutOfMemoryError& e) {
    return make_error(ErrorCode::resource_exhausted, "{}: out of device memory ({})", context,
                      proto::out_of_memory_summary(e));
  } catch (const c10::Error& e) {
    std::string msg = e.what_without_backtrace();
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    return make_error(ErrorCode::internal, "{}: {}", context, msg);
  } catch (const std::exception& e) {
    std::string msg = e.what();
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    return make_error(ErrorCode::internal, "{}: {}", context, msg);
  } catch (...) {
    return make_error(ErrorCode::internal, "{}: unknown exception", context);
  }
}

}  // namespace tessera::proto
