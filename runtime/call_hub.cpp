// call_hub.cpp: Note [Call paths].
#include "runtime/call_hub.hpp"

#include <algorithm>
#include <thread>
#include <unordered_map>

#include <caf/actor_clock.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "runtime/errors.hpp"
#include "runtime/internal/call_channel.hpp"
#include "runtime/local_lane.hpp"
#include "runtime/wire.hpp"
#include "runtime/worker_actor.hpp"

namespace tessera::runtime::internal {

/// The calls of one CallHub::call() bound for one agent (a local message to the hub).
struct RemoteJob {
  caf::actor agent;
  uint64_t id = 0;              // call id, unique per CallHub
  std::vector<caf::actor> workers;    // the targets, sent by the caller (then empty)
  std::vector<CallRequest> requests;  // requests[k] goes to workers[k]
  std::vector<size_t> indices;  // into batch
  Millis timeout;
  caf::actor_clock::time_point deadline;  // set by the hub when it registers the call
  std::shared_ptr<CallBatch> batch;
};

using Job = std::shared_ptr<RemoteJob>;

// What the CallHub actor, the callers and the channels' reader threads share (Note [Call
// paths]): one mutex, held only for table updates (never while sending or failing calls).
struct HubShared {
  mutable std::mutex mutex;
  std::unordered_map<caf::actor_addr, std::unordered_map<uint64_t, Job>> pending;  // by agent
  bool ticking = false;  // a deadline sweep is scheduled (Note [Hub deadlines])
  std::unordered_map<caf::actor_addr, std::string> dead;  // dead workers -> why
  std::unordered_map<caf::actor_addr, std::shared_ptr<ChannelClient>> channels;  // by agent
  std::atomic<uint64_t> pending_count{0};
  std::atomic<uint64_t> next_id{1};

