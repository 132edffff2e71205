// local_lane.hpp: a polling hand-off for calls to an in-process worker (private to runtime/).
//
// Note [Local lanes]
// A detached CAF actor sleeps on a condition variable between messages, so every call to an
// idle worker costs a futex wake-up, and on a virtual machine a wake-up of a sleeping thread
// is an inter-processor interrupt: measured here ~30 us one way, ~60 us for a ping-pong (see
// bench_runtime). Eight workers make a DP call's round trip 100-200 us of wake-ups alone.
// So after a worker actor answers a call it keeps its thread awake for a short while
// (RuntimeConfig::idle_poll), polling its lane, a queue beside its mailbox, yielding the CPU
// between looks. A caller that finds the worker polling puts the call on the lane (no system
// call at all); otherwise it mails the call through CAF as before, which wakes the thread.
// The caller's CallBatch::wait polls the same way before it sleeps.
//
// Order: calls from one caller reach the worker in the order sent. The lane counts calls mailed
// but not yet taken from the mailbox, and the worker only polls when that count is zero, so a
// lane call can never overtake a mailed one; every lane call is taken before the worker goes
// back to its mailbox (the switch happens under the lane's mutex).
// Liveness: the worker polls only inside its call handler, so other messages (exit, methods,
// init) wait at most one idle_poll period. A lane closed by its terminating worker refuses
// calls (they are mailed, and CAF drops them, failing their ReplySlot) and destroys the calls
// it still held, which fails them the same way ("terminated before answering").
// Cost: an idle worker burns at most idle_poll of CPU after each call, mostly in sched_yield,
// so it gives way to any thread with work. idle_poll = 0 disables polling (always mailed).
//
// Thread-safety: every member may be called from any thread; poll() from the worker's only.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>

#include <caf/actor_addr.hpp>

namespace tessera::runtime {

struct LocalCall;

namespace internal {

class LocalLane {
 public:
  explicit LocalLane(std::chrono::microseconds idle_poll) : idle_poll_(idle_poll) {}
  LocalLane(const LocalLane&) = delete;
  LocalLane& operator=(const LocalLane&) = delete;

  /// Caller: queues `call` if the worker is polling (and returns true). Otherwise counts it as
  /// mailed and returns false: the caller must then mail it.
  bool try_hand_off(std::shared_ptr<LocalCall>& call);
  /// Worker: a mailed call was taken from the mailbox.
  void took_mailed();
  /// Worker, after answering a call: runs `handle` on lane calls until idle_poll passes with
  /// none, then returns (the worker goes back to its mailbox). Returns at once when calls are
  /// still in the mailbox or polling is disabled.
  void poll(const std::function<void(LocalCall&)>& handle);
  /// Worker, terminating: refuses further calls; destroys (so fails) the ones still queued.
  void close();
  /// True while the worker polls (calls handed off now skip the mailbox).
  bool polling() const;

 private:
  const std::chrono::microseconds idle_poll_;
  mutable std::mutex mutex_;
  std::deque<std::shared_ptr<LocalCall>> queue_;
  std::atomic<size_t> queued_{0};  // queue_.size(), read without the lock while polling
  size_t mailed_ = 0;              // mailed, not yet taken
  bool polling_ = false;
  std::atomic<bool> closed_{false};  // written under mutex_, polled without it
};

/// Process-wide lane of each in-process worker actor, by address (registered by the worker
/// shell at spawn, removed when it terminates).
void register_lane(const caf::actor_addr& worker, std::shared_ptr<LocalLane> lane);
void unregister_lane(const caf::actor_addr& worker);
/// The lane of `worker`, or null (remote, not a worker, or terminated).
std::shared_ptr<LocalLane> find_lane(const caf::actor_addr& worker);

/// Polls `done` (yielding between looks) for at most `budget`; true once it returned true.
bool poll_until(const std::function<bool()>& done, std::chrono::microseconds budget);

}  // namespace internal
}  // namespace tessera::runtime
