// agent.hpp: the node agent actor: authenticates drivers, advertises devices, spawns worker
// actors by registered type name, monitors them and reports their deaths.
//
// The same actor serves the standalone `tessera agent` process (published on a port) and the
// embedded default (in the driver's process, unpublished), so both placements share one code
// path. Messages (all but the first two need an authenticated sender node, Note [Agent
// authentication] in runtime/auth.hpp; the embedded agent trusts its own node):
//   (hello_atom, string driver_nonce)       -> (string agent_nonce, string agent_proof)
//   (auth_atom, string proof, actor hub)    -> AgentInfo       hub receives WorkerDown reports;
//                                                              with the call-channel session
//   (info_atom)                             -> AgentInfo
//   (spawn_atom, SpawnRequest)              -> actor           after the worker built its roles
//   (rdzv_atom)                             -> uint16_t        a port free on this host now
// On exit (SIGTERM in the agent process, shutdown in the driver) it stops every hosted worker.
//
// Thread-safety: an actor; its state is touched by its behaviour only.
#pragma once

#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "runtime/config.hpp"
#include "runtime/data_plane.hpp"
#include "runtime/messages.hpp"
#include "runtime/worker.hpp"

namespace tessera::runtime {

namespace internal {
class ChannelServer;
}  // namespace internal

/// What an agent actor needs. REQUIRES: registry and data_plane outlive the actor.
struct AgentEnv {
  const WorkerTypeRegistry* registry = nullptr;
  DataPlane* data_plane = nullptr;
  std::vector<std::string> devices;  ///< Advertised devices ("cpu:0", ...).
  std::string host;                  ///< Host name advertised and given to workers.
  std::string token;                 ///< Shared secret; empty only with trust_local_only.
  bool trust_local_only = false;     ///< Embedded: accept this node, refuse every other.
  bool detached_workers = true;      ///< false only in deterministic tests.
  Millis spawn_timeout{120000};      ///< Bound on a worker's construction.
  uint64_t inline_payload_max_bytes = 64 * 1024;
  std::chrono::microseconds idle_poll{0};  ///< Hosted workers' polling (Note [Local lanes]).
  /// The process's call-channel server (Note [Call channel]), or null: none offered. The agent
  /// opens a session there for each authenticated driver and keeps its worker table.
  internal::ChannelServer* channel = nullptr;
};

/// Spawns an agent actor.
caf::actor spawn_agent_actor(caf::actor_system& system, AgentEnv env);


}  // namespace tessera::runtime
