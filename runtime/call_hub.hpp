// call_hub.hpp: the driver's table of pending calls, and the liveness rule that CAF lacks.
//
// CAF 0.17 does not fail a request whose receiver died: it waits for its timeout. So every
// call goes through one CallHub actor that
//   * keeps a pending-call table per target actor,
//   * monitors every target (and every agent it is told about), and on down_msg fails ALL the
//     pending calls of that target at once with an error naming the group, rank, host and
//     method ("rank 1 (cpu:1 on node-b) of group 'actor' died during 'update_actor': ..."),
//   * fails later calls to a dead target immediately,
//   * gives every request a finite timeout (default RuntimeConfig::call_timeout).
// Agents also report the workers they host that terminate (down_atom, WorkerDown).
//
// Thread-safety: call() and watch_agent() may be called from any thread; CallBatch::wait()
// from the thread that waits for the results.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "proto/status.hpp"
#include "runtime/config.hpp"
#include "runtime/messages.hpp"

namespace tessera::runtime {

/// A worker actor and who it is (for error messages and placement).
struct WorkerRef {
  caf::actor actor;
  WorkerContext context;
  bool local = true;  ///< Lives in this process (embedded placement).
};

/// The replies of one call to several ranks; complete when every rank replied or failed.
class CallBatch {
 public:
  explicit CallBatch(size_t n) : results_(n) {}

  /// Blocks until complete. Results are in target order.
  std::vector<Result<WireValue>> wait();
  /// True once every rank replied or failed.
  bool ready() const;
  /// Records rank i's outcome; later outcomes for i are ignored. (Hub side.)
  void set(size_t i, Result<WireValue> result);
  /// Number of targets.
  size_t size() const { return results_.size(); }

 private:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::optional<Result<WireValue>>> results_;
  size_t done_ = 0;
};

/// The driver-side call router (one per process).
class CallHub {
 public:
  /// Spawns the hub actor (scheduled: it never blocks).
  CallHub(caf::actor_system& system, Millis default_timeout);
  ~CallHub();  ///< Stops the hub; pending batches fail with unavailable.

  /// Sends requests[i] to targets[i], all in parallel; `timeout` 0 means the default.
  /// REQUIRES: targets.size() == requests.size().
  std::shared_ptr<CallBatch> call(const std::vector<WorkerRef>& targets,
                                  std::vector<CallRequest> requests, Millis timeout = Millis(0));
  /// Monitors a worker from the moment it exists, so a death before its first call is known.
  void watch_worker(const WorkerRef& worker);
  /// Monitors an agent; its death is logged and its workers' pending calls fail.
  void watch_agent(const caf::actor& agent, const std::string& address);
  /// The hub actor (agents send it down_atom reports).
  const caf::actor& actor() const { return hub_; }

 private:
  caf::actor hub_;
  Millis default_timeout_;
};

}  // namespace tessera::runtime
