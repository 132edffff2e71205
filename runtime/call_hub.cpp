// call_hub.cpp: Note [Call paths].
#include "runtime/call_hub.hpp"

#include <algorithm>
#include <unordered_map>

#include <caf/actor_clock.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "runtime/errors.hpp"
#include "runtime/local_lane.hpp"
#include "runtime/wire.hpp"
#include "runtime/worker_actor.hpp"

namespace tessera::runtime::internal {

/// The calls of one CallHub::call() bound for one agent (a local message to the hub).
struct RemoteJob {
  caf::actor agent;
  uint64_t id = 0;              // call id, unique per CallHub
  AgentCall call;               // sent by the caller, empty once registered
  std::vector<size_t> indices;  // into batch
  Millis timeout;
  caf::actor_clock::time_point deadline;  // set by the hub when it registers the call
  std::shared_ptr<CallBatch> batch;
};

}  // namespace tessera::runtime::internal

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<tessera::runtime::internal::RemoteJob>)

namespace tessera::runtime {

// ---- counters, CallBatch, ReplySlot ------------------------------------------------------------

namespace {

std::atomic<uint64_t> live_batches{0};
std::atomic<uint64_t> late_replies{0};
std::atomic<uint64_t> late_payloads{0};
std::atomic<uint64_t> lane_calls{0};

}  // namespace

CallCounters call_counters() {
  return CallCounters{live_batches.load(), late_replies.load(), late_payloads.load(),
                      lane_calls.load()};
}

void count_late_reply(uint64_t payloads) {
  late_replies.fetch_add(1);
  late_payloads.fetch_add(payloads);
}

CallBatch::CallBatch(std::vector<std::string> labels,
                     std::chrono::steady_clock::time_point deadline,
                     std::chrono::microseconds idle_poll)
    : labels_(std::move(labels)), deadline_(deadline), idle_poll_(idle_poll),
      results_(labels_.size()) {
  live_batches.fetch_add(1);
}

CallBatch::~CallBatch() { live_batches.fetch_sub(1); }

std::vector<Result<WireValue>> CallBatch::wait() {
  auto complete = [&] { return done_.load(std::memory_order_acquire) == results_.size(); };
  (void)internal::poll_until(complete, idle_poll_);  // Note [Local lanes]
  std::unique_lock<std::mutex> lock(mutex_);
  if (deadline_ == std::chrono::steady_clock::time_point::max()) {
    cv_.wait(lock, complete);  // wait_until(max) can overflow into "timed out" at once
  } else if (!cv_.wait_until(lock, deadline_, complete)) {
    lock.unlock();
    for (size_t i = 0; i < results_.size(); ++i) {
      set(i, make_error(ErrorCode::timeout, "{}: no answer before the call's deadline",
                        labels_[i]));
    }
    lock.lock();
  }
  std::vector<Result<WireValue>> out;
  out.reserve(results_.size());
  for (auto& r : results_) out.push_back(std::move(*r));
  return out;
}

bool CallBatch::ready() const {
  return done_.load(std::memory_order_acquire) == results_.size();
}

bool CallBatch::set(size_t i, Result<WireValue> result) {
  std::function<void()> callback;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (results_[i].has_value()) return false;
    results_[i] = std::move(result);
    if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 < results_.size()) return true;
    callback = std::move(on_complete_);
    cv_.notify_all();
  }
  if (callback) callback();
  return true;
}

void CallBatch::on_complete(std::function<void()> f) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_ < results_.size()) {
      on_complete_ = std::move(f);
      return;
    }
  }
  f();
}

ReplySlot::~ReplySlot() {
  if (done_) return;
  if (std::shared_ptr<CallBatch> batch = batch_.lock()) {
    batch->set(index_, make_error(ErrorCode::unavailable, "{}: the worker terminated before "
                                  "answering", batch->label(index_)));
  }
}

bool ReplySlot::set(Result<WireValue> result) {
  if (done_.exchange(true)) return false;
  std::shared_ptr<CallBatch> batch = batch_.lock();
  return batch && batch->set(index_, std::move(result));
}

// Built for every target of every call (errors only read it): plain appends, no formatting.
std::string call_label(const WorkerContext& c, const std::string& method) {
  std::string out;
  out.reserve(48 + c.device.size() + c.host.size() + c.group.size() + method.size());
  out.append("rank ").append(std::to_string(c.rank)).append(" (").append(c.device);
  out.append(" on ").append(c.host).append(") of group '").append(c.group);
  out.append("': method '").append(method).append("'");
  return out;
}

