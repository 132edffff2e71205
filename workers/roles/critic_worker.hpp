// critic_worker.hpp: verl's CriticWorker (verl/workers/fsdp_workers.py, v0.5.0; reference/
// verl-fsdp.md §3.8, §4.4) over Tessera's FSDP engine.
//
// Registered methods (the seed's dispatch modes):
//   init_model        ONE_TO_ALL        loads critic.model.path as a value model (an HF
//                                       *ForTokenClassification dir, or a *ForCausalLM dir whose
//                                       missing score head is initialised like HF's _init_weights,
//                                       seeded with the init config's seed), wraps it in FSDP
//                                       (critic.model.fsdp_config) with AdamW (critic.optim).
//   compute_values    DP_COMPUTE_PROTO  `values` [B, R] (times the response mask), micro-batched
//                                       by critic.forward_micro_batch_size_per_gpu or dynamically
//                                       by critic.forward_max_token_len_per_gpu; meta_info.metrics
//                                       timing_s/compute_values, perf/cpu_memory_used_gb.
//   update_critic     DP_COMPUTE_PROTO  DataParallelPPOCritic.update_critic, then one LR-scheduler
//                                       step; meta_info.metrics: verl's critic/* lists, critic/lr
//                                       (read after the step, as verl v0.5.0's CriticWorker does),
//                                       perf/cpu_memory_used_gb, timing_s/update_critic_worker.
//   save_checkpoint / load_checkpoint   ONE_TO_ALL, as ActorRolloutRefWorker's.
// Batch sizes are normalised at init_model (normalize_critic_config: ppo_mini_batch_size x
// rollout_n / dp, ...); bad combinations are refused naming keys and values. Param / optimizer
// offload (critic.model.fsdp_config) wraps every call in load -> compute -> offload.
//
// Init config: {"config": <verl critic subtree>, "seed": <int>, optional "comm_backend"}.
// Thread contract: one worker actor thread; every rank makes the same calls.
#pragma once

#include <memory>

#include <nlohmann/json.hpp>

#include "dispatch/worker_group.hpp"
#include "proto/data_proto.hpp"
#include "proto/status.hpp"
#include "workers/ppo/dp_critic.hpp"
#include "workers/ppo/fsdp_trainable.hpp"
#include "workers/models/config.hpp"
#include "workers/roles/worker_support.hpp"

namespace tessera::workers {

/// verl's CriticWorker. See the header comment.
class CriticWorker final : public dispatch::WorkerBase {
 public:
  /// A worker for `context`; registers the methods. Models are built by init_model().
  static Result<std::unique_ptr<CriticWorker>> create(const runtime::WorkerContext& context,
                                                      const nlohmann::json& init_config);

  Status init_model();
  Result<proto::DataProto> compute_values(const proto::DataProto& data);
  Result<proto::DataProto> update_critic(const proto::DataProto& data);
  Status save_checkpoint(const SaveCheckpointArgs& args);
  Status load_checkpoint(const LoadCheckpointArgs& args);

  /// After init_model (null before).
  ppo::FsdpTrainableModule* module() const { return module_.get(); }
  /// The normalised config (after init_model).
  const ppo::CriticConfig& config() const { return config_; }

 private:
  CriticWorker(runtime::WorkerContext context, nlohmann::json init_config);
  void register_methods();
  Status require_init(const char* method) const;

  nlohmann::json init_config_;
  ppo::CriticConfig config_;
  ModelSection model_;
  models::ModelConfig model_config_;
  std::shared_ptr<collective::Communicator> world_;
  std::shared_ptr<ppo::FsdpTrainableModule> module_;
  std::unique_ptr<ppo::DataParallelPPOCritic> critic_;
  CheckpointRotation rotation_;
};

}  // namespace tessera::workers
