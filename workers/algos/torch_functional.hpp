// torch_functional.hpp: the tensor helpers of verl's `verl/utils/torch_functional.py` (verl_F) that
// the PPO maths relies on: masked reductions, whitening, entropy and log-probs from logits.
//
// Contract shared by every function here: tensors in, tensors out, on the inputs' device and dtype;
// autograd flows through (nothing here detaches). A mask may be bool, integer or floating; it is
// used in the values' dtype. Bad arguments give an invalid_argument Status naming the function and
// the argument; nothing throws. Thread-safe (no shared state).
#pragma once

#include <optional>

#include <ATen/core/Tensor.h>

#include "proto/status.hpp"

namespace tessera::algos {

/// Sum of values*mask over all elements, or along `axis`; masked-out NaN/inf are ignored.
// REQUIRES: values floating; mask has values' shape.
Result<at::Tensor> masked_sum(const at::Tensor& values, const at::Tensor& mask,
                              std::optional<int64_t> axis = std::nullopt);

/// masked_sum / (mask.sum + 1e-8), as verl computes it (so an all-zero mask gives 0, not NaN).
// REQUIRES: values floating; mask has values' shape.
Result<at::Tensor> masked_mean(const at::Tensor& values, const at::Tensor& mask,
                               std::optional<int64_t> axis = std::nullopt);

/// Masked variance over all elements; Bessel-corrected (n/(n-1)) when `unbiased`, as verl does.
// REQUIRES: values floating; mask has values' shape; with `unbiased`, mask sums to at least 2.
Result<at::Tensor> masked_var(const at::Tensor& values, const at::Tensor& mask, bool unbiased = true);

/// (values - masked_mean) * rsqrt(masked_var(unbiased) + 1e-8); the mean is added back when !shift_mean.
// REQUIRES: as masked_var with unbiased=true.
Result<at::Tensor> masked_whiten(const at::Tensor& values, const at::Tensor& mask, bool shift_mean = true);

/// max(min(x, tensor_max), tensor_min): clamp with tensor bounds (verl_F.clip_by_value).
// REQUIRES: the three tensors broadcast together.
Result<at::Tensor> clip_by_value(const at::Tensor& x, const at::Tensor& tensor_min, const at::Tensor& tensor_max);

/// Categorical entropy over the last dim: logsumexp(logits) - sum(softmax(logits) * logits).
// REQUIRES: logits floating with at least 1 dim; the result drops the last dim.
Result<at::Tensor> entropy_from_logits(const at::Tensor& logits);

/// log_softmax(logits)[..., labels]: the log-probability of each label (verl's logprobs_from_logits).
// REQUIRES: logits (..., V) floating; labels integral with shape logits.shape[:-1], values in [0, V).
Result<at::Tensor> logprobs_from_logits(const at::Tensor& logits, const at::Tensor& labels);

/// Per-token log-probabilities (and entropies) of a policy's logits, as the PPO losses use them.
struct TokenLogProbs {
  at::Tensor log_probs;  ///< log_softmax(logits / temperature)[label], fp32 (fp64 for fp64 logits), labels' shape.
  at::Tensor entropy;    ///< Entropy of softmax(logits / temperature), same dtype; undefined unless asked.
};

/// logprobs_from_logits and entropy_from_logits of logits / temperature, computed in fp32 over
/// chunks of `chunk_rows` rows (0: about 256 MiB of fp32 logits per chunk) for any logits dtype
/// (fp64 stays fp64), with a backward that recomputes each chunk's softmax instead of keeping fp32 [N, V]
/// buffers (Note [Chunked token log-probs] in token_log_probs.cpp). On a CUDA device, fp32 / fp16 /
/// bf16 logits go through two fused kernels instead and `chunk_rows` is unused (Note [Fused token
/// log-probs]). Gradients reach `logits` in its own dtype. Labels are NOT range-checked here (that needs a host read; see
/// check_labels_in_vocab).
// REQUIRES: logits (..., V) floating; labels integral with shape logits.shape[:-1], in [0, V).
Result<TokenLogProbs> token_log_probs(const at::Tensor& logits, const at::Tensor& labels, double temperature,
                                      bool with_entropy, int64_t chunk_rows = 0);

/// out_of_range naming `fn`, `name` and the first bad id unless every label is in [0, vocab).
/// One host read for the whole tensor.
Status check_labels_in_vocab(const char* fn, const char* name, const at::Tensor& labels, int64_t vocab);

}  // namespace tessera::algos