  // Registers `job`; true if the caller must start the deadline sweep.
  bool add(Job job) {
    std::lock_guard<std::mutex> lock(mutex);
    uint64_t id = job->id;
    caf::actor_addr agent = job->agent.address();
    pending[agent][id] = std::move(job);
    pending_count.fetch_add(1);
    bool start = !ticking;
    ticking = true;
    return start;
  }
  // Takes call `id` to `agent` out; null if it already ended (deadline, agent death).
  Job take(const caf::actor_addr& agent, uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = pending.find(agent);
    if (it == pending.end()) return nullptr;
    auto job = it->second.find(id);
    if (job == it->second.end()) return nullptr;
    Job out = std::move(job->second);
    it->second.erase(job);
    if (it->second.empty()) pending.erase(it);
    pending_count.fetch_sub(1);
    return out;
  }
  // Takes every call to `agent` out.
  std::vector<Job> take_agent(const caf::actor_addr& agent) {
    std::vector<Job> out;
    std::lock_guard<std::mutex> lock(mutex);
    auto it = pending.find(agent);
    if (it == pending.end()) return out;
    for (auto& [id, job] : it->second) out.push_back(std::move(job));
    pending.erase(it);
    pending_count.fetch_sub(out.size());
    return out;
  }
  // Takes every call whose deadline is not after `now` (all of them with time_point::max()).
  std::vector<Job> take_expired(caf::actor_clock::time_point now) {
    std::vector<Job> out;
    std::lock_guard<std::mutex> lock(mutex);
    for (auto agent = pending.begin(); agent != pending.end();) {
      auto& jobs = agent->second;
      for (auto it = jobs.begin(); it != jobs.end();) {
        if (it->second->deadline > now) {
          ++it;
          continue;
        }
        out.push_back(std::move(it->second));
        it = jobs.erase(it);
      }
      agent = jobs.empty() ? pending.erase(agent) : std::next(agent);
    }
    pending_count.fetch_sub(out.size());
    return out;
  }
  // End of a sweep: true if another one is needed (calls pending), else the sweep stops.
  bool keep_ticking() {
    std::lock_guard<std::mutex> lock(mutex);
    ticking = !pending.empty();
    return ticking;
  }
  std::shared_ptr<ChannelClient> channel(const caf::actor_addr& agent) const {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = channels.find(agent);
    return it == channels.end() ? nullptr : it->second;
  }
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
std::atomic<uint64_t> channel_calls{0};

}  // namespace

CallCounters call_counters() {
  return CallCounters{live_batches.load(), late_replies.load(), late_payloads.load(),
                      lane_calls.load(), channel_calls.load()};
}

void count_late_reply(uint64_t payloads) {
  late_replies.fetch_add(1);
  late_payloads.fetch_add(payloads);
}

CallLabels::CallLabels(std::vector<std::string> whole) {
  workers_.reserve(whole.size());
  for (std::string& w : whole) workers_.push_back(std::make_shared<const std::string>(std::move(w)));
}

void CallLabels::add(std::shared_ptr<const std::string> worker, const std::string& method) {
  if (methods_.empty() && !workers_.empty()) {  // whole labels so far: this one whole too
    workers_.push_back(std::make_shared<const std::string>(*worker + ": method '" + method + "'"));
    return;
  }
  if (methods_.empty()) {
    methods_.push_back(method);  // the first target's method, shared while the others match
  } else if (methods_.size() > 1 || methods_[0] != method) {
    if (methods_.size() == 1) {  // a second method: one per target from here on
      std::string first = methods_[0];
      methods_.assign(workers_.size(), first);
    }
    methods_.push_back(method);
  }
  workers_.push_back(std::move(worker));
}

std::string CallLabels::operator[](size_t i) const {
  if (methods_.empty()) return *workers_[i];
  const std::string& method = methods_.size() == 1 ? methods_[0] : methods_[i];
  return *workers_[i] + ": method '" + method + "'";
}

CallBatch::CallBatch(CallLabels labels,
                     std::chrono::steady_clock::time_point deadline,
                     std::chrono::microseconds idle_poll)
    : labels_(std::move(labels)), deadline_(deadline), idle_poll_(idle_poll),
      slots_(labels_.size()) {
  live_batches.fetch_add(1);
}

CallBatch::~CallBatch() { live_batches.fetch_sub(1); }

std::vector<Result<WireValue>> CallBatch::wait() {
  auto complete = [&] { return done_.load(std::memory_order_acquire) == slots_.size(); };
  (void)internal::poll_until(complete, idle_poll_);  // Note [Local lanes]
  std::unique_lock<std::mutex> lock(mutex_);
  if (deadline_ == std::chrono::steady_clock::time_point::max()) {
    cv_.wait(lock, complete);  // wait_until(max) can overflow into "timed out" at once
  } else if (!cv_.wait_until(lock, deadline_, complete)) {
    lock.unlock();
    for (size_t i = 0; i < slots_.size(); ++i) {
      set(i, make_error(ErrorCode::timeout, "{}: no answer before the call's deadline", labels_[i]),
          /*fail_fast=*/false);
    }
    // A target claimed just before the deadline is being written: it is counted in a moment.
    while (!complete()) std::this_thread::yield();
    lock.lock();
  }
  std::vector<Result<WireValue>> out;
  out.reserve(slots_.size());
  for (Slot& slot : slots_) out.push_back(std::move(*slot.value));
  return out;
}

bool CallBatch::ready() const {
  return done_.load(std::memory_order_acquire) == slots_.size();
}

// Note [Failing fast] (call_hub.hpp).
void CallBatch::cancel_unanswered(size_t failed) {
  for (size_t j = 0; j < slots_.size(); ++j) {
    if (slots_[j].claimed.load(std::memory_order_acquire)) continue;
    set(j, make_error(ErrorCode::cancelled, "{}: given up unanswered: {} failed first", labels_[j],
                      labels_[failed]),
        /*fail_fast=*/false);
  }
}

// Note [Lock-free outcomes] (call_hub.hpp).
bool CallBatch::set(size_t i, Result<WireValue> result, bool fail_fast) {
  if (fail_fast && !result.ok() && result.status().code() != ErrorCode::cancelled) {
    if (!set(i, std::move(result), false)) return false;
    cancel_unanswered(i);  // Note [Failing fast]
    return true;
  }
  Slot& slot = slots_[i];
  if (slot.claimed.exchange(true, std::memory_order_acq_rel)) return false;
  slot.value = std::move(result);
  if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 < slots_.size()) return true;
  std::function<void()> callback;
  {
    // The last outcome. Under the lock, so that a wait() about to sleep sees done_ complete or
    // gets this notification, and on_complete() either sees it or hands its callback over.
    std::lock_guard<std::mutex> lock(mutex_);
    callback = std::move(on_complete_);
    cv_.notify_all();
  }
  if (callback) callback();
  return true;
}

