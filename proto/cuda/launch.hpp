// launch.hpp: the LibTorch side of calling one of Tessera's CUDA kernels: the kernel's element
// type of a tensor, the tensor's current stream (CUDA builds), the launch check, and the
// once-per-process comparison each kernel makes with torch before its first use.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <utility>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#if TESSERA_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include "proto/cuda/element.hpp"
#include "proto/status.hpp"

namespace tessera::proto::cuda {

/// The kernels' element type of `t`; any other dtype is an error naming `what`.
inline ElementType element_type_of(const at::Tensor& t, const char* what) {
  const auto s = t.scalar_type();
  TORCH_CHECK(s == at::kFloat || s == at::kHalf || s == at::kBFloat16, what, ": unsupported dtype ",
              c10::toString(s));
  return s == at::kFloat ? ElementType::f32 : s == at::kHalf ? ElementType::f16 : ElementType::bf16;
}

#if TESSERA_WITH_CUDA
/// The current CUDA stream of `t`'s device, as the kernels' launchers take it.
inline void* stream_of(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }
#endif

/// A launcher's result (nullptr or the CUDA error string) as an error naming `what`.
inline void check_launch(const char* what, const char* error) {
  TORCH_CHECK(error == nullptr, what, ": kernel launch failed: ", error);
}

/// The verdicts of a kernel's self-check, one per (device, dtype) for the process: get() runs
/// `check` the first time a pair is asked for and returns that Status ever after. A `check`
/// that throws fails too: "<what> failed on <device>: <message>; <fix>". Thread-safe.
class CheckOnce {
 public:
  template <class Check>
  Status get(const c10::Device& device, c10::ScalarType dtype, const char* what, const char* fix, Check&& check) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto key = std::make_pair(device.str(), dtype);
    if (auto it = verdicts_.find(key); it != verdicts_.end()) return it->second;
    Status verdict;
    try {
      verdict = check();
    } catch (const std::exception& e) {
      verdict = make_error(ErrorCode::internal, "{} failed on {}: {}; {}", what, device.str(),
                           std::string(e.what()).substr(0, 200), fix);
    }
    return verdicts_.emplace(key, std::move(verdict)).first->second;
  }

 private:
  std::mutex mu_;
  std::map<std::pair<std::string, c10::ScalarType>, Status> verdicts_;
};

}  // namespace tessera::proto::cuda
