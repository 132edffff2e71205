// worker_actor.hpp: the worker actor shell.
//
// One actor per device. It owns one plain Worker object per role (verl's colocated WorkerDict:
// actor + rollout + ref in one actor), built from the WorkerTypeRegistry on its own thread when
// it receives init_atom. Messages it answers:
//   (init_atom)              -> std::vector<MethodInfo>   builds the roles; error if any fails
//   (call_atom, CallRequest) -> CallReply                 resolves args, invokes, encodes result
//   (methods_atom)           -> std::vector<MethodInfo>
//   (context_atom)           -> WorkerContext
// Methods are named "{role}_{method}" when the role is not empty. Every exception a method or
// factory throws (c10::Error, std::exception, anything) is caught here, once, and returned as
// an error naming the rank, device, host and method. Nothing a method does can kill the actor.
//
// Thread-safety: the actor's behaviour runs on one thread at a time (its own when detached).
#pragma once

#include <chrono>
#include <cstdint>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "runtime/data_plane.hpp"
#include "runtime/messages.hpp"
#include "runtime/worker.hpp"

namespace tessera::runtime {

/// What a worker actor borrows from its host process. REQUIRES: both outlive the actor.
struct WorkerHostEnv {
  const WorkerTypeRegistry* registry = nullptr;
  DataPlane* data_plane = nullptr;
  uint64_t inline_payload_max_bytes = 64 * 1024;
  /// How long a detached worker polls for the next in-process call after answering one
  /// (Note [Local lanes] in local_lane.hpp); 0: it sleeps at once.
  std::chrono::microseconds idle_poll{0};
};

/// Spawns a worker actor for `request`; `detached` gives it its own thread (always, except in
/// deterministic tests). It builds nothing until init_atom.
caf::actor spawn_worker_actor(caf::actor_system& system, SpawnRequest request, WorkerHostEnv env,
                              bool detached);

/// "rank 3 (cpu:3 on host-a)" for error messages.
std::string describe_worker(const WorkerContext& context);

}  // namespace tessera::runtime