// A message to a terminated actor is dropped (and destroyed): the slot's destructor then fails
// the target, as it does for an invalid handle, whose LocalCall is destroyed right here.
void send_local_call(const caf::actor& worker, CallRequest request, bool caller_remote,
                     const std::shared_ptr<CallBatch>& batch, size_t index) {
  auto call = std::make_shared<LocalCall>();
  call->request = std::move(request);
  call->caller_remote = caller_remote;
  call->slot = std::make_shared<ReplySlot>(batch, index);
  if (std::shared_ptr<internal::LocalLane> lane = internal::find_lane(worker.address())) {
    if (lane->try_hand_off(call)) {  // Note [Local lanes]: the worker is polling
      lane_calls.fetch_add(1, std::memory_order_relaxed);
      return;
    }
  }
  caf::anon_send(worker, call_atom::value, std::move(call));
}

// ---- the hub actor (remote calls) --------------------------------------------------------------

namespace {

// Note [Hub deadlines]: CAF 0.17 keeps a request's timeout in its clock until it fires, even
// after the reply came (measured: ~180 B per request retained; at call_timeout = 600 s that is
// memory growing with the call rate). So the hub sends with an infinite CAF timeout and
// enforces deadlines itself: one tick every kTick while calls are pending fails the expired.
using tick_atom = caf::atom_constant<caf::atom("ts_tick")>;
constexpr Millis kTick{100};

using Job = std::shared_ptr<internal::RemoteJob>;
using DeadMap = std::unordered_map<caf::actor_addr, std::string>;

struct HubState {
  std::unordered_map<caf::actor_addr, std::unordered_map<uint64_t, Job>> pending;  // by agent
  std::unordered_map<caf::actor_addr, std::string> agents;  // agent -> address
  std::unordered_map<caf::actor_addr, std::string> dead_agents;  // agent -> why
  std::unordered_map<caf::actor_addr, WorkerContext> workers;
  std::shared_ptr<std::mutex> dead_mutex;
  std::shared_ptr<DeadMap> dead;
  std::shared_ptr<std::atomic<uint64_t>> pending_count;  // CallHub::pending_calls()
  bool ticking = false;
  static inline const char* name = "tessera.call_hub";

  HubState() = default;
  HubState(const HubState&) = delete;
  // The hub stopped (runtime shutdown): nobody will answer the calls still pending.
  ~HubState() {
    for (auto& [agent, jobs] : pending) {
      for (auto& [id, job] : jobs) fail_job(*job, "the runtime shut down while it was pending");
    }
    if (pending_count) *pending_count = 0;
  }

  // Recounts the pending calls (after the table changed).
  void recount() {
    uint64_t n = 0;
    for (auto& [agent, jobs] : pending) n += jobs.size();
    *pending_count = n;
  }

