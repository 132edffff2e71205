// token_log_probs.cu: see token_log_probs.hpp. One thread block per row in both directions.
// Forward: each thread keeps an online (max m, sum of exp(x - m), sum of x exp(x - m)) over its
// share of the row, read in 16-byte vectors where the row is aligned; the block merges the
// triples by shuffles and shared memory, and one thread reads the label's logit. Backward: one
// pass that rebuilds p_i from the saved lse and writes the row's gradient. Each reads the logits
// once (the backward also writes them once): the chunked LibTorch path makes ~10 fp32 passes.
#include "workers/algos/cuda/token_log_probs.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "proto/cuda/element.cuh"

namespace tessera::algos::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;

using proto::cuda::from_float;
using proto::cuda::to_float;

template <class T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));  ///< Elements per 16-byte load.

// (m, s, t): the running max, sum of exp(x - m) and sum of x exp(x - m) of some elements. A NaN
// among them makes all three NaN, so that the row's results are NaN as torch's are (fmaxf alone
// would drop it).
struct Moments {
  float m = -INFINITY, s = 0.f, t = 0.f;
};

__device__ __forceinline__ Moments nan_moments() { return {NAN, NAN, NAN}; }

__device__ __forceinline__ float weight(float m, float m_total) { return m == -INFINITY ? 0.f : expf(m - m_total); }

__device__ __forceinline__ Moments merge(const Moments& a, const Moments& b) {
  if (isnan(a.m) || isnan(b.m)) return nan_moments();
  const float m = fmaxf(a.m, b.m);
  const float wa = weight(a.m, m), wb = weight(b.m, m);
  return {m, a.s * wa + b.s * wb, a.t * wa + b.t * wb};
}

// Folds n values (already divided by the temperature) into `acc`.
template <int N>
__device__ __forceinline__ void fold(Moments& acc, const float (&x)[N], int n) {
  float mx = acc.m;
  bool nan = isnan(acc.m);
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if (i < n) {
      mx = fmaxf(mx, x[i]);
      nan = nan || isnan(x[i]);
    }
  }
  if (nan) {
    acc = nan_moments();
    return;
  }
  if (mx == -INFINITY) return;  // nothing finite yet (n == 0, or every value -inf)
  const float w = weight(acc.m, mx);
  acc.s *= w;
  acc.t *= w;
  acc.m = mx;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if (i < n) {
      const float e = expf(x[i] - mx);
      acc.s += e;
      acc.t += x[i] * e;
    }
  }
}

// Whether a row starts on a 16-byte boundary (its first vocab / kVec vectors then load whole).
template <class T>
__device__ __forceinline__ bool row_aligned(const T* row) {
  return reinterpret_cast<uintptr_t>(row) % 16 == 0;
}

