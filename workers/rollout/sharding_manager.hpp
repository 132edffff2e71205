// sharding_manager.hpp: the colocated HybridEngine handoff between an FSDP-sharded policy and the
// KV-cache rollout engine: verl's FSDPVLLMShardingManager (reference/verl-fsdp.md §6.5).
//
// Note [Colocated resharding]
// enter() (timed as timing_s/reshard):
//   1. reloads the FSDP shards if they are offloaded;
//   2. for every FSDP unit, all-gathers the shards over the "fsdp" mesh group straight into one
//      full flat buffer in the ROLLOUT dtype (the local shard is cast first, so each rank casts
//      1/K of the unit; with K == 1 and equal dtypes the shard itself is the buffer);
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
// Split placement and rollout tensor parallelism are not implemented (engine creation refuses
// tensor_model_parallel_size > 1).
//
// Thread contract: the worker's thread; every rank of the FSDP mesh calls enter()/exit() together
// (enter() is collective).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "proto/status.hpp"
#include "workers/fsdp/fsdp_module.hpp"
#include "workers/models/config.hpp"
#include "workers/models/model.hpp"
#include "workers/rollout/config.hpp"
#include "workers/rollout/kv_engine.hpp"

namespace tessera::rollout {

/// How a sharding manager builds its engine and swaps state.
struct ShardingManagerOptions {
  RolloutConfig config;     ///< actor_rollout_ref.rollout.
  EngineOptions engine;     ///< The engine's sampling seed.
  uint64_t generation_seed = 1000;  ///< Seed of the generation RNG state (verl: dp_rank + 1000).
};

/// What the last enter() did.
struct ReshardStats {
  double reshard_seconds = 0;       ///< Wall time of enter() (verl's timing_s/reshard).
  int64_t units = 0;                ///< FSDP units gathered.
  int64_t gathered_bytes = 0;       ///< Bytes of the full buffers handed to the engine.
  int64_t handoff_copied_bytes = 0; ///< Engine parameter bytes outside the gathered buffers (0).
};

/// verl's FSDPVLLMShardingManager for the KV-cache engine. See Note [Colocated resharding].
class FsdpShardingManager {
 public:
  /// A manager over `fsdp` (which must outlive it) whose module is a CausalLM of `model_config`.
  /// Builds the engine on a weightless model shell in the rollout dtype ("auto": the FSDP
  /// param_dtype). Errors: engine creation (config, dtype, lengths vs context).
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
  /// The full unit buffers while entered (empty otherwise), for zero-copy checks.
  const std::vector<at::Tensor>& gathered_buffers() const { return gathered_; }
  const ReshardStats& last_reshard() const { return stats_; }
  c10::ScalarType rollout_dtype() const { return dtype_; }

 private:
  FsdpShardingManager(fsdp::FsdpModule& fsdp, std::shared_ptr<models::CausalLM> model,
                      std::unique_ptr<KVCacheEngine> engine, c10::ScalarType dtype, uint64_t generation_seed);
  Result<models::TensorMap> gather_units();
  int64_t bytes_outside_buffers() const;
  void free_rollout_weights();

  fsdp::FsdpModule& fsdp_;
  std::shared_ptr<models::CausalLM> rollout_model_;
  std::unique_ptr<KVCacheEngine> engine_;
  c10::ScalarType dtype_;
  std::vector<at::Tensor> gathered_;
  at::Tensor generation_rng_state_;
  at::Tensor training_rng_state_;
  bool entered_ = false;
  bool swapped_ = false;  // this manager holds the process's default generator swapped
  ReshardStats stats_;
};

}  // namespace tessera::rollout