  static void fail_job(internal::RemoteJob& job, const std::string& why,
                       ErrorCode code = ErrorCode::unavailable) {
    for (size_t i : job.indices) {
      job.batch->set(i, make_error(code, "{}: {}", job.batch->label(i), why));
    }
  }
};

using Hub = caf::stateful_actor<HubState>*;

// An agent's error for target i, naming rank, host and method (workers' own errors already do).
Status agent_error(const CallBatch& batch, size_t i, ErrorCode code, const std::string& message) {
  bool liveness = code == ErrorCode::timeout || code == ErrorCode::unavailable;
  if (!liveness || message.find(batch.label(i)) != std::string::npos) return Status(code, message);
  return Status(code, batch.label(i) + ": " + message);
}

// The reply comes from another process: its three columns are checked before any is read.
void deliver(internal::RemoteJob& job, AgentCallReply& reply) {
  size_t n = job.indices.size();
  if (reply.codes.size() != n || reply.messages.size() != n || reply.results.size() != n) {
    return HubState::fail_job(job, fmt::format("malformed reply from the agent ({}/{}/{} "
                                               "answers for {} calls)", reply.codes.size(),
                                               reply.messages.size(), reply.results.size(), n),
                              ErrorCode::corrupt_data);
  }
  for (size_t k = 0; k < n; ++k) {
    size_t i = job.indices[k];
    uint8_t code = reply.codes[k];
    if (code == 0) {
      job.batch->set(i, std::move(reply.results[k]));
    } else if (code > static_cast<uint8_t>(ErrorCode::internal)) {
      job.batch->set(i, make_error(ErrorCode::corrupt_data, "{}: the agent answered with "
                                   "unknown error code {}", job.batch->label(i), code));
    } else {
      job.batch->set(i, agent_error(*job.batch, i, static_cast<ErrorCode>(code), reply.messages[k]));
    }
  }
}

// Takes call `id` to `agent` out of the pending table; null if it already ended (deadline,
// agent death) or never existed.
Job take_pending(Hub self, const caf::actor_addr& agent, uint64_t id) {
  auto it = self->state.pending.find(agent);
  if (it == self->state.pending.end()) return nullptr;
  auto job = it->second.find(id);
  if (job == it->second.end()) return nullptr;
  Job out = std::move(job->second);
  it->second.erase(job);
  if (it->second.empty()) self->state.pending.erase(it);
  *self->state.pending_count -= 1;
  return out;
}

void ensure_ticking(Hub self) {
  if (self->state.ticking) return;
  self->state.ticking = true;
  self->delayed_send(self, kTick, tick_atom::value);
}

// Note [Hub deadlines]: fails (and forgets) every pending call past its deadline.
void on_tick(Hub self) {
  self->state.ticking = false;
  auto now = self->clock().now();
  std::vector<Job> expired;
  for (auto agent = self->state.pending.begin(); agent != self->state.pending.end();) {
    auto& jobs = agent->second;
    for (auto it = jobs.begin(); it != jobs.end();) {
      if (it->second->deadline > now) {
        ++it;
        continue;
      }
      expired.push_back(std::move(it->second));
      it = jobs.erase(it);
    }
    agent = jobs.empty() ? self->state.pending.erase(agent) : std::next(agent);
  }
  self->state.recount();  // before the callers wake up
  for (Job& job : expired) {
    HubState::fail_job(*job, fmt::format("no answer within the call's timeout of {} ms",
                                         job->timeout.count()),
                       ErrorCode::timeout);
  }
  if (!self->state.pending.empty()) ensure_ticking(self);
}

// Note [Late replies]: the pending entry is all there is; the reply is matched by id.
void register_job(Hub self, Job job) {
  job->deadline = self->clock().now() + job->timeout;
  uint64_t id = job->id;
  self->state.pending[job->agent.address()][id] = std::move(job);
  *self->state.pending_count += 1;
  ensure_ticking(self);
}

// An agent's answer: delivered, or (its call already ended) dropped with its payloads released
// by the agent that owns them.
void on_reply(Hub self, uint64_t id, AgentCallReply& reply) {
  const auto& sender = self->current_sender();
  if (!sender) return;
  if (Job job = take_pending(self, sender->address(), id)) return deliver(*job, reply);
  std::vector<PayloadHandle> handles;
  for (const WireValue& r : reply.results) {
    for (PayloadHandle& h : payload_handles(r)) handles.push_back(std::move(h));
  }
  count_late_reply(handles.size());
  spdlog::warn("dropped a late answer to call {} ({} payload(s) released at the agent)", id,
               handles.size());
  if (!handles.empty()) {
    self->send(caf::actor_cast<caf::actor>(sender), release_atom::value, std::move(handles));
  }
}

void on_down(Hub self, const caf::down_msg& dm) {
  std::string reason = caf::to_string(dm.reason);
  auto w = self->state.workers.find(dm.source);
  if (w != self->state.workers.end()) {
    std::lock_guard<std::mutex> lock(*self->state.dead_mutex);
    (*self->state.dead)[dm.source] = reason;
    self->state.workers.erase(w);
  }
  auto agent = self->state.agents.find(dm.source);
  if (agent == self->state.agents.end()) return;
  spdlog::error("agent {} is down ({})", agent->second, reason);
  std::string why = fmt::format("agent {} died during the call ({})", agent->second, reason);
  auto pending = self->state.pending.find(dm.source);
  if (pending != self->state.pending.end()) {
    for (auto& [id, job] : pending->second) HubState::fail_job(*job, why);
    self->state.pending.erase(pending);
    self->state.recount();
  }
  self->state.dead_agents[dm.source] = fmt::format("agent {} is dead ({})", agent->second, reason);
  self->state.agents.erase(agent);
}

caf::behavior hub_behavior(Hub self, std::shared_ptr<std::mutex> dead_mutex,
                           std::shared_ptr<DeadMap> dead,
                           std::shared_ptr<std::atomic<uint64_t>> pending_count) {
  self->state.dead_mutex = std::move(dead_mutex);
  self->state.dead = std::move(dead);
  self->state.pending_count = std::move(pending_count);
  self->set_down_handler([=](caf::down_msg& dm) { on_down(self, dm); });
  return {
      [=](batch_atom, Job job) {
        auto dead = self->state.dead_agents.find(job->agent.address());
        if (dead != self->state.dead_agents.end()) return HubState::fail_job(*job, dead->second);
        if (self->state.agents.count(job->agent.address()) == 0) {
          return HubState::fail_job(*job, "its agent is not connected");
        }
        register_job(self, std::move(job));
      },
      [=](watch_atom, const caf::actor& worker, const WorkerContext& context) {
        if (self->state.workers.emplace(worker.address(), context).second) self->monitor(worker);
      },
      [=](watch_atom, const caf::actor& agent, const std::string& address) {
        self->state.agents[agent.address()] = address;
        self->monitor(agent);
      },
      [=](reply_atom, uint64_t id, AgentCallReply& reply) { on_reply(self, id, reply); },
      [=](tick_atom) { on_tick(self); },
      [=](caf::get_atom) -> uint64_t { return *self->state.pending_count; },
      [=](down_atom, const WorkerDown& down) {
        spdlog::warn("agent reports rank {} of group '{}' on {} terminated: {}", down.rank,
                     down.group, down.host, down.reason);
      },
  };
}

// Note [Call paths]: the hub registers the call before its reply can reach the hub's mailbox
// (enqueued first), but the AgentCall leaves from the calling thread, as if sent by the hub:
// one actor hop less per call.
void send_remote_job(const caf::actor& hub, Job job) {
  AgentCall call = std::move(job->call);
  caf::actor dest = job->agent;
  uint64_t id = job->id;
  caf::anon_send(hub, batch_atom::value, std::move(job));
  caf::send_as(hub, dest, call_atom::value, id, std::move(call));
}

}  // namespace

