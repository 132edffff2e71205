// dp_critic.hpp: verl's DataParallelPPOCritic (verl/workers/critic/dp_critic.py, v0.5.0).
//
// The critic trains a value-head model (models::ValueModel behind a TrainableModule, see
// dp_actor.hpp) with the same mini-/micro-batch scheme as the actor (sequential mini-batches,
// ppo_epochs passes, fixed or dynamic micro-batches, verl's loss scaling, skip on a non-finite
// gradient norm) and verl's clipped value loss (algos::compute_value_loss with cliprange_value).
//
// Values are read over the response part exactly like the actor's log-probs: the value head at
// positions [T-R-1, T-1) (the value of the state before each response token). compute_values
// multiplies them by the response mask after restoring the row order (verl v0.5.0 applies the
// mask before un-permuting dynamic micro-batches, which pairs rows with the wrong mask; this does
// not).
//
// Thread contract: as DataParallelPPOActor.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "proto/data_proto.hpp"
#include "proto/status.hpp"
#include "workers/ppo/dp_actor.hpp"
#include "workers/ppo/ppo_batching.hpp"

namespace tessera::ppo {

/// The critic's model: a TrainableModule whose forward returns values [B, T].
using ValueModule = TrainableModule;

/// `critic` keys the critic uses, with verl v0.5.0 defaults. Batch sizes are per dp rank once
/// normalize_critic_config() has run (in prompts before).
struct CriticConfig {
  std::string strategy = "fsdp";  ///< "fsdp" | "fsdp2".
  int64_t rollout_n = 1;          ///< Samples per prompt (mirrors actor_rollout_ref.rollout.n).
  int64_t ppo_mini_batch_size = 256;
  std::optional<int64_t> ppo_micro_batch_size;  ///< Deprecated global form.
  std::optional<int64_t> ppo_micro_batch_size_per_gpu;
  std::optional<int64_t> forward_micro_batch_size;  ///< Deprecated global form.
  std::optional<int64_t> forward_micro_batch_size_per_gpu;  ///< Defaults to ppo_micro_batch_size_per_gpu.
  bool use_dynamic_bsz = false;
  int64_t ppo_max_token_len_per_gpu = 32768;
  std::optional<int64_t> forward_max_token_len_per_gpu;  ///< Defaults to ppo_max_token_len_per_gpu.
  int64_t ppo_epochs = 1;
  bool shuffle = false;  ///< Accepted and unused, as in verl v0.5.0.
  /// critic.model.use_remove_padding (set by the worker role): padding-free forwards (packing.hpp).
  bool use_remove_padding = false;
  double cliprange_value = 0.5;
  std::string loss_agg_mode = "token-mean";
  double grad_clip = 1.0;
  int64_t ulysses_sequence_parallel_size = 1;  ///< Only 1 is implemented.
};

/// Parses a `critic` mapping with verl's keys (path e.g. "critic"). Unknown keys are errors naming
/// the key; keys owned by other components (optim, model, checkpoint, profiler, enable, _target_)
/// are accepted and not read here. The result is validated (validate_critic_config).
Result<CriticConfig> parse_critic_config(const nlohmann::json& json, const std::string& path);

/// Checks values: positive sizes and epochs, grad_clip > 0, cliprange_value >= 0, loss_agg_mode
/// in algos' agg_loss_modes(), SP == 1. Errors name `path`.key and the value.
Status validate_critic_config(const CriticConfig& config, const std::string& path);

/// verl's CriticWorker normalisation: ppo_mini_batch_size x rollout_n / dp; deprecated global
/// ppo_micro_batch_size / forward_micro_batch_size become their *_per_gpu forms; without
/// use_dynamic_bsz, ppo_micro_batch_size_per_gpu must be set and divide the mini-batch; unset
/// forward_* fall back to their ppo_* counterparts. Errors name the keys and values.
Result<CriticConfig> normalize_critic_config(CriticConfig config, const DataParallelShape& shape);

/// verl's DataParallelPPOCritic.
class DataParallelPPOCritic {
 public:
  /// `config` must be normalised. `sequence_parallel` and the errors as DataParallelPPOActor::create.
  static Result<std::unique_ptr<DataParallelPPOCritic>> create(
      CriticConfig config, std::shared_ptr<ValueModule> module, MicroBatchCountSync sync = {},
      std::shared_ptr<const UlyssesGroup> sequence_parallel = nullptr);

  /// Values [B, R] of the response positions, times the response mask; eval mode, no grad.
  /// Reads keys responses, input_ids, attention_mask, position_ids, response_mask (else
  /// attention_mask[:, -R:]); micro-batching from meta_info micro_batch_size / use_dynamic_bsz /
  /// max_token_len, each falling back to forward_micro_batch_size_per_gpu / use_dynamic_bsz /
  /// forward_max_token_len_per_gpu of the config when absent.
  Result<at::Tensor> compute_values(const proto::DataProto& data);

  /// One critic update over `data` (verl's update_critic). Reads keys responses, input_ids,
  /// attention_mask, position_ids, values, returns, response_mask (else attention_mask[:, -R:]).
  /// Returns metric lists critic/vf_loss, critic/vf_clipfrac, critic/vpred_mean (per micro-batch),
  /// critic/grad_norm (per mini-batch), critic/lr (once).
  Result<Metrics> update_critic(const proto::DataProto& data);

  const CriticConfig& config() const { return config_; }
  ValueModule& module() const { return *module_; }

 private:
  DataParallelPPOCritic(CriticConfig config, std::shared_ptr<ValueModule> module, MicroBatchCountSync sync,
                        std::shared_ptr<const UlyssesGroup> sequence_parallel);
  Result<at::Tensor> compute_values_impl(const proto::DataProto& data);
  Result<Metrics> update_critic_impl(const proto::DataProto& data);

  CriticConfig config_;
  std::shared_ptr<ValueModule> module_;
  MicroBatchCountSync sync_;
  std::shared_ptr<const UlyssesGroup> sequence_parallel_;
};

}  // namespace tessera::ppo
