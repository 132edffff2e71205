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

}  // namespace tessera::algos