template <class T>
__global__ void __launch_bounds__(kThreads) forward_kernel(TokenLogProbArgs a) {
  constexpr int V = kVec<T>;
  const int64_t r = blockIdx.x;
  const T* row = static_cast<const T*>(a.logits) + r * a.row_stride;
  const bool scaled = a.temperature != 1.f;
  Moments acc;
  // Vectors first where the row is aligned, then the tail (or the whole row) element-wise.
  const int64_t vectors = row_aligned(row) ? a.vocab / V : 0;
  for (int64_t v = threadIdx.x; v < vectors; v += kThreads) {
    const uint4 raw = reinterpret_cast<const uint4*>(row)[v];
    const T* e = reinterpret_cast<const T*>(&raw);
    float x[V];
#pragma unroll
    for (int i = 0; i < V; ++i) x[i] = scaled ? to_float(e[i]) / a.temperature : to_float(e[i]);
    fold(acc, x, V);
  }
  for (int64_t i = vectors * V + threadIdx.x; i < a.vocab; i += kThreads) {
    const float x[1] = {scaled ? to_float(row[i]) / a.temperature : to_float(row[i])};
    fold(acc, x, 1);
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const Moments other{__shfl_xor_sync(kFullMask, acc.m, offset), __shfl_xor_sync(kFullMask, acc.s, offset),
                        __shfl_xor_sync(kFullMask, acc.t, offset)};
    acc = merge(acc, other);
  }
  __shared__ float warp_m[kWarps], warp_s[kWarps], warp_t[kWarps];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  if (lane == 0) {
    warp_m[warp] = acc.m;
    warp_s[warp] = acc.s;
    warp_t[warp] = acc.t;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  Moments total;
  for (int w = 0; w < kWarps; ++w) total = merge(total, Moments{warp_m[w], warp_s[w], warp_t[w]});
  const float lse = total.m + logf(total.s);
  const int64_t label = a.labels[r];
  const float x_label = label >= 0 && label < a.vocab
                            ? (scaled ? to_float(row[label]) / a.temperature : to_float(row[label]))
                            : NAN;
  a.log_probs[r] = x_label - lse;
  a.lse[r] = lse;
  if (a.entropy != nullptr) a.entropy[r] = lse - total.t / total.s;
}

// d (g_lp lp + g_ent H) / d logit_i; `with_entropy` false leaves the entropy term out.
__device__ __forceinline__ float grad_of(float logit, int64_t i, int64_t label, float t, bool scaled, float lse,
                                         bool with_entropy, float mu, float g_lp, float g_ent) {
  const float x = scaled ? logit / t : logit;
  const float p = expf(x - lse);
  float g = -p * g_lp;
  if (with_entropy) g -= p * (x - mu) * g_ent;
  if (i == label) g += g_lp;
  return scaled ? g / t : g;
}

template <class T>
__global__ void __launch_bounds__(kThreads) backward_kernel(TokenLogProbArgs a) {
  constexpr int V = kVec<T>;
  const int64_t r = blockIdx.x;
  const T* row = static_cast<const T*>(a.logits) + r * a.row_stride;
  T* out = static_cast<T*>(a.grad_logits) + r * a.vocab;
  const bool scaled = a.temperature != 1.f;
  const float lse = a.saved_lse[r];
  const float g_lp = a.grad_log_probs != nullptr ? a.grad_log_probs[r] : 0.f;
  const float g_ent = a.grad_entropy != nullptr ? a.grad_entropy[r] : 0.f;
  const bool with_entropy = a.grad_entropy != nullptr;
  const float mu = with_entropy ? lse - a.saved_entropy[r] : 0.f;
  const int64_t label = a.labels[r];
  const int64_t vectors = row_aligned(row) && row_aligned(out) ? a.vocab / V : 0;
  for (int64_t v = threadIdx.x; v < vectors; v += kThreads) {
    const uint4 raw = reinterpret_cast<const uint4*>(row)[v];
    const T* e = reinterpret_cast<const T*>(&raw);
    uint4 packed;
    T* o = reinterpret_cast<T*>(&packed);
#pragma unroll
    for (int i = 0; i < V; ++i) {
      o[i] = from_float<T>(grad_of(to_float(e[i]), v * V + i, label, a.temperature, scaled, lse, with_entropy, mu, g_lp, g_ent));
    }
    reinterpret_cast<uint4*>(out)[v] = packed;
  }
  for (int64_t i = vectors * V + threadIdx.x; i < a.vocab; i += kThreads) {
    out[i] = from_float<T>(grad_of(to_float(row[i]), i, label, a.temperature, scaled, lse, with_entropy, mu, g_lp, g_ent));
  }
}

// Launches the forward or backward kernel for `T`, one block per row.
template <class T>
void run(const TokenLogProbArgs& a, cudaStream_t s, bool backward) {
  const dim3 grid(static_cast<unsigned>(a.rows));
  if (backward) {
    backward_kernel<T><<<grid, kThreads, 0, s>>>(a);
  } else {
    forward_kernel<T><<<grid, kThreads, 0, s>>>(a);
  }
}

const char* launch(const TokenLogProbArgs& args, void* stream, bool backward) {
  if (args.rows == 0) return nullptr;
  auto s = static_cast<cudaStream_t>(stream);
  proto::cuda::with_element_type(args.dtype, [&](auto e) { run<decltype(e)>(args, s, backward); });
  return proto::cuda::last_launch_error();
}

}  // namespace

const char* launch_token_log_probs_forward(const TokenLogProbArgs& args, void* stream) {
  return launch(args, stream, /*backward=*/false);
}

const char* launch_token_log_probs_backward(const TokenLogProbArgs& args, void* stream) {
  return launch(args, stream, /*backward=*/true);
}

}  // namespace tessera::algos::cuda
