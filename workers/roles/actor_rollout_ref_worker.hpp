// actor_rollout_ref_worker.hpp: verl's ActorRolloutRefWorker (verl/workers/fsdp_workers.py,
// v0.5.0; reference/verl-fsdp.md §3, §6.5) over Tessera's FSDP engine and KV-cache rollout.
//
// Registered methods (the seed's dispatch modes, checked by tests/workers/worker_methods_test):
//   init_model            ONE_TO_ALL        builds what the role needs (below); returns null.
//   generate_sequences    DP_COMPUTE_PROTO  colocated HybridEngine: FsdpShardingManager enter ->
//                                           engine.generate_sequences -> exit, then (actor roles)
//                                           the actor recomputes `old_log_probs` for the
//                                           generated responses (the seed's "recompute old log
//                                           prob", with meta_info.temperature as compute_log_prob
//                                           sets it; skipped when the prompts' meta_info has
//                                           recompute_log_prob = false, verl's validation flag). meta_info.metrics holds timing_s/reshard,
//                                           timing_s/generate_sequences (reshard included, as
//                                           verl's timer) and perf/cpu_memory_used_gb; the driver
//                                           pops them like verl pops meta_info["timing"].
//   compute_log_prob      DP_COMPUTE_PROTO  `old_log_probs`, `entropys`; meta_info {temperature}.
//   compute_ref_log_prob  DP_COMPUTE_PROTO  `ref_log_prob`.
//   (both add meta_info.metrics timing_s/<method>, perf/cpu_memory_used_gb: record_call_metrics)
//   update_actor          DP_COMPUTE_PROTO  one update_policy + one LR-scheduler step; returns a
//                                           row-less DataProto whose meta_info.metrics holds
//                                           verl's actor/* lists, actor/lr (the LR used),
//                                           perf/cpu_memory_used_gb, timing_s/update_policy.
//   save_checkpoint       ONE_TO_ALL        (local_path, hdfs_path=null, global_step, max_ckpt_to_keep)
//   load_checkpoint       ONE_TO_ALL        (local_path, hdfs_path=null, del_local_after_load=false)
// A method the role does not serve is an error naming the method and the role (verl asserts).
//
// Roles: actor | rollout | ref | actor_rollout | actor_rollout_ref. Actor and rollout share one
// FSDP model (fp32 master weights; AdamW only for actor roles); ref is a second FSDP model of
// model.path without optimizer, its parameters CPU-offloaded between calls (verl forces it).
// With model.lora_rank > 0 the actor trains LoRA adapters on a frozen base (models' Note [LoRA
// adapters]); the rollout serves the merged weights, and the reference policy is the actor with
// its adapters disabled (verl's ref_in_actor: compute_ref_log_prob on an actor role, batched by
// rollout.log_prob_*; no second model is loaded). Checkpoints add lora_adapter/ in PEFT's format.
// Actor param/optimizer offload (actor.fsdp_config.param_offload / optimizer_offload) wraps every
// call in load -> compute -> offload. Log-prob passes use the rollout temperature and
// rollout.log_prob_* (actor) / ref.log_prob_* (ref) micro-batching.
//
// Batch sizes are normalised at init_model (verl §3.4): actor.ppo_mini_batch_size x rollout.n /
// dp, deprecated global micro-batch sizes (actor.ppo_micro_batch_size,
// rollout.log_prob_micro_batch_size, ref.log_prob_micro_batch_size) / dp; bad combinations are
// refused naming the keys and values. A log-prob pass without a micro-batch size and without
// dynamic batching is refused there too.
//
// With rollout.multi_turn.enable the rollout runs conversations with verl's tools instead of one
// generation per prompt (rollout/multi_turn.hpp; its tool host starts at init_model): the output
// adds response_mask (tool answers 0), reward_scores and __num_turns__, and meta_info.metrics the
// rollout/*_mean tool counters and timing_s/tool_calls. With rollout.mode=async and
// agent.agent_loop_config_path, verl's agent loops (the user's and verl's own) run in a Python
// host instead (rollout/agent_loops.hpp), each row's loop picked by its agent_name; meta_info.metrics
// adds verl's timing_s/agent_loop/*.
//
// eos/pad for generation come from the model directory (generation_config.json, else
// config.json; pad falls back to the first eos id as verl's tokenizer helper does) and overwrite
// the prompts' meta_info, as verl does.
//
// Thread contract: one worker actor thread; every rank makes the same calls (collectives).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dispatch/worker_group.hpp"
#include "proto/data_proto.hpp"
#include "proto/status.hpp"
#include "runtime/collective/communicator.hpp"
#include "workers/ppo/dp_actor.hpp"
#include "workers/ppo/fsdp_trainable.hpp"
#include "workers/models/config.hpp"
#include "workers/rollout/config.hpp"
#include "workers/rollout/agent_loops.hpp"
#include "workers/rollout/multi_turn.hpp"
#include "workers/rollout/sharding_manager.hpp"
#include "workers/rollout/split_weights.hpp"
#include "workers/roles/worker_support.hpp"

