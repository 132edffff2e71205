// worker_types.hpp: the table of every worker class Tessera ships, by type name. The agent and
// the embedded driver use the same table, so a group spawns the same way in either mode.
#pragma once

#include "runtime/worker.hpp"

namespace tessera::app {

/// Every worker type ("actor_rollout_ref", "critic", "reward_model", "sft"), registered on first
/// use. A registration failure (a duplicate name) is a programming error: it aborts with the
/// message at start-up, never mid-run.
const runtime::WorkerTypeRegistry& worker_types();

}  // namespace tessera::app