CallHub::CallHub(caf::actor_system& system, Millis default_timeout,
                 std::chrono::microseconds idle_poll)
    : default_timeout_(default_timeout),
      idle_poll_(idle_poll),
      dead_mutex_(std::make_shared<std::mutex>()),
      dead_(std::make_shared<DeadMap>()) {
  pending_ = std::make_shared<std::atomic<uint64_t>>(0);
  hub_ = system.spawn(hub_behavior, dead_mutex_, dead_, pending_);
}

CallHub::~CallHub() { caf::anon_send_exit(hub_, caf::exit_reason::user_shutdown); }

std::shared_ptr<CallBatch> CallHub::call(const std::vector<WorkerRef>& targets,
                                         std::vector<CallRequest> requests, Millis timeout) {
  Millis t = timeout.count() > 0 ? timeout : default_timeout_;
  std::vector<std::string> labels;
  for (size_t i = 0; i < targets.size(); ++i) {
    labels.push_back(call_label(targets[i].context, requests[i].method));
  }
  // Remote targets: the hub's sweep is the deadline (it frees its entry, then fails the call);
  // the batch's own deadline, a little later, is only a backstop.
  bool remote = std::any_of(targets.begin(), targets.end(), [](const WorkerRef& w) { return !w.local; });
  auto deadline = std::chrono::steady_clock::now() + t + (remote ? 3 * kTick : Millis(0));
  // Only in-process answers can come back within a poll period (Note [Local lanes]); a remote
  // round trip takes longer, and polling would only take the CPU from the I/O threads.
  auto batch = std::make_shared<CallBatch>(std::move(labels), deadline,
                                           remote ? std::chrono::microseconds(0) : idle_poll_);
  std::unordered_map<caf::actor_addr, Job> jobs;
  std::vector<bool> dead(targets.size(), false);
  {
    std::lock_guard<std::mutex> lock(*dead_mutex_);
    for (size_t i = 0; i < targets.size() && !dead_->empty(); ++i) {
      auto d = dead_->find(targets[i].actor.address());
      if (d == dead_->end()) continue;
      dead[i] = true;
      batch->set(i, make_error(ErrorCode::unavailable, "{}: the worker is dead ({})",
                               batch->label(i), d->second));
    }
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    if (dead[i]) continue;
    if (targets[i].local) {
      send_local_call(targets[i].actor, std::move(requests[i]), false, batch, i);
      continue;
    }
    Job& job = jobs[targets[i].agent.address()];
    if (!job) {
      job = std::make_shared<internal::RemoteJob>();
      job->agent = targets[i].agent;
      job->id = next_id_.fetch_add(1);
      job->timeout = t;
      job->batch = batch;
    }
    job->call.workers.push_back(targets[i].actor);
    job->call.requests.push_back(std::move(requests[i]));
    job->indices.push_back(i);
  }
  for (auto& [agent, job] : jobs) send_remote_job(hub_, std::move(job));
  return batch;
}

Status CallHub::flush(Millis timeout) {
  caf::scoped_actor self{hub_->home_system()};
  Status st;
  self->request(hub_, timeout, caf::get_atom::value)
      .receive([](uint64_t) {}, [&](caf::error& e) { st = to_status(e); });
  return st;
}

void CallHub::watch_worker(const WorkerRef& worker) {
  caf::anon_send(hub_, watch_atom::value, worker.actor, worker.context);
}

void CallHub::watch_agent(const caf::actor& agent, const std::string& address) {
  caf::anon_send(hub_, watch_atom::value, agent, address);
}

}  // namespace tessera::runtime
