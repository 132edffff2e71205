// actor_system.hpp: the process's CAF actor system, configured from RuntimeConfig, with a
// shutdown that never hangs.
//
// Bootstrap (one place for it):
//   * the `tessera` type-ID block (runtime/messages.hpp) and the errc error category are
//     registered, so messages and errors cross nodes;
//   * scheduler.policy = sharing (half the small-message RTT of the default here);
//   * BASP heartbeats and a connection timeout catch silent partitions;
//   * the middleman (and CAF's openssl module when TLS is configured) is loaded on request.
//
// Shutdown (Note [Bounded shutdown]): caf::actor_system's destructor waits for every actor,
// forever. ActorSystem::shutdown() sends exit(user_shutdown) to every tracked actor, waits at
// most RuntimeConfig::shutdown_timeout for the running-actor count to reach zero, and if some
// actor is still busy (a worker stuck in a long LibTorch call) logs which count remained and
// leaks the caf::actor_system instead of destroying it, so the caller can exit.
//
// Thread-safety: track() and shutdown() may be called from any thread.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include "proto/status.hpp"
#include "runtime/config.hpp"

namespace tessera::runtime {

/// How the actor system is started.
struct ActorSystemOptions {
  bool network = false;  ///< Load the middleman (agents, or a driver with agents).
  bool testing = false;  ///< Deterministic test scheduler (caf::scheduler::test_coordinator).
};

/// Fills `cfg` from `config`: type IDs, error category, scheduler, middleman and TLS options.
/// Error (unimplemented) if TLS is requested without the network, (invalid_argument) if only
/// part of the TLS triple is given.
Status configure_actor_system(const RuntimeConfig& config, const ActorSystemOptions& options,
                              caf::actor_system_config& cfg);

/// Owns a caf::actor_system and stops it within a bounded time.
class ActorSystem {
 public:
  /// Starts a system. Errors come from configure_actor_system or CAF's module start-up.
  static Result<std::unique_ptr<ActorSystem>> start(const RuntimeConfig& config,
                                                    const ActorSystemOptions& options);
  ~ActorSystem();  ///< shutdown(), then destroys or (if actors remain) leaks the system.

  caf::actor_system& system() { return *system_; }
  const RuntimeConfig& config() const { return config_; }
  bool tls() const { return tls_; }

  /// Remembers an actor to send exit(user_shutdown) to at shutdown.
  void track(const caf::actor& actor);
  /// Stops every tracked actor and waits up to shutdown_timeout for all actors to end.
  /// Returns true if all ended. Idempotent.
  bool shutdown();

 private:
  ActorSystem() = default;

  RuntimeConfig config_;
  bool tls_ = false;
  bool testing_ = false;
  std::unique_ptr<caf::actor_system_config> cfg_;
  std::unique_ptr<caf::actor_system> system_;
  std::mutex mutex_;
  std::vector<caf::actor> tracked_;
  bool stopped_ = false;
  bool clean_ = true;
};

}  // namespace tessera::runtime
