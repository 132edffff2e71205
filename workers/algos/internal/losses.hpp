// losses.hpp (internal): the unchecked agg_loss used by the policy and value losses.
#pragma once

#include <string>

#include <ATen/core/Tensor.h>

#include "proto/status.hpp"

namespace tessera::algos::internal {

/// agg_loss without shape checks; errors only on an unknown mode. May throw c10::Error.
Result<at::Tensor> agg_loss(const at::Tensor& loss_mat, const at::Tensor& loss_mask, const std::string& mode);

}  // namespace tessera::algos::internal
