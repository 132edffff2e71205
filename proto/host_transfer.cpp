// host_transfer.cpp: see Note [Host transfers] in host_transfer.hpp.
#include "proto/host_transfer.hpp"

#include <algorithm>

#include <torch/torch.h>

#if TESSERA_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace tessera::proto {
namespace {

template <typename T>
at::Tensor upload_values(const std::vector<T>& values, c10::ScalarType dtype, c10::Device device) {
  at::Tensor host = staging_tensor({static_cast<int64_t>(values.size())}, dtype, device);
  std::copy(values.begin(), values.end(), host.data_ptr<T>());
  return host.to(device, /*non_blocking=*/true);
}

}  // namespace

at::Tensor staging_tensor(at::IntArrayRef sizes, c10::ScalarType dtype, c10::Device device) {
  return at::empty(sizes, at::TensorOptions(dtype).pinned_memory(device.is_cuda()));
}

at::Tensor upload(const std::vector<int64_t>& values, c10::Device device) {
  return upload_values(values, at::kLong, device);
}

at::Tensor upload(const std::vector<int32_t>& values, c10::Device device) {
  return upload_values(values, at::kInt, device);
}

at::Tensor upload(const std::vector<double>& values, c10::Device device) {
  return upload_values(values, at::kDouble, device);
}

#if TESSERA_WITH_CUDA
struct HostReadback::Event {
  at::cuda::CUDAEvent event;
};
#else
struct HostReadback::Event {};
#endif

HostReadback::HostReadback(const at::Tensor& source) {
  if (!source.is_cuda()) {
    host_ = source.contiguous();
    return;
  }
#if TESSERA_WITH_CUDA
  host_ = staging_tensor(source.sizes(), source.scalar_type(), source.device());
  host_.copy_(source, /*non_blocking=*/true);
  event_ = std::make_unique<Event>();
  event_->event.record(c10::cuda::getCurrentCUDAStream(source.device().index()));
#endif
}

HostReadback::HostReadback() = default;
HostReadback::HostReadback(HostReadback&&) noexcept = default;
HostReadback& HostReadback::operator=(HostReadback&&) noexcept = default;
HostReadback::~HostReadback() = default;

const at::Tensor& HostReadback::wait() {
#if TESSERA_WITH_CUDA
  if (event_) {
    event_->event.synchronize();
    event_.reset();
  }
#endif
  return host_;
}

}  // namespace tessera::proto
