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
// so it gives way to any thread with work; every poll loop (lanes, CallBatch::wait, the call
// channels' readers) stops polling altogether while such a thread keeps the CPU (Note [Polling
// under contention] below). idle_poll = 0 disables polling (always mailed).
//
// Note [Replies freed by their worker]
// An in-process reply is a DataProto the worker made (its TensorImpls, vectors, strings, all
// allocated on the worker's thread); the caller concatenates the replies where they lie (Note
// [Replies joined in place], dispatch/) and then drops them. Destroying eight of them cost the
// caller ~5k instructions per 8-rank call, on its serial path, on memory other cores wrote. So
// the worker keeps a reference to each reply it sends (hold()) and its poll loop, idle anyway,
// destroys the reply once its own reference is the last; the caller's part is one atomic
// decrement. Nothing is kept longer than it would be otherwise plus one poll period: poll()
// lets go of every reply it still holds when it returns, and a worker that does not poll never
// holds one. The price: a caller that decodes such a reply into a Value (any collect but the
// built-in concatenations) finds two references and copies the DataProto (tensors by
// reference) instead of moving it.
//
// Thread-safety: every member may be called from any thread; poll() and hold() from the
// worker's only.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

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
  /// Worker, while answering a call: keeps a reference to `reply`, an in-process result that
  /// the caller reads where it lies, so that this thread destroys it once the caller has let go
  /// (Note [Replies freed by their worker]). poll() lets go of each as soon as the caller has, and
  /// of all of them when it returns. REQUIRES: poll()'s thread.
  void hold(std::shared_ptr<const void> reply);
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
  std::vector<std::shared_ptr<const void>> held_;  // poll()'s thread only: hold()
};

/// Process-wide lane of each in-process worker actor, by address (registered by the worker
/// shell at spawn, removed when it terminates).
void register_lane(const caf::actor_addr& worker, std::shared_ptr<LocalLane> lane);
void unregister_lane(const caf::actor_addr& worker);
/// The lane of `worker`, or null (remote, not a worker, or terminated).
std::shared_ptr<LocalLane> find_lane(const caf::actor_addr& worker);

// Note [Polling under contention]
// Polling pays only while the polling threads are all the CPUs have to do. When a thread with
// real work shares the CPU (another worker's compute-bound method, a data loader, a build), a
// yield hands it the CPU until the scheduler takes it back, up to a tick (4 ms here), and a
// call handed to a poller meanwhile waits for it; a sleeping thread's futex wake-up instead
// preempts such work at once. Measured on the 2-vCPU machine with a niced 2-job compile
// running: in-process 8-worker round trip 925 us polling, 268 us with polling off.
// So every poll loop yields through poll_yield(), which times the yield. One that lasted longer
// than the stall threshold (2 ms) ends that loop's polling (back to its mailbox, condition
// variable or blocking read). A stall confirms contention when the same thread stalled less than
// 20 ms before: polling then stops process-wide for a backoff window: lanes go back to their
// mailboxes, waits to their condition variables, channel readers to blocking reads. The window
// is 10 ms, doubled (up to 1.28 s) each time a stall comes right after the previous window
// closed (the contention persists: that stall needs no confirming), back to 10 ms when
// contention returns after a pause; stalls while a window is open (one descheduling seen by
// several threads) do not lengthen it.
// Why a thread's second stall: CPU-bound work stalls a poller on every yield, so its second
// stall comes one call later (a few ms); the VM or a kernel thread taking the vCPUs a moment
// stalls every poller once, and windows opened on such lone stalls cost 10 ms of sleeping
// hand-offs each: unloaded, the 8-worker benchmark opened 4-17 per ~1.5 s and its round trip
// rose with them (33 us with none, 47 us at 4-6, 59 us at 17). With this rule: 0-7 lone stalls
// and 0-2 windows per such run (bench_runtime's lone_stalls and poll_stalls counters).
// The threshold comes from yield durations measured in the 8-worker benchmark (kernel 6.18,
// HZ=250): our own pollers alone, 99.9% under 128 us, with a few 2-8 ms stalls in a run
// (the VM or a kernel thread taking the vCPU); with two nice-10 CPU burners, every stall was
// 2-8 ms.

/// The steady clock in nanoseconds (the poll loops' clock).
int64_t steady_now_ns();
/// One yield of a poll loop. False once the loop should stop polling: this yield stalled (see
/// the Note), or a backoff window is open.
bool poll_yield();
/// False while a backoff window is open (checked before a poll loop starts).
bool polling_allowed();
/// Stalled yields that opened a backoff window in this process.
uint64_t poll_stalls();
/// Stalled yields that opened none (a thread's lone stall: Note [Polling under contention]).
uint64_t poll_lone_stalls();
/// The current window's doubling level (0: 10 ms).
int poll_backoff_level();
/// Closes any open backoff window, resets its level and forgets every thread's last stall
/// (benchmarks: a window opened under one benchmark's load would otherwise outlast it into the
/// next).
void end_poll_window();
/// Tests: sets the stall threshold, the first window's length, how soon a thread's second stall
/// confirms contention, and the clock (nanoseconds; null: steady_clock); then end_poll_window().
/// Defaults: 2 ms, 10 ms, 20 ms.
void set_poll_contention_for_testing(std::chrono::nanoseconds stall,
                                     std::chrono::nanoseconds backoff,
                                     std::chrono::nanoseconds confirm,
                                     int64_t (*clock)() = nullptr);

/// Polls `done` (yielding between looks) for at most `budget`; true once it returned true.
/// Stops early (false) when polling is off (Note [Polling under contention]).
bool poll_until(const std::function<bool()>& done, std::chrono::microseconds budget);

}  // namespace internal
}  // namespace tessera::runtime
