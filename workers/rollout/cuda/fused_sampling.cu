// fused_sampling.cu: see Note [Fused sampling] in fused_sampling.hpp.
#include "workers/rollout/cuda/fused_sampling.hpp"

#include <climits>
#include <cmath>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "proto/cuda/element.cuh"

namespace tessera::rollout::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kPerThread = 4;  // consecutive columns per thread in a tile
constexpr int kTile = kThreads * kPerThread;

// A running maximum and the sum of exp(x - max) under it.
struct MaxSum {
  float m, s;
};

__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  // Both maxima -inf: each sum is 0, or NaN where its columns held a NaN among -inf ones (NaN never
  // raises the maximum); the sum keeps that NaN (Note [Unsampleable rows] in sampling.hpp).
  if (m == -INFINITY) return {m, a.s + b.s};
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

// Column i of the row as fp32, divided by the temperature (the torch path's fp32 division).
template <class T>
__device__ __forceinline__ float scaled(const T* row, int64_t i, float temperature) {
  const float x = proto::cuda::to_float(row[i]);
  return temperature == 1.f ? x : x / temperature;
}

// The block's MaxSum, returned to every thread.
__device__ MaxSum block_max_sum(MaxSum v, MaxSum* shared) {
  for (int offset = 16; offset > 0; offset /= 2) {
    MaxSum o{__shfl_xor_sync(0xffffffffu, v.m, offset), __shfl_xor_sync(0xffffffffu, v.s, offset)};
    v = combine(v, o);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kWarps ? shared[lane] : MaxSum{-INFINITY, 0.f};
    for (int offset = 16; offset > 0; offset /= 2) {
      MaxSum o{__shfl_xor_sync(0xffffffffu, v.m, offset), __shfl_xor_sync(0xffffffffu, v.s, offset)};
      v = combine(v, o);
    }
    if (lane == 0) shared[0] = v;
  }
  __syncthreads();
  const MaxSum out = shared[0];
  __syncthreads();
  return out;
}

// Exclusive prefix of `x` over the block's threads, and the block's total (every thread).
__device__ float block_exclusive_scan(float x, float* warp_sums, float* total) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float inclusive = x;
  for (int offset = 1; offset < 32; offset *= 2) {
    const float y = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += y;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    float w = lane < kWarps ? warp_sums[lane] : 0.f;
    for (int offset = 1; offset < 32; offset *= 2) {
      const float y = __shfl_up_sync(0xffffffffu, w, offset);
      if (lane >= offset) w += y;
    }
    if (lane < kWarps) warp_sums[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  const float before_warp = warp == 0 ? 0.f : warp_sums[warp - 1];
  *total = warp_sums[kWarps - 1];
  return before_warp + inclusive - x;
}

template <class T>
__global__ void __launch_bounds__(kThreads) fused_sampling_kernel(FusedSamplingArgs a) {
  __shared__ MaxSum reduce[kWarps];
  __shared__ float warp_sums[kWarps];
  __shared__ int found;
  __shared__ int last_positive;
  const int64_t r = blockIdx.x;
  const T* row = static_cast<const T*>(a.logits) + r * a.row_stride;
  const float t = a.temperature;

  // Pass 1: the maximum and the sum of exponentials under it.
  MaxSum ms{-INFINITY, 0.f};
  for (int64_t i = threadIdx.x; i < a.vocab; i += kThreads) {
    const float x = scaled(row, i, t);
    if (x == -INFINITY) continue;
    if (x > ms.m) {
      ms.s = ms.s * expf(ms.m - x) + 1.f;
      ms.m = x;
    } else {
      ms.s += expf(x - ms.m);
    }
  }
  const MaxSum total = block_max_sum(ms, reduce);
  // Note [Unsampleable rows] (sampling.hpp): a NaN logit makes S NaN (fmaxf keeps M finite), a
  // +inf one makes M infinite, and a row of -inf leaves M = -inf and S = 0.
  if (!isfinite(total.m) || !(total.s > 0.f)) {
    if (threadIdx.x == 0) {
      a.tokens[r] = -1;
      if (a.logprobs) a.logprobs[r] = NAN;
    }
    return;
  }
  // The target below the total, as the torch path rounds it: float(u * double(S)).
  float target = static_cast<float>(a.uniforms[r] * static_cast<double>(total.s));
  target = fminf(target, nextafterf(total.s, 0.f));

  // Pass 2: tile by tile, the first column whose running sum exceeds the target.
  if (threadIdx.x == 0) {
    found = INT_MAX;
    last_positive = -1;
  }
  __syncthreads();
  float running = 0.f;
  int mine_last = -1;
  for (int64_t t0 = 0; t0 < a.vocab; t0 += kTile) {
    const int64_t base = t0 + static_cast<int64_t>(threadIdx.x) * kPerThread;
    float e[kPerThread], cum[kPerThread];
    float sum = 0.f;
    for (int k = 0; k < kPerThread; ++k) {
      const int64_t i = base + k;
      e[k] = 0.f;
      if (i < a.vocab) {
        const float x = scaled(row, i, t);
        e[k] = x == -INFINITY ? 0.f : expf(x - total.m);
        if (e[k] > 0.f) mine_last = static_cast<int>(i);
      }
      sum += e[k];
      cum[k] = sum;
    }
    float tile_total = 0.f;
    const float before = running + block_exclusive_scan(sum, warp_sums, &tile_total);
    // The smallest column of positive probability whose running sum exceeds the target. (The
    // thread-local sums and the block scan round differently, so "the previous sum is at most the
    // target" is not asked: the minimum over the block is the first crossing.)
    for (int k = 0; k < kPerThread; ++k) {
      if (e[k] > 0.f && before + cum[k] > target) {
        atomicMin(&found, static_cast<int>(base + k));
        break;
      }
    }
    __syncthreads();
    if (found != INT_MAX) break;
    running += tile_total;
    __syncthreads();  // warp_sums is rewritten by the next tile's scan
  }
  if (found == INT_MAX) {  // rounding kept every running sum at or below the target
    atomicMax(&last_positive, mine_last);
    __syncthreads();
    if (threadIdx.x == 0) found = last_positive < 0 ? 0 : last_positive;
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    a.tokens[r] = found;
    if (a.logprobs) a.logprobs[r] = scaled(row, found, t) - total.m - logf(total.s);
  }
}

}  // namespace

const char* launch_fused_sampling(const FusedSamplingArgs& args, void* stream) {
  if (args.rows == 0) return nullptr;
  const auto blocks = static_cast<unsigned>(args.rows);
  auto s = static_cast<cudaStream_t>(stream);
  proto::cuda::with_element_type(
      args.dtype, [&](auto e) { fused_sampling_kernel<decltype(e)><<<blocks, kThreads, 0, s>>>(args); });
  return proto::cuda::last_launch_error();
}

}  // namespace tessera::rollout::cuda
