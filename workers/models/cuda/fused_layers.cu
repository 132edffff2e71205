// fused_layers.cu: see fused_layers.hpp. One thread per rotary pair (d, d + D/2) of one
// (row, head, token), one thread per SwiGLU element (grid-stride loops); one block per row for
// the residual add + RMSNorm.
//
// The forwards round where HF's op chains round, so in bf16 and fp16 they return the chains'
// values bit for bit: rotary is x * cos + rotate_half(x) * sin, each product and the sum rounded
// to the element type; SwiGLU rounds silu(gate) (PyTorch's x / (1 + exp(-x)) in fp32) before the
// product with up. Products and sums use the _rn intrinsics so that fp32 is not contracted into
// fused multiply-adds, which the separate kernels of the chains never do. The backwards compute
// in fp32 and round once.
#include "workers/models/cuda/fused_layers.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "proto/cuda/element.cuh"

namespace tessera::models::cuda {
namespace {

constexpr int kThreads = 256;

using proto::cuda::from_float;
using proto::cuda::to_float;

// x rounded to T and back: what an op of the chain leaves for the next one.
template <class T>
__device__ __forceinline__ float rounded(float x) {
  return to_float(from_float<T>(x));
}

template <class T>
__global__ void __launch_bounds__(kThreads) rotary_kernel(RotaryArgs a) {
  const int64_t half = a.head_dim / 2;
  const int64_t pairs = a.batch * a.heads * a.tokens * half;
  const T* x = static_cast<const T*>(a.x);
  const T* cos = static_cast<const T*>(a.cos);
  const T* sin = static_cast<const T*>(a.sin);
  T* out = static_cast<T*>(a.out);
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < pairs;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t d = e % half, t = (e / half) % a.tokens, h = (e / (half * a.tokens)) % a.heads;
    const int64_t b = e / (half * a.tokens * a.heads);
    const T* xr = x + b * a.x_stride[0] + h * a.x_stride[1] + t * a.x_stride[2];
    const int64_t tab = b * a.table_stride[0] + t * a.table_stride[1];
    const float x1 = to_float(xr[d * a.x_stride[3]]), x2 = to_float(xr[(d + half) * a.x_stride[3]]);
    const float c1 = to_float(cos[tab + d * a.table_stride[2]]), c2 = to_float(cos[tab + (d + half) * a.table_stride[2]]);
    const float s1 = to_float(sin[tab + d * a.table_stride[2]]), s2 = to_float(sin[tab + (d + half) * a.table_stride[2]]);
    float o1, o2;
    if (!a.backward) {  // -x2 * s1 rounds as x2 * s1 does: negation is exact
      o1 = __fsub_rn(rounded<T>(__fmul_rn(x1, c1)), rounded<T>(__fmul_rn(x2, s1)));
      o2 = __fadd_rn(rounded<T>(__fmul_rn(x2, c2)), rounded<T>(__fmul_rn(x1, s2)));
    } else {
      o1 = x1 * c1 + x2 * s2;
      o2 = x2 * c2 - x1 * s1;
    }
    T* orow = out + ((b * a.heads + h) * a.tokens + t) * a.head_dim;
    orow[d] = from_float<T>(o1);
    orow[d + half] = from_float<T>(o2);
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) swiglu_kernel(SwigluArgs a) {
  const T* gate = static_cast<const T*>(a.gate);
  const T* up = static_cast<const T*>(a.up);
  const T* grad = static_cast<const T*>(a.grad);
  T* out = static_cast<T*>(a.out);
  T* out_up = static_cast<T*>(a.out_up);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < a.n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = to_float(gate[i]), u = to_float(up[i]);
    if (!a.backward) {
      out[i] = from_float<T>(__fmul_rn(rounded<T>(__fdiv_rn(g, 1.f + expf(-g))), u));
    } else {
      const float sig = 1.f / (1.f + expf(-g));
      const float dy = to_float(grad[i]);
      out[i] = from_float<T>(dy * u * sig * (1.f + g * (1.f - sig)));
      out_up[i] = from_float<T>(dy * g * sig);
    }
  }
}

constexpr int kNormThreads = 256;
constexpr int kNormWarps = kNormThreads / 32;

// HF's residual add and RMSNorm (Qwen2RMSNorm, LlamaRMSNorm) with their roundings: the sum
// rounded to T; the fp32 sum of squares, its mean plus eps, rsqrt; the normalised value rounded
// to T, then multiplied by the weight in T. Each thread reads back only the sums it wrote.
template <class T>
__global__ void __launch_bounds__(kNormThreads) add_rms_norm_kernel(AddRmsNormArgs a) {
  __shared__ float partial[kNormWarps];
  const int64_t offset = static_cast<int64_t>(blockIdx.x) * a.hidden;
  const T* residual = static_cast<const T*>(a.residual) + offset;
  const T* x = a.x ? static_cast<const T*>(a.x) + offset : nullptr;
  T* sum = a.x ? static_cast<T*>(a.sum) + offset : nullptr;
  const T* source = a.x ? sum : residual;
  float squares = 0.f;
  for (int64_t i = threadIdx.x; i < a.hidden; i += kNormThreads) {
    float v = to_float(residual[i]);
    if (x) {
      const T s = from_float<T>(__fadd_rn(v, to_float(x[i])));
      sum[i] = s;
      v = to_float(s);
    }
    squares = __fadd_rn(squares, __fmul_rn(v, v));
  }
  for (int o = 16; o > 0; o /= 2) squares += __shfl_xor_sync(0xffffffffu, squares, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = squares;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < kNormWarps; ++w) total += partial[w];
  const float inv = rsqrtf(__fadd_rn(__fdiv_rn(total, static_cast<float>(a.hidden)), a.eps));
  const T* weight = static_cast<const T*>(a.weight);
  T* out = static_cast<T*>(a.out) + offset;
  for (int64_t i = threadIdx.x; i < a.hidden; i += kNormThreads) {
    out[i] = from_float<T>(__fmul_rn(to_float(weight[i]), rounded<T>(__fmul_rn(to_float(source[i]), inv))));
  }
}

unsigned blocks_for(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);  // grid-stride beyond
}

}  // namespace

