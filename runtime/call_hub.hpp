// call_hub.hpp: how the driver calls worker actors, and the liveness rule that CAF lacks.
//
// Note [Call paths]
// * In-process workers (embedded placement; an agent's own workers) get a LocalCall: the
//   request plus a ReplySlot that the worker fills directly. No reply message, no router hop:
//   the caller thread sends, the worker thread answers into the CallBatch. If the worker dies
//   with the call still in its mailbox, CAF destroys the message and the slot's destructor
//   fails the call ("terminated before answering"), so nothing waits forever.
// * Remote workers are called through their agent: ONE call per agent carrying that agent's
//   ranks, registered in the hub's pending table, then sent from the caller's thread: over the
//   agent's call channel when it has one open (Note [Call channel] in
//   runtime/internal/call_channel.hpp), else as an AgentCall message on the hub's behalf. The
//   agent fans out with LocalCalls and the last worker to answer sends the reply (channel
//   frame, or message to the hub: no agent hop on the way back). The pending table is shared
//   by the callers, the channels' reader threads and the CallHub actor, which monitors every
//   agent and worker and on down_msg fails ALL pending calls to it at once, naming group,
//   rank, host and method (CAF 0.17 does not fail a request whose receiver died: it waits for
//   the timeout); a channel that ends does the same at once.
// * Every call has a finite deadline (RuntimeConfig::call_timeout unless given): remote ones
//   through the hub's own deadline sweep (Note [Hub deadlines] in call_hub.cpp), local ones
//   through CallBatch::wait's deadline.
// Calls to a worker already known dead fail at once.
//
// Note [Late replies]
// A worker that is alive but hung keeps a call it will answer late, or never. When the call's
// deadline passes, everything the CALLER holds for it is released at once: the hub's pending
// entry (which owns the request and its inline arguments) and, once the caller lets go, the
// CallBatch (a ReplySlot holds it weakly; the hub sends AgentCalls as plain messages matched by
// call id, so no CAF response handler stays registered). What the hung worker holds (its
// mailbox entry, its arguments) lives until it returns. Its late answer is dropped: counted
// in call_counters(), and every payload it published for the caller is released at its owner
// (locally by the worker actor; by the agent on the hub's release message for remote ones).
//
// Note [Failing fast]
// The ranks of one call usually meet in collectives, so when one fails the others wait for a
// peer that will never come: for Gloo's timeout (minutes), or for ever behind a dead process.
// Nothing the caller could do with their answers either: every user of a batch turns one
// failure into the call's failure (first_error). So the first failure (any error but
// cancelled) ends the batch at once: every target still unanswered gets cancelled, naming the
// target that failed, and the caller sees the real error within the time it took to arrive
// (a dead agent: the connection timeout; a rank's own error: at once), not at the deadline.
// The cancelled targets' late answers are dropped and their payloads released like any late
// answer (Note [Late replies]). An agent's fan-out batch does the same, so its reply comes
// back as soon as one of its ranks failed.
//
// Thread-safety: CallHub::call() and the watch functions may be called from any thread;
// CallBatch::set() from any thread; wait() by the thread that collects the results.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/allowed_unsafe_message_type.hpp>

#include "proto/status.hpp"
#include "runtime/config.hpp"
#include "runtime/messages.hpp"

namespace tessera::runtime {

namespace internal {
struct HubShared;
}  // namespace internal

/// A worker actor and who it is (for error messages and placement).
struct WorkerRef {
  caf::actor actor;
  WorkerContext context;
  bool local = true;  ///< Lives in this process (embedded placement).
  caf::actor agent;   ///< The agent hosting it (remote workers are called through it).
  /// worker_label(context), made once and shared by the calls' labels (Note [Call labels]);
  /// null: made per call.
  std::shared_ptr<const std::string> label;
};

// Note [Call labels]
// Every target of every call has a label that names it in errors ("rank 1 (cpu:1 on h) of group
// 'g': method 'm'"), but only errors read one. Formatting them eagerly, 8 strings per 8-rank
// call, was ~8% of the instructions of an in-process DP call at the caller (callgrind). So a
// batch keeps the parts: each target's worker part (shared with its WorkerRef, made once per
// worker) and the method (once when every target calls the same one), and joins them on demand.
class CallLabels {
 public:
  CallLabels() = default;
  /// Whole labels, one per target.
  explicit CallLabels(std::vector<std::string> whole);
  /// Appends a target: `worker` (worker_label) calling `method`.
  void add(std::shared_ptr<const std::string> worker, const std::string& method);
  void reserve(size_t targets) { workers_.reserve(targets); }
  size_t size() const { return workers_.size(); }
  std::string operator[](size_t i) const;

