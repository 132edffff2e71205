// ops.hpp: unchecked kernels behind the public torch_functional.hpp, shared by the other algos .cpp
// files. They assume validated arguments and may throw c10::Error (callers run them inside
// `guarded`). Masks are converted to the value dtype first, so bool / int64 / float masks all work.
#pragma once

#include <optional>

#include <ATen/core/Tensor.h>

#include "proto/status.hpp"

namespace tessera::algos::internal {

/// `mask` as a tensor of `like`'s dtype (no copy when it already is).
at::Tensor as_value_mask(const at::Tensor& mask, const at::Tensor& like);

/// verl_F.masked_sum: sum of where(mask, values, 0) * mask.
at::Tensor masked_sum(const at::Tensor& values, const at::Tensor& mask, std::optional<int64_t> axis);

/// verl_F.masked_mean: masked_sum / (mask.sum + 1e-8).
at::Tensor masked_mean(const at::Tensor& values, const at::Tensor& mask, std::optional<int64_t> axis);

/// verl_F.masked_var (Bessel-corrected when `unbiased`); errors when the mask sums to 0 or 1.
Result<at::Tensor> masked_var(const at::Tensor& values, const at::Tensor& mask, bool unbiased);

/// verl_F.masked_whiten: (values - mean) * rsqrt(var + 1e-8), mean added back unless shift_mean.
Result<at::Tensor> masked_whiten(const at::Tensor& values, const at::Tensor& mask, bool shift_mean);

}  // namespace tessera::algos::internal