void CallBatch::on_complete(std::function<void()> f) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_.load(std::memory_order_acquire) < slots_.size()) {
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

// Made once per worker (WorkerRef::label; per call for a WorkerRef without one): plain appends.
std::string worker_label(const WorkerContext& c) {
  std::string out;
  out.reserve(32 + c.device.size() + c.host.size() + c.group.size());
  out.append("rank ").append(std::to_string(c.rank)).append(" (").append(c.device);
  out.append(" on ").append(c.host).append(") of group '").append(c.group).append("'");
  return out;
}

std::string call_label(const WorkerContext& c, const std::string& method) {
  return worker_label(c) + ": method '" + method + "'";
}

// A message to a terminated actor is dropped (and destroyed): the slot's destructor then fails
// the target, as it does for an invalid handle, whose LocalCall is destroyed right here.
void send_local_call(const caf::actor& worker, CallRequest&& request, bool caller_remote,
                     const std::shared_ptr<CallBatch>& batch, size_t index) {
  auto call = std::make_shared<LocalCall>(std::move(request), caller_remote, batch, index);
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
// enforces deadlines itself: one sweep every kTick while calls are pending fails the expired
// ones. Deadlines are on the actor system's clock (the test coordinator's in unit tests).
using tick_atom = caf::atom_constant<caf::atom("ts_tick")>;
using tick_start_atom = caf::atom_constant<caf::atom("ts_tickgo")>;
constexpr Millis kTick{100};

using internal::Job;
using Shared = std::shared_ptr<internal::HubShared>;

void fail_job(internal::RemoteJob& job, const std::string& why,
              ErrorCode code = ErrorCode::unavailable) {
  for (size_t i : job.indices) {
    job.batch->set(i, make_error(code, "{}: {}", job.batch->label(i), why), /*fail_fast=*/false);
  }
  if (!job.indices.empty()) job.batch->cancel_unanswered(job.indices[0]);
}

void fail_jobs(const std::vector<Job>& jobs, const std::string& why) {
  for (const Job& job : jobs) fail_job(*job, why);
}

struct HubState {
  std::unordered_map<caf::actor_addr, std::string> agents;  // agent -> address
  std::unordered_map<caf::actor_addr, std::string> dead_agents;  // agent -> why
  std::unordered_map<caf::actor_addr, WorkerContext> workers;
  Shared shared;
  static inline const char* name = "tessera.call_hub";

  HubState() = default;
  HubState(const HubState&) = delete;
  // The hub stopped (runtime shutdown): nobody will answer the calls still pending.
  ~HubState() {
    if (shared) {
      fail_jobs(shared->take_expired(caf::actor_clock::time_point::max()),
                "the runtime shut down while it was pending");
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
// Returns the payloads of answers that came too late for their target (Note [Failing fast]:
// the call already failed elsewhere), which the caller releases at the agent.
std::vector<PayloadHandle> deliver(internal::RemoteJob& job, AgentCallReply& reply) {
  size_t n = job.indices.size();
  if (reply.codes.size() != n || reply.messages.size() != n || reply.results.size() != n) {
    fail_job(job, fmt::format("malformed reply from the agent ({}/{}/{} answers for {} calls)",
                              reply.codes.size(), reply.messages.size(), reply.results.size(), n),
             ErrorCode::corrupt_data);
    return {};
  }
  std::vector<PayloadHandle> unclaimed;
  std::optional<size_t> failed;  // the first target that failed: the others wait no longer
  for (size_t k = 0; k < n; ++k) {
    size_t i = job.indices[k];
    uint8_t code = reply.codes[k];
    if (code == 0) {
      std::vector<PayloadHandle> handles = payload_handles(reply.results[k]);
      if (!job.batch->set(i, std::move(reply.results[k]))) {
        for (PayloadHandle& h : handles) unclaimed.push_back(std::move(h));
      }
      continue;
    }
    if (code != static_cast<uint8_t>(ErrorCode::cancelled) && !failed) failed = i;
    if (code > static_cast<uint8_t>(ErrorCode::cancelled)) {
      job.batch->set(i, make_error(ErrorCode::corrupt_data, "{}: the agent answered with "
                                   "unknown error code {}", job.batch->label(i), code), false);
    } else {
      job.batch->set(i, agent_error(*job.batch, i, static_cast<ErrorCode>(code), reply.messages[k]),
                     false);
    }
  }
  if (failed) job.batch->cancel_unanswered(*failed);
  return unclaimed;
}

// An agent's answer (CAF message or channel frame): delivered, or (its call already ended)
// dropped with its payloads released at the agent that owns them (Note [Late replies]).
void on_agent_reply(internal::HubShared& shared, const caf::actor& hub, const caf::actor& agent,
                    uint64_t id, AgentCallReply& reply) {
  std::vector<PayloadHandle> handles;
  if (Job job = shared.take(agent.address(), id)) {
    handles = deliver(*job, reply);
    if (handles.empty()) return;
  } else {
    for (const WireValue& r : reply.results) {
      for (PayloadHandle& h : payload_handles(r)) handles.push_back(std::move(h));
    }
  }
  count_late_reply(handles.size());
  spdlog::warn("dropped a late answer to call {} ({} payload(s) released at the agent)", id,
               handles.size());
  if (!handles.empty()) caf::send_as(hub, agent, release_atom::value, std::move(handles));
}

void schedule_tick(Hub self) { self->delayed_send(self, kTick, tick_atom::value); }

// Note [Hub deadlines]: fails (and forgets) every pending call past its deadline.
void on_tick(Hub self) {
  std::vector<Job> expired = self->state.shared->take_expired(self->clock().now());
  for (Job& job : expired) {
    fail_job(*job, fmt::format("no answer within the call's timeout of {} ms",
                               job->timeout.count()),
             ErrorCode::timeout);
  }
  if (self->state.shared->keep_ticking()) schedule_tick(self);
}

// Closes `agent`'s channel (if any) before failing its calls, so a caller that registers a
// call after this either sees the channel closed or has its call failed here.
void close_channel(internal::HubShared& shared, const caf::actor_addr& agent) {
  if (std::shared_ptr<internal::ChannelClient> ch = shared.channel(agent)) ch->close();
}

void on_down(Hub self, const caf::down_msg& dm) {
  std::string reason = caf::to_string(dm.reason);
  auto w = self->state.workers.find(dm.source);
  if (w != self->state.workers.end()) {
    std::lock_guard<std::mutex> lock(self->state.shared->mutex);
    self->state.shared->dead[dm.source] = reason;
    self->state.workers.erase(w);
  }
  auto agent = self->state.agents.find(dm.source);
  if (agent == self->state.agents.end()) return;
  spdlog::error("agent {} is down ({})", agent->second, reason);
  close_channel(*self->state.shared, dm.source);
  fail_jobs(self->state.shared->take_agent(dm.source),
            fmt::format("agent {} died during the call ({})", agent->second, reason));
  self->state.dead_agents[dm.source] = fmt::format("agent {} is dead ({})", agent->second, reason);
  self->state.agents.erase(agent);
}

caf::behavior hub_behavior(Hub self, Shared shared) {
  self->state.shared = std::move(shared);
  self->set_down_handler([=](caf::down_msg& dm) { on_down(self, dm); });
  return {
      [=](batch_atom, Job job) {
        auto dead = self->state.dead_agents.find(job->agent.address());
        if (dead != self->state.dead_agents.end()) return fail_job(*job, dead->second);
        if (self->state.agents.count(job->agent.address()) == 0) {
          return fail_job(*job, "its agent is not connected");
        }
        job->deadline = self->clock().now() + job->timeout;
        if (self->state.shared->add(std::move(job))) schedule_tick(self);
      },
      [=](watch_atom, const caf::actor& worker, const WorkerContext& context) {
        if (self->state.workers.emplace(worker.address(), context).second) self->monitor(worker);
      },
      [=](watch_atom, const caf::actor& agent, const std::string& address) {
        self->state.agents[agent.address()] = address;
        self->monitor(agent);
      },
      [=](reply_atom, uint64_t id, AgentCallReply& reply) {
        auto agent = caf::actor_cast<caf::actor>(self->current_sender());
        if (agent) on_agent_reply(*self->state.shared, self, agent, id, reply);
      },
      [=](tick_start_atom) { schedule_tick(self); },
      [=](tick_atom) { on_tick(self); },
      [=](caf::get_atom) -> uint64_t { return self->state.shared->pending_count.load(); },
      [=](down_atom, const WorkerDown& down) {
        spdlog::warn("agent reports rank {} of group '{}' on {} terminated: {}", down.rank,
                     down.group, down.host, down.reason);
      },
  };
}

// Note [Call paths], CAF path: the hub registers the call before its reply can reach the
// hub's mailbox (enqueued first), but the AgentCall leaves from the calling thread, as if sent
// by the hub: one actor hop less per call.
void send_remote_job(const caf::actor& hub, Job job) {
  AgentCall call;
  call.workers = std::move(job->workers);
  call.requests = std::move(job->requests);
  caf::actor dest = job->agent;
  uint64_t id = job->id;
  caf::anon_send(hub, batch_atom::value, std::move(job));
  caf::send_as(hub, dest, call_atom::value, id, std::move(call));
}

// Note [Call channel], driver side: registered first (its answer may come before send()
// returns), then written by the calling thread. A channel closed meanwhile, or a failed write,
// fails the call here unless the closing side already did.
void send_channel_job(internal::HubShared& shared, const caf::actor& hub,
                      internal::ChannelClient& channel, Job job) {
  internal::ChannelCall call;
  call.workers.reserve(job->workers.size());
  for (const caf::actor& w : job->workers) call.workers.push_back(w.id());
  call.requests = std::move(job->requests);
  job->workers.clear();
  caf::actor_addr agent = job->agent.address();
  uint64_t id = job->id;
  job->deadline = hub->home_system().clock().now() + job->timeout;
  if (shared.add(job)) caf::anon_send(hub, tick_start_atom::value);
  channel_calls.fetch_add(1, std::memory_order_relaxed);
  Status st = channel.send(id, call);
  if (st.ok()) return;
  if (Job mine = shared.take(agent, id)) {
    fail_job(*mine, fmt::format("the call channel to agent {} failed: {}", channel.agent(),
                                st.message()));
  }
}

}  // namespace

CallHub::CallHub(caf::actor_system& system, Millis default_timeout,
                 std::chrono::microseconds idle_poll)
    : shared_(std::make_shared<internal::HubShared>()),
      default_timeout_(default_timeout),
      idle_poll_(idle_poll) {
  hub_ = system.spawn(hub_behavior, shared_);
}

CallHub::~CallHub() {
  // Readers first (they call into the shared table and send as the hub), then the hub, whose
  // state fails whatever is still pending.
  std::unordered_map<caf::actor_addr, std::shared_ptr<internal::ChannelClient>> channels;
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    channels.swap(shared_->channels);
  }
  for (auto& [agent, channel] : channels) channel->close();
  channels.clear();
  caf::anon_send_exit(hub_, caf::exit_reason::user_shutdown);
}

uint64_t CallHub::pending_calls() const { return shared_->pending_count.load(); }

Status CallHub::open_channel(const caf::actor& agent, const std::string& address,
                             const std::string& host, uint16_t port,
                             const std::string& local_socket, uint64_t session,
                             const std::string& key, Millis timeout, uint64_t max_frame_bytes) {
  std::weak_ptr<internal::HubShared> weak = shared_;
  caf::actor hub = hub_;
  caf::actor_addr agent_addr = agent.address();
  auto on_reply = [weak, hub, agent](uint64_t id, AgentCallReply& reply) {
    if (Shared shared = weak.lock()) on_agent_reply(*shared, hub, agent, id, reply);
  };
  // The connection ended under us (agent died, or a bad frame): fail its calls now, without
  // waiting for CAF to notice; later calls go through CAF (which knows whether it is dead).
  auto on_close = [weak, agent_addr, address](const std::string& why) {
    Shared shared = weak.lock();
    if (!shared) return;
    spdlog::warn("agent {}: its call channel closed ({}); calls to it go through CAF now",
                 address, why);
    fail_jobs(shared->take_agent(agent_addr),
              fmt::format("the call channel to agent {} closed during the call ({}): the agent "
                          "died or dropped this driver", address, why));
  };
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<internal::ChannelClient> channel,
                           internal::ChannelClient::connect(
                               hub_->home_system(), address, {host, port, local_socket}, session,
                               key, timeout, max_frame_bytes, idle_poll_, on_reply, on_close));
  std::shared_ptr<internal::ChannelClient> old;
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    old = std::exchange(shared_->channels[agent_addr], std::move(channel));
  }
  if (old) old->close();
  return Status();
}

bool CallHub::channel_open(const caf::actor& agent) const {
  std::shared_ptr<internal::ChannelClient> ch = shared_->channel(agent.address());
  return ch && ch->open();
}

std::string CallHub::channel_transport(const caf::actor& agent) const {
  std::shared_ptr<internal::ChannelClient> ch = shared_->channel(agent.address());
  if (!ch || !ch->open()) return "";
  return ch->local() ? "local socket" : "TCP";
}

std::shared_ptr<CallBatch> CallHub::call(const std::vector<WorkerRef>& targets,
                                         std::vector<CallRequest> requests, Millis timeout) {
  Millis t = timeout.count() > 0 ? timeout : default_timeout_;
  CallLabels labels;  // Note [Call labels]
  labels.reserve(targets.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    labels.add(targets[i].label ? targets[i].label
                                : std::make_shared<const std::string>(worker_label(targets[i].context)),
               requests[i].method);
  }
  std::unordered_map<caf::actor_addr, Job> jobs;
  std::unordered_map<caf::actor_addr, std::shared_ptr<internal::ChannelClient>> channels;
  std::vector<const std::string*> dead(targets.size(), nullptr);  // why, in shared_->dead
  std::vector<std::string> dead_reasons;  // dead[i] points into it: reserved before any push
  bool remote = false;
  bool all_channels = true;  // every remote target's agent has an open channel
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    if (!shared_->dead.empty()) dead_reasons.reserve(targets.size());
    for (size_t i = 0; i < targets.size(); ++i) {
      if (!shared_->dead.empty()) {
        auto d = shared_->dead.find(targets[i].actor.address());
        if (d != shared_->dead.end()) {
          dead_reasons.push_back(d->second);
          dead[i] = &dead_reasons.back();
        }
      }
      if (targets[i].local) continue;
      remote = true;
      auto ch = shared_->channels.find(targets[i].agent.address());
      if (ch == shared_->channels.end() || !ch->second->open()) {
        all_channels = false;
      } else {
        channels.emplace(ch->first, ch->second);
      }
    }
  }
  // Remote targets: the hub's sweep is the deadline (it frees its entry, then fails the call);
  // the batch's own deadline, a little later, is only a backstop.
  auto deadline = std::chrono::steady_clock::now() + t + (remote ? 3 * kTick : Millis(0));
  // Poll (Note [Local lanes]) for in-process workers and for call channels, whose readers
  // hand answers over from threads of their own; a CAF round trip takes longer, and polling
  // would only take the CPU from CAF's I/O threads.
  auto batch = std::make_shared<CallBatch>(
      std::move(labels), deadline,
      !remote || all_channels ? idle_poll_ : std::chrono::microseconds(0));
  for (size_t i = 0; i < targets.size(); ++i) {
    if (dead[i] != nullptr) {
      batch->set(i, make_error(ErrorCode::unavailable, "{}: the worker is dead ({})",
                               batch->label(i), *dead[i]));
    }
  }
  for (size_t i = 0; i < targets.size(); ++i) {
    if (dead[i] != nullptr) continue;
    if (targets[i].local) {
      send_local_call(targets[i].actor, std::move(requests[i]), false, batch, i);
      continue;
    }
    Job& job = jobs[targets[i].agent.address()];
    if (!job) {
      job = std::make_shared<internal::RemoteJob>();
      job->agent = targets[i].agent;
      job->id = shared_->next_id.fetch_add(1);
      job->timeout = t;
      job->batch = batch;
    }
    job->workers.push_back(targets[i].actor);
    job->requests.push_back(std::move(requests[i]));
    job->indices.push_back(i);
  }
  for (auto& [agent, job] : jobs) {
    auto ch = channels.find(agent);
    if (ch != channels.end() && ch->second->open()) {
      send_channel_job(*shared_, hub_, *ch->second, std::move(job));
    } else {
      send_remote_job(hub_, std::move(job));
    }
  }
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
