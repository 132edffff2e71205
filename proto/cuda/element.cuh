// element.cuh: conversions between the kernels' element types and fp32, for CUDA translation
// units only (every kernel computes in fp32 and rounds once when it stores), and the two pieces
// every launcher shares: the switch from ElementType to a C++ type, and the launch's outcome.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "proto/cuda/element.hpp"

namespace tessera::proto::cuda {

/// Calls f(T{}) with T the type `type` names (float, __half, __nv_bfloat16), e.g.
///   with_element_type(args.dtype, [&](auto e) { kernel<decltype(e)><<<grid, block, 0, s>>>(args); });
template <class F>
void with_element_type(ElementType type, F&& f) {
  switch (type) {
    case ElementType::f32: f(float{}); break;
    case ElementType::f16: f(__half{}); break;
    case ElementType::bf16: f(__nv_bfloat16{}); break;
  }
}

/// What a launcher returns: nullptr if the launches so far succeeded, else the CUDA error string.
inline const char* last_launch_error() {
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

/// Round-to-nearest-even from fp32.
template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

}  // namespace tessera::proto::cuda