const char* launch_rotary(const RotaryArgs& args, void* stream) {
  const int64_t pairs = args.batch * args.heads * args.tokens * (args.head_dim / 2);
  if (pairs == 0) return nullptr;
  auto s = static_cast<cudaStream_t>(stream);
  proto::cuda::with_element_type(
      args.dtype, [&](auto e) { rotary_kernel<decltype(e)><<<blocks_for(pairs), kThreads, 0, s>>>(args); });
  return proto::cuda::last_launch_error();
}

const char* launch_swiglu(const SwigluArgs& args, void* stream) {
  if (args.n == 0) return nullptr;
  auto s = static_cast<cudaStream_t>(stream);
  proto::cuda::with_element_type(
      args.dtype, [&](auto e) { swiglu_kernel<decltype(e)><<<blocks_for(args.n), kThreads, 0, s>>>(args); });
  return proto::cuda::last_launch_error();
}

const char* launch_add_rms_norm(const AddRmsNormArgs& args, void* stream) {
  if (args.rows == 0) return nullptr;
  if (args.rows > 0x7fffffff) return "add_rms_norm: more than 2^31 - 1 rows";
  const auto blocks = static_cast<unsigned>(args.rows);
  auto s = static_cast<cudaStream_t>(stream);
  proto::cuda::with_element_type(
      args.dtype, [&](auto e) { add_rms_norm_kernel<decltype(e)><<<blocks, kNormThreads, 0, s>>>(args); });
  return proto::cuda::last_launch_error();
}

}  // namespace tessera::models::cuda
