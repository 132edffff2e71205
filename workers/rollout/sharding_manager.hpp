// sharding_manager.hpp: the colocated HybridEngine handoff between an FSDP-sharded policy and the
// KV-cache rollout engine: verl's FSDPVLLMShardingManager (reference/verl-fsdp.md §6.5).
//
// Note [Colocated resharding]
// enter() (timed as timing_s/reshard):
//   1. reloads the FSDP shards if they are offloaded;
//   2. for every FSDP unit, all-gathers the shards over the "fsdp" mesh group straight into one
//      full flat buffer in the ROLLOUT dtype (the local shard is cast first, so each rank casts
//      1/K of the unit; with K == 1 and equal dtypes the shard itself is the buffer);
//      With LoRA adapters (ShardingManagerOptions::lora_scaling), every unit holding an adapted
//      weight is gathered into a buffer of its own (never the shard), and each adapted weight is
//      merged there in place, W + B A * alpha / r computed in fp32 (models::merge_lora_weights):
//      the engine serves the adapted policy at the base model's speed, and the handoff still
//      copies nothing. With rollout TP the adapters are replicated on every TP rank, and each
//      rank adds the slice of B A * alpha / r that its slice of the weight holds;
//   3. hands every parameter, as a view of its unit's buffer, to the engine's model BY REFERENCE
//      (RolloutEngine::load_weights_by_reference): zero bytes are copied, and enter() verifies it
//      by checking that every engine parameter's storage lies inside a gathered buffer
//      (ReshardStats::handoff_copied_bytes, an error if non-zero);
//   4. re-offloads the shards if they were offloaded (the engine holds the gathered buffers, not
//      the shards);
//   5. swaps the process's default CPU generator to the generation RNG state (seeded with
//      generation_seed = dp_rank + 1000 at construction, like verl, so TP peers sample alike).
//      The default generator is process-wide: when several ranks share a process (the embedded
//      runtime), only one manager at a time holds it swapped and the others leave it alone, so the
//      training state is always restored. Sampling itself is unaffected: the engine draws from its
//      own per-rank generator (EngineOptions::seed).
// exit(): stores the generation RNG state and restores the training one, points every engine
// parameter at a one-element broadcast view (its shape kept) and drops the gathered buffers, so their memory is freed (the KV
// cache never outlives a generate_sequences call; free_cache_engine is implied). Afterwards the
// FSDP engine is exactly as before enter() (same resident bytes, same offload state).
//
// Note [Rollout TP resharding]
// With tensor_model_parallel_size = T > 1 (options.tp_group: this rank's TP group, T consecutive
// world ranks, as verl's (dp, infer_tp) rollout mesh), the engine is one TP rank's model
// (tensor_parallel.hpp) and step 2 changes: each rank needs only its slices
// (Note [Rollout TP slicing]), which are cut straight from the FSDP shards. Every shard owner
// packs, for each peer of its FSDP group, the elements that peer's TP rank needs from its shard,
// and one variable all-to-all (collective/exchange.hpp) lands them in place in the receiver's
// slice buffer. No rank receives or materialises more than its own slices
// (ReshardStats::received_bytes vs full_bytes). Steps 3-5 are unchanged: the engine aliases the
// slice buffers, zero bytes are copied at the handoff.
// Split placement (rollout ranks on devices of their own) does not use this manager: its weights
// arrive over the data plane (split_weights.hpp).
//
// Thread contract: the worker's thread; every rank of the FSDP mesh calls enter()/exit() together
// (enter() is collective).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "proto/status.hpp"
#include "runtime/collective/communicator.hpp"
#include "workers/fsdp/fsdp_module.hpp"
#include "workers/models/config.hpp"
#include "workers/models/model.hpp"
#include "workers/rollout/config.hpp"
#include "workers/rollout/kv_engine.hpp"
#include "workers/rollout/tensor_parallel.hpp"

