// runtime_config.hpp: the runtime a trainer config asks for, shared by the PPO and SFT trainers.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

#include "proto/status.hpp"
#include "runtime/config.hpp"

namespace tessera::driver {

/// The runtime of a trainer config: the agents of cluster.agents (token from cluster.token_file),
/// or the embedded devices "cpu:N" / "cuda:0-(N-1)" for trainer.device with N =
/// trainer.n_gpus_per_node plus the split rollout's devices (embedded runs need trainer.nnodes
/// == 1). Errors name the key.
Result<runtime::RuntimeConfig> trainer_runtime_config(const nlohmann::json& cfg);

/// The devices per node the split rollout takes after the trainer's
/// (actor_rollout_ref.rollout.engine_kwargs.tessera.placement=split), or 0 when colocated.
Result<int64_t> split_rollout_devices(const nlohmann::json& cfg);

}  // namespace tessera::driver