namespace tessera::workers {

/// `actor_rollout_ref.ref` keys (the reference policy's log-prob pass and FSDP block).
struct RefConfig {
  std::optional<int64_t> log_prob_micro_batch_size;  ///< Deprecated global form.
  std::optional<int64_t> log_prob_micro_batch_size_per_gpu;
  bool log_prob_use_dynamic_bsz = false;
  int64_t log_prob_max_token_len_per_gpu = 16384;
  /// 1, or the actor's: verl runs the reference in the worker's (the actor's) sequence-parallel groups.
  int64_t ulysses_sequence_parallel_size = 1;
  nlohmann::json fsdp_config;
};

/// Everything init_model reads, parsed and normalised for one rank.
struct ActorRolloutRefConfig {
  std::string role;
  bool is_actor = false, is_rollout = false, is_ref = false;
  ModelSection model;
  ppo::ActorConfig actor;               ///< Normalised (per-rank sample counts).
  nlohmann::json actor_fsdp_config;
  nlohmann::json actor_optim;
  rollout::RolloutConfig rollout;  ///< log_prob_micro_batch_size normalised into *_per_gpu.
  RefConfig ref;                   ///< Normalised likewise.
  /// The worker's Ulysses group size: actor.ulysses_sequence_parallel_size, whatever the role (as
  /// verl's worker reads it). Batch sizes are normalised by world / this.
  int64_t ulysses_sequence_parallel_size = 1;
  uint64_t seed = 0;
  /// actor_rollout_ref.nccl_timeout: how long a collective of the group waits for its peers
  /// (verl's FSDP workers leave torch's 10-minute default; Tessera applies the key).
  std::chrono::seconds nccl_timeout{600};
  bool save_hf_model = false;      ///< actor.checkpoint.save_contents lists hf_model.
};

/// The roles verl's ActorRolloutRefWorker accepts.
const std::vector<std::string>& actor_rollout_ref_roles();

/// Parses the init config {"role", "config": actor_rollout_ref subtree, "seed"} and normalises
/// batch sizes for a data-parallel world of `dp_size`. Errors name the key and value.
Result<ActorRolloutRefConfig> parse_actor_rollout_ref_config(const nlohmann::json& init, int64_t dp_size);

/// eos ids and pad id for generation from an HF model directory (see the header comment).
struct GenerationTokens {
  std::vector<int64_t> eos_token_ids;
  int64_t pad_token_id = 0;
};
Result<GenerationTokens> generation_tokens(const std::string& model_dir, const models::ModelConfig& config);

/// verl's ActorRolloutRefWorker. See the header comment.
class ActorRolloutRefWorker final : public dispatch::WorkerBase {
 public:
  /// A worker for `context` from its init config; checks the role and registers the methods.
  /// Models are built by init_model().
  static Result<std::unique_ptr<ActorRolloutRefWorker>> create(const runtime::WorkerContext& context,
                                                               const nlohmann::json& init_config);

