// contract.hpp: verl's generate_sequences tensor contract (reference/verl-fsdp.md §6.3), shared by
// every RolloutEngine implementation: reading the prompt batch and assembling the output batch.
//
// Input DataProto:
//   input_ids [bs, P] (integer, left-padded), attention_mask [bs, P], position_ids [bs, P];
//   meta_info: eos_token_id (int or non-empty list of ints), pad_token_id (int), optional
//   do_sample (bool; default given by the caller), validate (bool, default false).
//   A batch of 0 rows gives an output of 0 rows. Each attention_mask row must be 0...0 1...1
//   with at least one 1; the prompt is the tokens
//   under the 1s (left pads are stripped by the mask, not by comparing with pad_token_id).
//   (bs, 3, P) mrope position_ids are refused (the models have no mrope).
// Output DataProto (meta_info is empty, as verl's vLLM rollout returns it):
//   prompts         = input_ids (the same tensor)
//   responses       [bs, R], the generated tokens right-padded with pad_token_id to exactly R
//   input_ids       = cat(prompts, responses)
//   attention_mask  = cat(attention_mask, get_response_mask(responses, eos)) in the mask's dtype
//   position_ids    = cat(position_ids, position_ids[:, -1:] + [1..R]) (also under padding)
//   rollout_log_probs [bs, R] fp32, padded with -1 (only when log-probs are given)
//   non-tensor columns pass through, except raw_prompt_ids and multi_modal_data (popped).
//
// Thread-safety: re-entrant.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "proto/data_proto.hpp"
#include "proto/status.hpp"

namespace tessera::rollout {

/// What generate_sequences reads from its input.
struct GenerationInputs {
  at::Tensor input_ids;       ///< [bs, P]
  at::Tensor attention_mask;  ///< [bs, P]
  at::Tensor position_ids;    ///< [bs, P]
  std::vector<std::vector<int64_t>> prompts;  ///< Per row, the tokens under attention_mask == 1.
  std::vector<int64_t> eos_token_ids;         ///< Non-empty.
  int64_t pad_token_id = 0;
  bool do_sample = true;
  bool validate = false;
};

/// Validates `batch` against the input contract and extracts the prompts. `default_do_sample`
/// is used when meta_info has no do_sample. Errors name the key (and row).
Result<GenerationInputs> read_generation_inputs(const proto::DataProto& batch, bool default_do_sample);

/// verl's get_response_mask: per row, 1 up to and including the first token in `eos_token_ids`,
/// 0 after it; all 1 when the row has none. `responses` [bs, R] integer; result in `dtype`.
at::Tensor get_response_mask(const at::Tensor& responses, const std::vector<int64_t>& eos_token_ids,
                             c10::ScalarType dtype);

/// One row's generated tokens (at most R) and, optionally, their log-probs (same length).
struct GeneratedRow {
  std::vector<int64_t> tokens;
  std::vector<float> logprobs;
};

/// Assembles the output DataProto from `batch` (for its non-tensor columns), the parsed inputs
/// and one GeneratedRow per input row. With `with_logprobs`, adds rollout_log_probs.
/// REQUIRES: rows.size() == batch size; every row has <= response_length tokens.
Result<proto::DataProto> build_generation_output(const proto::DataProto& batch, const GenerationInputs& inputs,
                                                 const std::vector<GeneratedRow>& rows, int64_t response_length,
                                                 bool with_logprobs);

/// One conversation as a multi-turn rollout or an agent loop assembled it.
struct ConversationTokens {
  std::vector<int64_t> prompt;    ///< 1 to prompt_length tokens.
  std::vector<int64_t> response;  ///< Up to response_length tokens: generated ones and tool answers.
  std::vector<int64_t> mask;      ///< Per response token: 1 generated, 0 not the model's.
  std::vector<float> logprobs;    ///< Per response token (with log-probs; -1 where not generated).
  int64_t num_turns = 0;          ///< verl's __num_turns__.
};

/// The output of a multi-turn rollout: generate_sequences' keys with `prompts` each row's own
/// prompt left-padded to `prompt_length` (pad_token_id), responses right-padded to
/// `response_length`, response_mask [bs, R] (1 on generated tokens), position_ids continuing
/// under the padding, rollout_log_probs with `with_logprobs`; the non-tensor columns of `batch`
/// (but raw_prompt_ids and multi_modal_data) plus `__num_turns__` and `added`.
/// REQUIRES: one row per input row, each within the lengths, mask (and logprobs) as long as the response.
Result<proto::DataProto> build_conversation_output(const proto::DataProto& batch, const GenerationInputs& inputs,
                                                   const std::vector<ConversationTokens>& rows, int64_t prompt_length,
                                                   int64_t response_length, bool with_logprobs,
                                                   proto::NonTensorBatch added = {});

}  // namespace tessera::rollout
