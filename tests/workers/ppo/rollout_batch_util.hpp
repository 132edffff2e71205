// rollout_batch_util.hpp: the verl-shaped rollout batch tensors ppo_test and worker_test build
// their batches from, and the max-difference check both use. No gtest here.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "proto/data_proto.hpp"

namespace tessera::testing {

/// A verl rollout batch's tensors: prompts left-padded to P (lengths prompt_lens), responses
/// right-padded to R (lengths response_lens), ids drawn from [3, vocab) with `gen` (prompts, then
/// responses). Keys input_ids, attention_mask, position_ids, responses, response_mask.
inline proto::TensorDict rollout_tensors(const std::vector<int64_t>& prompt_lens,
                                         const std::vector<int64_t>& response_lens, int64_t P, int64_t R,
                                         int64_t vocab, at::Generator& gen) {
  const auto B = static_cast<int64_t>(prompt_lens.size());
  at::Tensor prompt_mask = at::zeros({B, P}, at::kLong), response_mask = at::zeros({B, R}, at::kLong);
  for (int64_t i = 0; i < B; ++i) {
    prompt_mask[i].narrow(0, P - prompt_lens[i], prompt_lens[i]).fill_(1);
    response_mask[i].narrow(0, 0, response_lens[i]).fill_(1);
  }
  at::Tensor prompts = at::randint(3, vocab, {B, P}, gen, at::kLong) * prompt_mask;
  at::Tensor responses = at::randint(3, vocab, {B, R}, gen, at::kLong) * response_mask;
  at::Tensor attention_mask = at::cat({prompt_mask, response_mask}, 1);
  proto::TensorDict t;
  t.insert_or_assign("input_ids", at::cat({prompts, responses}, 1));
  t.insert_or_assign("attention_mask", attention_mask);
  t.insert_or_assign("position_ids", (attention_mask.cumsum(1) - 1).clamp_min(0));
  t.insert_or_assign("responses", responses);
  t.insert_or_assign("response_mask", response_mask);
  return t;
}

/// Max |a - b| (as double).
inline double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

}  // namespace tessera::testing