  Status init_model();
  Result<proto::DataProto> generate_sequences(const proto::DataProto& prompts);
  Result<proto::DataProto> compute_log_prob(const proto::DataProto& data);
  Result<proto::DataProto> compute_ref_log_prob(const proto::DataProto& data);
  Result<proto::DataProto> update_actor(const proto::DataProto& data);
  /// Split placement (rollout/split_weights.hpp): the actor's bucket plan {"buckets", "bytes"},
  /// one bucket of its shards, and the rollout side's import of one bucket.
  Result<nlohmann::json> rollout_weight_buckets();
  Result<proto::DataProto> export_rollout_weights(int64_t bucket, int64_t version);
  Result<nlohmann::json> load_rollout_weights(const proto::DataProto& bucket);
  Status save_checkpoint(const SaveCheckpointArgs& args);
  Status load_checkpoint(const LoadCheckpointArgs& args);

  /// After init_model: the parsed config, the actor/rollout FSDP module, the ref module, the
  /// sharding manager (null when the role lacks them). For tests and tools.
  const ActorRolloutRefConfig& config() const { return config_; }
  ppo::FsdpTrainableModule* actor_module() const { return actor_module_.get(); }
  ppo::FsdpTrainableModule* ref_module() const { return ref_module_.get(); }
  rollout::FsdpShardingManager* sharding_manager() const { return sharding_.get(); }
  /// The split-placement rollout's weight importer (null unless placement=split, role rollout).
  rollout::WeightImporter* weight_importer() const { return importer_.get(); }

 private:
  ActorRolloutRefWorker(runtime::WorkerContext context, nlohmann::json init_config, std::string role);
  void register_methods();
  Status require(bool has, const char* method, const char* what) const;
  Status build_actor_rollout();
  Status build_ref();
  Status build_split_rollout();
  Status build_multi_turn();
  Status build_agent_loops();
  /// One generation on `engine`: the multi-turn rollout's conversations or generate_sequences.
  Result<proto::DataProto> generate_on(rollout::RolloutEngine& engine, const proto::DataProto& prompts);
  void register_split_methods();
  Result<c10::ScalarType> rollout_weight_dtype() const;
  rollout::EngineOptions engine_options(uint64_t dp_rank) const;
  Result<ppo::LogProbOutput> log_probs(ppo::DataParallelPPOActor& actor, const proto::DataProto& data,
                                  const std::optional<int64_t>& micro_batch_size, bool use_dynamic_bsz,
                                  int64_t max_token_len, bool calculate_entropy);
  Result<proto::DataProto> old_log_probs(const proto::DataProto& data, bool calculate_entropy = true);
  /// The actor trains LoRA adapters (model.lora_rank > 0 on an actor role).
  bool lora_actor() const { return config_.is_actor && config_.model.lora.enabled(); }
  Result<proto::DataProto> generate_with_sharding(const proto::DataProto& prompts, double& reshard_seconds);

  nlohmann::json init_config_;
  std::string role_;
  ActorRolloutRefConfig config_;
  bool initialized_ = false;
  std::shared_ptr<collective::Communicator> world_;
  models::ModelConfig model_config_;
  GenerationTokens tokens_;
  std::shared_ptr<ppo::FsdpTrainableModule> actor_module_;
  std::unique_ptr<ppo::DataParallelPPOActor> actor_;
  std::unique_ptr<rollout::FsdpShardingManager> sharding_;
  std::shared_ptr<collective::Communicator> rollout_tp_;  // the rollout TP group; null for TP 1
  std::unique_ptr<rollout::WeightExporter> exporter_;    // actor side of split placement (lazy)
  std::unique_ptr<rollout::KVCacheEngine> split_engine_;  // split placement's rollout engine
  std::unique_ptr<rollout::WeightImporter> importer_;
  std::unique_ptr<rollout::MultiTurnRollout> multi_turn_;  // rollout.multi_turn.enable; null otherwise
  std::unique_ptr<rollout::AgentLoopRollout> agent_loops_;  // agent.agent_loop_config_path; null otherwise
  std::shared_ptr<ppo::FsdpTrainableModule> ref_module_;
  std::unique_ptr<ppo::DataParallelPPOActor> ref_policy_;
  std::shared_ptr<ppo::UlyssesGroup> ulysses_;  // the worker's sequence-parallel group; null for 1
  CheckpointRotation rotation_;
};

}  // namespace tessera::workers
