// runtime.hpp: the driver's entry point to the distributed runtime.
//
// A Runtime owns this process's actor system, data plane and call hub, and the nodes it may
// place workers on: the agents of RuntimeConfig::agents (connected and authenticated at
// start), or, with none configured, one embedded agent inside this process (the same agent
// actor, unpublished), so the embedded default and a cluster run the same code path.
//
//   auto rt = Runtime::start(config, registry);                  // connect + authenticate
//   auto pool = rt->resource_pool();                              // ranks sorted by host, device
//   auto workers = rt->spawn_workers("actor", *pool, {{"", "echo", "{}"}});
//   auto out = rt->call(*workers, "double_it", args_per_rank);    // blocking, per-rank Values
//
// dispatch/ builds WorkerGroups (split / collect per dispatch mode, futures) on top of
// spawn_workers, encode_args and call_wire.
//
// Thread-safety: every method may be called from any thread; shutdown() once.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "proto/status.hpp"
#include "runtime/actor_system.hpp"
#include "runtime/call_hub.hpp"
#include "runtime/config.hpp"
#include "runtime/data_plane.hpp"
#include "runtime/messages.hpp"
#include "runtime/resource_pool.hpp"
#include "runtime/value.hpp"
#include "runtime/worker.hpp"

namespace tessera::runtime {

/// A node the runtime can place workers on.
struct Node {
  caf::actor agent;
  AgentInfo info;
  std::string address;  ///< "host:port" of the agent, or "embedded".
  bool local = false;   ///< The embedded agent (workers live in this process).
};

/// Options of one call.
struct CallOptions {
  Millis timeout{0};          ///< 0: RuntimeConfig::call_timeout.
  bool keep_results = false;  ///< Results stay at the workers until released (futures).
};

/// The driver-side runtime.
class Runtime {
 public:
  /// Starts the actor system and data plane, then connects to and authenticates every agent
  /// (or starts the embedded one). Errors name the agent address and what failed.
  /// REQUIRES: `registry` outlives the Runtime (the embedded agent builds workers from it).
  static Result<std::unique_ptr<Runtime>> start(const RuntimeConfig& config,
                                                const WorkerTypeRegistry& registry);
  ~Runtime();  ///< shutdown().

  const RuntimeConfig& config() const { return config_; }
  caf::actor_system& system() { return actors_->system(); }
  DataPlane& data_plane() { return *data_plane_; }
  CallHub& hub() { return *hub_; }
  const std::vector<Node>& nodes() const { return nodes_; }

  /// A pool over the nodes' devices (verl's process_on_nodes: per-node counts, sorted order).
  Result<ResourcePool> resource_pool(const std::vector<int>& process_on_nodes = {}) const;

  /// Spawns one worker actor per rank of `pool`, each hosting `roles` (several roles share the
  /// actor: verl's colocated worker). Every rank learns rank, world size, local rank and the
  /// group's rendezvous (rank 0's host and a port free there). All ranks are built in parallel;
  /// on any error the others are stopped and the error names the rank and node.
  Result<std::vector<WorkerRef>> spawn_workers(const std::string& group, const ResourcePool& pool,
                                               const std::vector<RoleSpec>& roles);

  /// The methods a worker serves, with their attributes.
  Result<std::vector<MethodInfo>> methods(const WorkerRef& worker);

  /// Encodes one rank's arguments; every payload published is appended to `published` so the
  /// caller can release leftovers once the call is over (release_all).
  Result<std::vector<WireValue>> encode_args(const WorkerRef& worker, const std::vector<Value>& args,
                                             std::vector<PayloadHandle>& published);
  /// Sends requests[i] to workers[i] in parallel; the batch completes when all answered.
  std::shared_ptr<CallBatch> call_wire(const std::vector<WorkerRef>& workers,
                                       std::vector<CallRequest> requests,
                                       const CallOptions& options = {});
  /// Releases payloads (here or at their owners); already-consumed ones are skipped.
  void release_all(const std::vector<PayloadHandle>& handles);

  /// Blocking call: args_per_rank[i] to workers[i], returns each rank's result in rank order.
  /// If ranks fail, the error is the lowest failing rank's, plus how many others failed.
  Result<std::vector<Value>> call(const std::vector<WorkerRef>& workers, const std::string& method,
                                  const std::vector<std::vector<Value>>& args_per_rank,
                                  const CallOptions& options = {});

  /// Stops every worker this runtime spawned and closes the actor system, within
  /// RuntimeConfig::shutdown_timeout (Note [Bounded shutdown]). Idempotent.
  void shutdown();

 private:
  Runtime() = default;
  Status start_embedded(const WorkerTypeRegistry& registry);
  Status connect_agents();
  void open_call_channel(const caf::actor& agent, const std::string& address,
                         const std::string& host, const AgentInfo& info);
  Result<uint16_t> rendezvous_port(const Node& node);

  RuntimeConfig config_;
  std::unique_ptr<ActorSystem> actors_;
  std::unique_ptr<DataPlane> data_plane_;
  std::unique_ptr<CallHub> hub_;
  std::vector<Node> nodes_;
  std::mutex mutex_;
  std::vector<caf::actor> spawned_;
  bool shut_down_ = false;
};

/// Collapses per-rank results: the values, or the lowest rank's real error (cancelled ranks only
/// when nothing else failed, Note [Failing fast]) plus counts.
Result<std::vector<WireValue>> first_error(std::vector<Result<WireValue>> results);

}  // namespace tessera::runtime
