// registry.hpp: the one entry point through which the driver and the app get Tessera's FSDP
// worker classes: register_worker_types() adds them to a runtime worker-type registry.
//
// Worker type names and the init config each rank's factory receives (the CONTRACT the driver
// codes against):
//   "actor_rollout_ref"  ActorRolloutRefWorker  {"role": "actor"|"rollout"|"ref"|"actor_rollout"|
//                        "actor_rollout_ref", "config": <verl actor_rollout_ref subtree: model.*,
//                        actor.*, rollout.*, ref.*>, "seed": <int>, optional "chat_template_kwargs":
//                        <data.apply_chat_template_kwargs, for the multi-turn rollout's prompts>}
//   "critic"             CriticWorker           {"config": <verl critic subtree>, "seed": <int>}
//   "reward_model"       RewardModelWorker      {"config": <verl reward_model subtree>}
// Every init config may also carry "comm_backend": "gloo" | "inproc" | "nccl" (Tessera
// extension; default nccl on cuda devices, else gloo) for the collectives of the group.
// Methods, their dispatch modes and DataProto fields are verl's (see each worker's header).
// Two things the driver must know (verl's trainer does the same):
//   * every data method's output carries meta_info["metrics"] (timing_s/<method>,
//     perf/cpu_memory_used_gb; generate_sequences also timing_s/reshard and
//     timing_s/generate_sequences), one value per rank after collection; the driver pops it
//     before union-ing the output into its batch (verl pops meta_info["timing"]).
//   * generate_sequences returns old_log_probs already (the seed's recompute; skipped when the
//     prompts' meta_info.recompute_log_prob is false).
//   * update_actor / update_critic return a row-less DataProto whose meta_info["metrics"] maps
//     verl's metric names to lists (one entry per rank after collection) or scalars.
//
// Thread-safety: call before the runtime starts (the registry is read-only afterwards).
#pragma once

#include "proto/status.hpp"
#include "runtime/worker.hpp"

namespace tessera::workers {

/// Worker type names.
inline constexpr const char* kActorRolloutRefWorkerType = "actor_rollout_ref";
inline constexpr const char* kCriticWorkerType = "critic";
inline constexpr const char* kRewardModelWorkerType = "reward_model";

/// Registers "actor_rollout_ref", "critic" and "reward_model". Error if a name is taken.
Status register_worker_types(runtime::WorkerTypeRegistry& registry);

}  // namespace tessera::workers
