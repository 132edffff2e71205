// advantage_check.hpp: argument checks shared by the advantage estimator .cpp files.
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "proto/status.hpp"

namespace tessera::algos::internal {

/// token_level_rewards is a floating (bs, T) matrix and response_mask has its shape.
Status check_rewards_and_mask(const char* fn, const at::Tensor& token_level_rewards, const at::Tensor& response_mask);

/// As check_rewards_and_mask, plus index holds one uid per row.
Status check_grouped(const char* fn, const at::Tensor& token_level_rewards, const at::Tensor& response_mask,
                     const std::vector<std::string>& index);

}  // namespace tessera::algos::internal
