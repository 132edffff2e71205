// fused_sampling.hpp: the CUDA kernel that draws one token per row from softmax(logits / T) by
// inverse-CDF sampling with the row's own uniform (sampling.hpp's rule, without top-k / top-p),
// behind a plain C++ interface (raw device pointers and a stream; nvcc alone compiles it).
//
// Note [Fused sampling]
// The torch path writes softmax(logits / T) and its cumulative sum over the whole vocabulary
// (151936 fp32 columns for Qwen: ~1 GB moved per decode step at 512 rows) and then searches it.
// The kernel runs one thread block per row and reads the row at most twice: pass 1 takes the
// maximum M and S = sum exp(x / T - M) in one online sweep; pass 2 walks the row in tiles of
// 4096 columns, scanning exp(x / T - M) within each tile (a block-wide prefix sum) and adding the
// tiles' totals, and stops at the first column whose running sum exceeds u * S. A column of zero
// probability never crosses first. Only the summation order differs from the torch path, so a
// draw can differ only where u * S falls within rounding of a boundary between two columns. If
// rounding leaves the last running sum at or below u * S, the last column of positive
// probability is taken (the torch path's clamp). The log-prob of the chosen column,
// x / T - M - log S, comes out of the same pass (log_softmax's formula). The kernel reads the
// logits in the model's dtype (bf16, fp16 or fp32) and widens each to fp32 as it loads it: the
// same values as the torch path's fp32 copy, without writing that copy (at 512 rows of Qwen's
// vocabulary in bf16, 0.3 GB written and 0.15 GB read fewer per decode step, and the two passes
// read half the bytes).
//
// Thread-safety: re-entrant; the launch is asynchronous on `stream` and can be graph-captured.
#pragma once

#include <cstdint>

#include "proto/cuda/element.hpp"

namespace tessera::rollout::cuda {

using ElementType = proto::cuda::ElementType;

struct FusedSamplingArgs {
  const void* logits = nullptr;    ///< [rows, vocab] of `dtype`, row stride `row_stride`, unit column stride.
  ElementType dtype = ElementType::f32;
  int64_t row_stride = 0;
  const double* uniforms = nullptr;  ///< [rows] in [0, 1).
  int64_t* tokens = nullptr;         ///< [rows] out.
  float* logprobs = nullptr;         ///< [rows] out, or nullptr.
  int64_t rows = 0, vocab = 0;
  float temperature = 1.f;
};

/// Launches the kernel on `stream` (a cudaStream_t). Returns nullptr on success, else the CUDA
/// error string. A row with a NaN or +inf logit, or only -inf ones, gets token -1 and a NaN
/// log-prob (Note [Unsampleable rows] in sampling.hpp). REQUIRES: temperature > 0.
const char* launch_fused_sampling(const FusedSamplingArgs& args, void* stream);

}  // namespace tessera::rollout::cuda
