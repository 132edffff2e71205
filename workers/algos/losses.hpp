// losses.hpp: loss aggregation and the critic / entropy losses of verl's core_algos.py (v0.5.0).
//
// `agg_loss` turns a (bs, T) per-token loss into a scalar in one of verl's four modes
// (`actor.loss_agg_mode`). The losses are differentiable (autograd flows through) and return
// 0-dim tensors on the inputs' device and dtype. Bad arguments or an unknown mode give an
// invalid_argument Status naming the function and the argument; nothing throws. Thread-safe.
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "proto/status.hpp"

namespace tessera::algos {

/// The loss_agg_mode names agg_loss accepts, in verl's order.
std::vector<std::string> agg_loss_modes();

/// Aggregates loss_mat into a scalar: token-mean = masked mean over all tokens;
/// seq-mean-token-sum = mean over rows of the masked row sums; seq-mean-token-mean = mean over rows
/// of the masked row means (a row with an all-zero mask gives NaN, as in verl);
/// seq-mean-token-sum-norm = sum of the masked row sums / T (T = loss_mask.size(-1), Dr.GRPO).
// REQUIRES: loss_mat (bs, T) floating; loss_mask of the same shape; loss_agg_mode in agg_loss_modes().
Result<at::Tensor> agg_loss(const at::Tensor& loss_mat, const at::Tensor& loss_mask,
                            const std::string& loss_agg_mode);

/// Output of compute_value_loss, named as verl returns it.
struct ValueLossOutput {
  at::Tensor vf_loss;      ///< 0.5 * agg_loss(max((vpreds-returns)^2, (vpredclipped-returns)^2)).
  at::Tensor vf_clipfrac;  ///< masked mean of [(vpredclipped-returns)^2 > (vpreds-returns)^2].
};

/// Clipped PPO value loss: vpredclipped = clip(vpreds, values - cliprange_value, values + cliprange_value).
// REQUIRES: vpreds, returns, values, response_mask all (bs, T); cliprange_value >= 0.
Result<ValueLossOutput> compute_value_loss(const at::Tensor& vpreds, const at::Tensor& returns,
                                           const at::Tensor& values, const at::Tensor& response_mask,
                                           double cliprange_value,
                                           const std::string& loss_agg_mode = "token-mean");

/// agg_loss(entropy_from_logits(logits), response_mask, loss_agg_mode) (verl's compatibility helper).
// REQUIRES: logits (bs, T, V) floating; response_mask (bs, T).
Result<at::Tensor> compute_entropy_loss(const at::Tensor& logits, const at::Tensor& response_mask,
                                        const std::string& loss_agg_mode = "token-mean");

}  // namespace tessera::algos
