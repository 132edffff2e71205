// paged_attention.cu: see paged_attention.hpp. One thread block of kWarps warps per (row, query
// head): each warp walks every kWarps-th position of the row keeping an online softmax (running
// max, sum and weighted value sum, lane l holding head elements l, l + 32, ...), then warp 0
// merges the warps' partial results. A decode step is memory-bound: each key and value row is
// read once per query head, and the query heads of one KV head run as neighbouring blocks
// (blockIdx.x), so the repeats come from L2.
#include "workers/rollout/cuda/paged_attention.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace tessera::rollout::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kLanes = 32;
constexpr int kPerLane = static_cast<int>(kMaxHeadDim) / kLanes;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <class T>
__global__ void __launch_bounds__(kWarps * kLanes) paged_decode_kernel(PagedDecodeArgs a) {
  const int64_t h = blockIdx.x, b = blockIdx.y;
  const int warp = static_cast<int>(threadIdx.x) / kLanes, lane = static_cast<int>(threadIdx.x) % kLanes;
  const int64_t D = a.head_dim, kv = h / (a.heads / a.kv_heads);
  const T* q = static_cast<const T*>(a.q) + (b * a.heads + h) * D;
  float qr[kPerLane];
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int64_t d = lane + kLanes * e;
    qr[e] = d < D ? to_float(q[d]) : 0.f;
  }
  const int64_t len = a.context_lens[b * a.len_stride];
  const int64_t first = a.window > 0 && len > a.window ? len - a.window : 0;
  const int64_t* table = a.block_tables + b * a.table_row_stride;
  const int64_t token_stride = a.kv_heads * D;
  const T* keys = static_cast<const T*>(a.key_pool) + kv * D;
  const T* values = static_cast<const T*>(a.value_pool) + kv * D;

  float m = -INFINITY, l = 0.f, acc[kPerLane];
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) acc[e] = 0.f;
  for (int64_t s = first + warp; s < len; s += kWarps) {
    const int64_t row = table[(s / a.block_size) * a.table_entry_stride] * a.block_size + s % a.block_size;
    const T* k = keys + row * token_stride;
    const T* v = values + row * token_stride;
    float dot = 0.f;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      const int64_t d = lane + kLanes * e;
      if (d < D) dot += qr[e] * to_float(k[d]);
    }
#pragma unroll
    for (int offset = kLanes / 2; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
    float score = dot * a.scale;
    if (a.softcap > 0.f) score = tanhf(score / a.softcap) * a.softcap;
    const float m_new = fmaxf(m, score);
    const float keep = expf(m - m_new), p = expf(score - m_new);
    l = l * keep + p;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      const int64_t d = lane + kLanes * e;
      if (d < D) acc[e] = acc[e] * keep + p * to_float(v[d]);
    }
    m = m_new;
  }

  __shared__ float warp_max[kWarps], warp_sum[kWarps];
  __shared__ float warp_acc[kWarps][kMaxHeadDim];
  if (lane == 0) {
    warp_max[warp] = m;
    warp_sum[warp] = l;
  }
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int64_t d = lane + kLanes * e;
    if (d < D) warp_acc[warp][d] = acc[e];
  }
  __syncthreads();
  if (warp != 0) return;
  float total_max = -INFINITY;
  for (int w = 0; w < kWarps; ++w) total_max = fmaxf(total_max, warp_max[w]);
  float weight[kWarps], total = 0.f;
  for (int w = 0; w < kWarps; ++w) {
    weight[w] = warp_max[w] == -INFINITY ? 0.f : expf(warp_max[w] - total_max);  // a warp with no position
    total += warp_sum[w] * weight[w];
  }
  T* out = static_cast<T*>(a.out) + (b * a.heads + h) * D;
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int64_t d = lane + kLanes * e;
    if (d >= D) continue;
    float o = 0.f;
    for (int w = 0; w < kWarps; ++w) o += warp_acc[w][d] * weight[w];
    out[d] = from_float<T>(total > 0.f ? o / total : 0.f);
  }
}

}  // namespace

const char* launch_paged_decode_attention(const PagedDecodeArgs& args, void* stream) {
  if (args.batch == 0) return nullptr;
  const dim3 grid(static_cast<unsigned>(args.heads), static_cast<unsigned>(args.batch));
  const dim3 block(kWarps * kLanes);
  auto s = static_cast<cudaStream_t>(stream);
  switch (args.dtype) {
    case ElementType::f32: paged_decode_kernel<float><<<grid, block, 0, s>>>(args); break;
    case ElementType::f16: paged_decode_kernel<__half><<<grid, block, 0, s>>>(args); break;
    case ElementType::bf16: paged_decode_kernel<__nv_bfloat16><<<grid, block, 0, s>>>(args); break;
  }
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace tessera::rollout::cuda