 private:
  std::vector<std::shared_ptr<const std::string>> workers_;  // a whole label when no method
  std::vector<std::string> methods_;  // empty: whole labels; one entry: every target's method
};

/// The replies of one call to several ranks; complete when every rank replied or failed.
class CallBatch {
 public:
  /// `labels[i]` names target i in errors (Note [Call labels]).
  /// wait() polls for `idle_poll` before it sleeps (Note [Local lanes] in local_lane.hpp).
  CallBatch(CallLabels labels, std::chrono::steady_clock::time_point deadline,
            std::chrono::microseconds idle_poll = std::chrono::microseconds(0));
  ~CallBatch();
  CallBatch(const CallBatch&) = delete;
  CallBatch& operator=(const CallBatch&) = delete;

  /// Blocks until complete or the deadline; targets still unanswered then fail with timeout.
  /// Results are in target order.
  std::vector<Result<WireValue>> wait();
  /// True once every target replied or failed.
  bool ready() const;
  /// Records target i's outcome; later outcomes for i are ignored (returns false for them).
  /// With `fail_fast`, a failure (other than cancelled) then cancels every target still
  /// unanswered (Note [Failing fast]); code that fails several targets at once passes false
  /// and calls cancel_unanswered() after the last.
  bool set(size_t i, Result<WireValue> result, bool fail_fast = true);
  /// Cancels every target still unanswered, naming target `failed` as the cause.
  void cancel_unanswered(size_t failed);
  /// Runs `f` (on the completing thread) once every target has an outcome; at once if done.
  void on_complete(std::function<void()> f);
  size_t size() const { return labels_.size(); }
  std::string label(size_t i) const { return labels_[i]; }

 private:
  // Note [Lock-free outcomes]: set() claims its target's slot with one atomic exchange and
  // counts it in done_; only the last outcome takes mutex_ (to wake a sleeping wait() and take
  // on_complete_). So ranks answering at once do not queue on a lock, and a polling wait()
  // reads done_ alone.
  struct Slot {
    std::atomic<bool> claimed{false};        // the first set() for this target takes it
    std::optional<Result<WireValue>> value;  // written by that set(), read once done_ counts it
  };
  mutable std::mutex mutex_;  // cv_, on_complete_
  std::condition_variable cv_;
  CallLabels labels_;
  std::chrono::steady_clock::time_point deadline_;
  std::chrono::microseconds idle_poll_;
  std::vector<Slot> slots_;
  std::atomic<size_t> done_{0};  // outcomes written (a release per set(), acquired by readers)
  std::function<void()> on_complete_;
};

/// Target `index` of a CallBatch, filled by an in-process worker. Fails the target with
/// unavailable if destroyed unfilled (the worker died with the call in its mailbox). Holds the
/// batch weakly: a caller that gave up (deadline) frees it (Note [Late replies]).
class ReplySlot {
 public:
  ReplySlot(const std::shared_ptr<CallBatch>& batch, size_t index) : batch_(batch), index_(index) {}
  ReplySlot(const ReplySlot&) = delete;
  ~ReplySlot();
  /// Delivers the outcome (first call wins). False if it came too late: the target already
  /// had an outcome (timeout) or the caller is gone; the caller then owns nothing of it.
  bool set(Result<WireValue> result);

