// token_log_probs.hpp: the CUDA kernels behind algos::token_log_probs on a GPU (Note [Fused token
// log-probs] in ../token_log_probs.cpp), behind a plain C++ interface (raw device pointers and a
// stream, no LibTorch types) so their translation unit compiles with nvcc alone.
//
// Maths, per row r of logits [rows, vocab], x = logits[r] / temperature in fp32:
//   lse = log sum_i exp(x_i);  log_prob = x[label] - lse;  entropy = lse - sum_i softmax(x)_i x_i
// and, for the backward, with p = exp(x - lse) and mu = lse - entropy:
//   grad_i = (g_lp ([i == label] - p_i) - g_ent p_i (x_i - mu)) / temperature
//
// Thread-safety: re-entrant; launches are asynchronous on `stream`.
#pragma once

#include <cstdint>

#include "proto/cuda/element.hpp"

namespace tessera::algos::cuda {

using ElementType = proto::cuda::ElementType;

struct TokenLogProbArgs {
  const void* logits = nullptr;    ///< [rows, vocab], elements contiguous within a row.
  int64_t row_stride = 0;          ///< Elements between rows.
  const int64_t* labels = nullptr;  ///< [rows] contiguous, in [0, vocab).
  int64_t rows = 0, vocab = 0;
  float temperature = 1.f;
  ElementType dtype = ElementType::f32;
  // Forward outputs, [rows] fp32 contiguous; entropy may be null.
  float* log_probs = nullptr;
  float* lse = nullptr;
  float* entropy = nullptr;
  // Backward inputs, [rows] fp32 contiguous (a null gradient is zero), and the output
  // grad_logits [rows, vocab] contiguous in the logits' element type.
  const float* saved_lse = nullptr;
  const float* saved_entropy = nullptr;  ///< Needed when grad_entropy is set.
  const float* grad_log_probs = nullptr;
  const float* grad_entropy = nullptr;
  void* grad_logits = nullptr;
};

/// Writes log_probs, lse and (if set) entropy. Returns nullptr on success, else the CUDA error.
const char* launch_token_log_probs_forward(const TokenLogProbArgs& args, void* stream);

/// Writes grad_logits. Returns nullptr on success, else the CUDA error.
const char* launch_token_log_probs_backward(const TokenLogProbArgs& args, void* stream);

}  // namespace tessera::algos::cuda