namespace tessera::rollout {

/// How a sharding manager builds its engine and swaps state.
struct ShardingManagerOptions {
  RolloutConfig config;     ///< actor_rollout_ref.rollout.
  EngineOptions engine;     ///< The engine's sampling seed.
  uint64_t generation_seed = 1000;  ///< Seed of the generation RNG state (verl: dp_rank + 1000).
  /// The rollout TP group (config.tensor_model_parallel_size ranks); null when that is 1.
  std::shared_ptr<collective::Communicator> tp_group;
  /// > 0: the FSDP module holds LoRA adapters with this alpha / r (models' Note [LoRA adapters]),
  /// which enter() folds into the gathered base weights.
  double lora_scaling = 0.0;
};

/// What the last enter() did.
struct ReshardStats {
  double reshard_seconds = 0;       ///< Wall time of enter() (verl's timing_s/reshard).
  int64_t units = 0;                ///< FSDP units gathered.
  int64_t gathered_bytes = 0;       ///< Bytes of the buffers handed to the engine (TP: this rank's slices).
  int64_t received_bytes = 0;       ///< Of those, bytes received from other ranks.
  int64_t full_bytes = 0;           ///< Bytes of the whole model in the rollout dtype (for comparison).
  int64_t handoff_copied_bytes = 0; ///< Engine parameter bytes outside the gathered buffers (0).
};

/// Points every parameter of `model` at a one-element broadcast view (its shape kept, so the next
/// load_weights_by_reference checks it), releasing the storage it held. With `device`, the views
/// live there instead of on each parameter's device.
void drop_weight_storage(models::CausalLM& model, std::optional<c10::Device> device = std::nullopt);

/// verl's FSDPVLLMShardingManager for the KV-cache engine. See Note [Colocated resharding].
class FsdpShardingManager {
 public:
  /// A manager over `fsdp` (which must outlive it) whose module is a CausalLM of `model_config`.
  /// Builds the engine on a weightless model shell in the rollout dtype ("auto": the FSDP
  /// param_dtype); with TP, the shell of one TP rank. Errors: engine creation (config, dtype,
  /// lengths vs context), a TP size the model's heads or widths do not divide, a TP group that
  /// does not match the config or the world layout.
  static Result<std::unique_ptr<FsdpShardingManager>> create(fsdp::FsdpModule& fsdp, models::ModelConfig model_config,
                                                             const ShardingManagerOptions& options);
  ~FsdpShardingManager();

  /// Gathers and hands over the weights, swaps the RNG. Collective. Error if already entered;
  /// on error nothing stays gathered and the RNG is not swapped.
  Status enter();
  /// Frees the weights, restores the RNG. Idempotent.
  Status exit();
  bool entered() const { return entered_; }

  /// The engine. generate_sequences only between enter() and exit().
  RolloutEngine& engine() const { return *engine_; }
  /// The engine's model (outside enter/exit each parameter is a one-element broadcast view).
  models::CausalLM& rollout_model() const { return *rollout_model_; }
  /// The unit buffers (TP: this rank's slices) while entered (empty otherwise), for zero-copy checks.
  const std::vector<at::Tensor>& gathered_buffers() const { return gathered_; }
  const ReshardStats& last_reshard() const { return stats_; }
  c10::ScalarType rollout_dtype() const { return dtype_; }

 private:
  FsdpShardingManager(fsdp::FsdpModule& fsdp, std::shared_ptr<models::CausalLM> model,
                      std::unique_ptr<KVCacheEngine> engine, c10::ScalarType dtype, uint64_t generation_seed);
  Status plan_tp(int64_t tp, int64_t tp_rank);
  Result<models::TensorMap> gather_units();
  Result<models::TensorMap> gather_tp_slices();
  int64_t bytes_outside_buffers() const;
  void free_rollout_weights();

  fsdp::FsdpModule& fsdp_;
  std::shared_ptr<models::CausalLM> rollout_model_;
  std::unique_ptr<KVCacheEngine> engine_;
  c10::ScalarType dtype_;
  std::vector<at::Tensor> gathered_;
  int64_t tp_rank_ = 0;
  std::vector<std::vector<TpUnitPlan>> tp_plans_;  // [unit][tp rank]; empty without TP
  std::vector<int> fsdp_peer_tp_rank_;             // TP rank of each FSDP group member
  at::Tensor generation_rng_state_;
  at::Tensor training_rng_state_;
  bool entered_ = false;
  bool swapped_ = false;  // this manager holds the process's default generator swapped
  double lora_scaling_ = 0.0;  // ShardingManagerOptions::lora_scaling
  ReshardStats stats_;
};

}  // namespace tessera::rollout
