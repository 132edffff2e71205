// reward_model_worker.hpp: verl's RewardModelWorker (verl/workers/fsdp_workers.py, v0.5.0;
// reference/verl-fsdp.md §3.8): a value-head model scoring whole sequences.
//
// Registered methods (the seed's dispatch modes):
//   init_model        ONE_TO_ALL        loads reward_model.model.path as a value model, wraps it in
//                                       FSDP without optimizer, parameters always CPU-offloaded
//                                       between calls (verl forces it).
//   compute_rm_score  DP_COMPUTE_PROTO  reads input_ids, attention_mask, position_ids, responses
//                                       (and raw_prompt when re-templating, below);
//                                       per row the score is the value head at the last valid
//                                       token, eos_idx = argmax(position_ids * attention_mask),
//                                       scattered into a zero [B, T] tensor whose last R columns
//                                       are returned as `rm_scores` (token-level, verl's
//                                       _expand_to_token_level). Micro-batches: fixed
//                                       (micro_batch_size_per_gpu) or dynamic
//                                       (forward_max_token_len_per_gpu), order restored;
//                                       meta_info.metrics timing_s/compute_rm_score,
//                                       perf/cpu_memory_used_gb.
// reward_model.model.input_tokenizer (verl's default: the policy's model.path) re-templates the
// inputs for the reward model as verl's _switch_chat_template does (switch_chat_template below);
// null scores the policy's tokens as given. The score lands at the policy sequence's last valid
// token either way.
// Batch size: a global micro_batch_size is divided by the world size into micro_batch_size_per_gpu
// (verl); fixed batching without one is refused at init_model.
//
// Init config: {"config": <verl reward_model subtree>, optional "comm_backend"}.
// Thread contract: one worker actor thread; every rank makes the same calls.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "dispatch/worker_group.hpp"
#include "proto/data_proto.hpp"
#include "proto/status.hpp"
#include "workers/ppo/fsdp_trainable.hpp"
#include "workers/roles/worker_support.hpp"

namespace tessera::tokenizer {
class ChatTemplate;
class Tokenizer;
}  // namespace tessera::tokenizer

namespace tessera::workers {

/// The `reward_model` keys the worker reads.
struct RewardModelConfig {
  ModelSection model;
  std::optional<int64_t> max_length;  ///< reward_model.max_length: the re-templated width (null: the input's).
  std::string truncation = "right";   ///< reward_model.truncation: left, right, middle or error.
  std::optional<int64_t> micro_batch_size;  ///< Deprecated global form.
  std::optional<int64_t> micro_batch_size_per_gpu;
  bool use_dynamic_bsz = false;
  int64_t forward_max_token_len_per_gpu = 32768;
  /// Ulysses groups (Note [Ulysses sequence parallelism]); > 1 needs model.use_remove_padding.
  int64_t ulysses_sequence_parallel_size = 1;
};

/// Parses and normalises a `reward_model` subtree for `world_size` ranks. Errors name the key.
Result<RewardModelConfig> parse_reward_model_config(const nlohmann::json& json, int64_t world_size);

/// verl's token-level RM scores: `scores` [B] placed at argmax(position_ids * attention_mask) of
/// each row of a zero [B, T] tensor (scores' dtype); returns its last `response_length` columns.
at::Tensor expand_to_token_level(const at::Tensor& scores, const at::Tensor& attention_mask,
                                 const at::Tensor& position_ids, int64_t response_length);

/// What switch_chat_template needs: both tokenizers, the reward model's chat template, the width.
struct ChatTemplateSwitch {
  const tokenizer::Tokenizer& input;    ///< reward_model.model.input_tokenizer: decodes the responses.
  const tokenizer::Tokenizer& target;   ///< The reward model's own (model.path).
  const tokenizer::ChatTemplate& chat;  ///< target's chat template.
  std::optional<int64_t> max_length;    ///< RewardModelConfig::max_length.
  std::string truncation = "right";     ///< RewardModelConfig::truncation.
};

/// verl's _switch_chat_template: per row, the chat of non-tensor column "raw_prompt" (a list of
/// {role, content} messages) plus {"role": "assistant", "content": the valid response tokens
/// decoded by `input` with its eos token text removed}, rendered by `chat` without a generation
/// prompt, encoded by `target` without special tokens, truncated to max_length (default: the
/// input's width) and right-padded with target's pad id (else its eos id): input_ids,
/// attention_mask, position_ids on data's device. Errors name the row and the key.
Result<proto::DataProto> switch_chat_template(const proto::DataProto& data, const ChatTemplateSwitch& s);

/// verl's RewardModelWorker. See the header comment.
class RewardModelWorker final : public dispatch::WorkerBase {
 public:
  /// A worker for `context`; registers the methods. The model is built by init_model().
  static Result<std::unique_ptr<RewardModelWorker>> create(const runtime::WorkerContext& context,
                                                           const nlohmann::json& init_config);

  Status init_model();
  Result<proto::DataProto> compute_rm_score(const proto::DataProto& data);

  ppo::FsdpTrainableModule* module() const { return module_.get(); }

 private:
  RewardModelWorker(runtime::WorkerContext context, nlohmann::json init_config);
  Result<at::Tensor> sequence_scores(const proto::DataProto& data);

  nlohmann::json init_config_;
  RewardModelConfig config_;
  // Re-templating (input_tokenizer set): the policy's tokenizer, the reward model's, its template.
  std::shared_ptr<const tokenizer::Tokenizer> input_tokenizer_, rm_tokenizer_;
  std::shared_ptr<const tokenizer::ChatTemplate> rm_template_;
  std::shared_ptr<collective::Communicator> world_;
  std::shared_ptr<ppo::FsdpTrainableModule> module_;
  std::shared_ptr<ppo::UlyssesGroup> ulysses_;  // null without sequence parallelism
};

}  // namespace tessera::workers
