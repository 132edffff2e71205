// host_transfer.cpp: see Note [Host transfers] in host_transfer.hpp.
#include "proto/host_transfer.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include <torch/torch.h>

#if TESSERA_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
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

at::Tensor offload_buffer(at::IntArrayRef sizes, c10::ScalarType dtype, c10::Device device) {
  const at::TensorOptions options(dtype);
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  const auto bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  if (!device.is_cuda() || bytes == 0) return at::empty(sizes, options);
#if TESSERA_WITH_CUDA
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t length = (bytes + page - 1) / page * page;
  void* p = nullptr;
  TORCH_CHECK(posix_memalign(&p, page, length) == 0, "offload buffer: the host cannot allocate ", length, " bytes");
  // Portable: in-process workers on other GPUs copy through it too.
  const cudaError_t err = cudaHostRegister(p, length, cudaHostRegisterPortable);
  if (err != cudaSuccess) {
    std::free(p);
    (void)cudaGetLastError();  // clears the error
    TORCH_CHECK(false, "offload buffer: page-locking ", length, " bytes of host memory failed: ", cudaGetErrorString(err));
  }
  int owner = device.index();  // the device whose stream copies to and from the buffer
  if (owner < 0 && cudaGetDevice(&owner) != cudaSuccess) owner = 0;
  return at::from_blob(
      p, sizes,
      [owner](void* q) {
        // A non-blocking copy to or from the buffer may still be queued (the caching pinned
        // allocator would track it; this memory is not its own): let its device finish first.
        int current = 0;
        const bool switched = cudaGetDevice(&current) == cudaSuccess && current != owner &&
                              cudaSetDevice(owner) == cudaSuccess;
        (void)cudaDeviceSynchronize();
        if (switched) (void)cudaSetDevice(current);
        (void)cudaHostUnregister(q);
        (void)cudaGetLastError();  // a failure here must not surface at an unrelated launch check
        std::free(q);
      },
      options);
#else
  TORCH_CHECK(false, "offload buffer for ", device.str(), ": this build has no CUDA");
#endif
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