 private:
  std::weak_ptr<CallBatch> batch_;
  size_t index_;
  std::atomic<bool> done_{false};
};

/// A call to an in-process worker (Note [Call paths]); a local-only message.
struct LocalCall {
  LocalCall(CallRequest&& r, bool remote, const std::shared_ptr<CallBatch>& batch, size_t index)
      : request(std::move(r)), caller_remote(remote), slot(batch, index) {}
  CallRequest request;
  bool caller_remote = false;  ///< The result goes to another process (inline small ones).
  ReplySlot slot;  ///< Fails its target when the call is dropped unanswered.
};

/// Process-wide bookkeeping of calls (Note [Late replies]); tests check that nothing leaks.
struct CallCounters {
  uint64_t live_batches = 0;            ///< CallBatch objects alive in this process.
  uint64_t late_replies_dropped = 0;    ///< Outcomes that arrived after their call had ended.
  uint64_t late_payloads_released = 0;  ///< Payloads of those outcomes released at their owner.
  uint64_t lane_calls = 0;  ///< Calls handed to a polling worker (Note [Local lanes]).
  uint64_t channel_calls = 0;  ///< Agent calls sent over a call channel (Note [Call channel]).
};

/// Current counters of this process.
CallCounters call_counters();
/// Counts one dropped late outcome whose `payloads` payloads are being released.
void count_late_reply(uint64_t payloads);

/// "rank 3 (cpu:3 on host) of group 'g'".
std::string worker_label(const WorkerContext& context);
/// "rank 3 (cpu:3 on host) of group 'g': method 'm'".
std::string call_label(const WorkerContext& context, const std::string& method);

/// Sends `request` to the in-process `worker` as a LocalCall answering target `index` of
/// `batch` (failed at once if `worker` is invalid or already gone).
/// REQUIRES: index < batch->size().
void send_local_call(const caf::actor& worker, CallRequest&& request, bool caller_remote,
                     const std::shared_ptr<CallBatch>& batch, size_t index);

/// The driver-side call router (one per process).
class CallHub {
 public:
  /// Spawns the hub actor (scheduled: it never blocks). Callers' waits poll for `idle_poll`
  /// before sleeping (Note [Local lanes]).
  CallHub(caf::actor_system& system, Millis default_timeout,
          std::chrono::microseconds idle_poll = std::chrono::microseconds(0));
  ~CallHub();  ///< Stops the hub; pending remote calls fail with unavailable.

  /// Sends requests[i] to targets[i], all in parallel; `timeout` 0 means the default.
  /// REQUIRES: targets.size() == requests.size().
  std::shared_ptr<CallBatch> call(const std::vector<WorkerRef>& targets,
                                  std::vector<CallRequest> requests, Millis timeout = Millis(0));
  /// Monitors a worker from the moment it exists, so a death before its first call is known.
  void watch_worker(const WorkerRef& worker);
  /// Monitors an agent; its death fails every pending call sent through it.
  void watch_agent(const caf::actor& agent, const std::string& address);
  /// The hub actor (agents send it down_atom reports).
  const caf::actor& actor() const { return hub_; }
  /// Opens the agent's call channel (Note [Call channel] in runtime/internal/call_channel.hpp)
  /// at host:port (or first at the abstract Unix socket `local_socket` when not empty: Note
  /// [Local call socket]) with the session the agent gave at authentication; from then on
  /// calls to that agent's workers go through it while it is open, through CAF otherwise.
  /// REQUIRES: watch_agent(agent) before. Errors name the address and the step that failed.
  /// `address` names the agent in errors (its cluster.agents entry).
  Status open_channel(const caf::actor& agent, const std::string& address,
                      const std::string& host, uint16_t port, const std::string& local_socket,
                      uint64_t session, const std::string& key, Millis timeout,
                      uint64_t max_frame_bytes);
  /// "local socket", "TCP", or "" when calls to `agent`'s workers go through CAF (logs).
  std::string channel_transport(const caf::actor& agent) const;
  /// True while calls to `agent`'s workers go through its call channel.
  bool channel_open(const caf::actor& agent) const;
  /// Remote calls (one per agent per call()) awaiting their agent's answer.
  uint64_t pending_calls() const;
  /// Returns once the hub actor has handled every message it received before (its deadline
  /// sweeps and replies included). Error: timeout, or the hub is gone.
  Status flush(Millis timeout);

 private:
  caf::actor hub_;
  std::shared_ptr<internal::HubShared> shared_;
  Millis default_timeout_;
  std::chrono::microseconds idle_poll_;
};

}  // namespace tessera::runtime

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<tessera::runtime::LocalCall>)
