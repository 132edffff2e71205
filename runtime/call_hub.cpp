// call_hub.cpp: pending-call table, monitors, timeouts (see the header).
#include "runtime/call_hub.hpp"

#include <unordered_map>

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "runtime/errors.hpp"
#include "runtime/worker_actor.hpp"

namespace tessera::runtime::internal {

/// One call() handed to the hub actor (a local message only).
struct BatchJob {
  std::vector<WorkerRef> targets;
  std::vector<CallRequest> requests;
  Millis timeout;
  std::shared_ptr<CallBatch> batch;
};

}  // namespace tessera::runtime::internal

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<tessera::runtime::internal::BatchJob>)

namespace tessera::runtime {

// ---- CallBatch ---------------------------------------------------------------------------------

std::vector<Result<WireValue>> CallBatch::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return done_ == results_.size(); });
  std::vector<Result<WireValue>> out;
  out.reserve(results_.size());
  for (auto& r : results_) out.push_back(std::move(*r));
  return out;
}

bool CallBatch::ready() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_ == results_.size();
}

void CallBatch::set(size_t i, Result<WireValue> result) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (results_[i].has_value()) return;
  results_[i] = std::move(result);
  if (++done_ == results_.size()) cv_.notify_all();
}

// ---- the hub actor -----------------------------------------------------------------------------

namespace {

struct PendingCall {
  std::shared_ptr<CallBatch> batch;
  size_t index;
  std::string method;
};

struct Target {
  WorkerContext context;
  std::unordered_map<uint64_t, PendingCall> calls;
};

struct HubState {
  std::unordered_map<caf::actor_addr, Target> targets;
  std::unordered_map<caf::actor_addr, std::string> dead;    // target -> why
  std::unordered_map<caf::actor_addr, std::string> agents;  // agent -> address
  uint64_t next_id = 1;
  static inline const char* name = "tessera.call_hub";

  HubState() = default;
  HubState(const HubState&) = delete;
  // The hub stopped (runtime shutdown): nobody will answer the calls still pending.
  ~HubState() {
    for (auto& [addr, target] : targets) {
      for (auto& [id, call] : target.calls) {
        call.batch->set(call.index, make_error(ErrorCode::unavailable,
                                               "runtime shut down while '{}' was pending",
                                               call.method));
      }
    }
  }
};

using Hub = caf::stateful_actor<HubState>*;

std::string who(const WorkerContext& c) {
  return fmt::format("{} of group '{}'", describe_worker(c), c.group);
}

void finish(Hub self, const caf::actor_addr& addr, uint64_t id, Result<WireValue> result) {
  auto t = self->state.targets.find(addr);
  if (t == self->state.targets.end()) return;
  auto c = t->second.calls.find(id);
  if (c == t->second.calls.end()) return;  // already failed by a down_msg
  PendingCall call = std::move(c->second);
  t->second.calls.erase(c);
  if (!result.ok()) {
    Status st = result.status();
    if (st.code() == ErrorCode::timeout || st.code() == ErrorCode::unavailable) {
      st = st.with_context(fmt::format("{}: method '{}'", who(t->second.context), call.method));
    }
    result = st;
  }
  call.batch->set(call.index, std::move(result));
}

// The target's entry, monitoring it on first sight.
Target& watch(Hub self, const caf::actor& actor, const WorkerContext& context) {
  auto [it, fresh] = self->state.targets.try_emplace(actor.address());
  if (fresh) {
    it->second.context = context;
    self->monitor(actor);
  }
  return it->second;
}

void send_one(Hub self, const WorkerRef& target, CallRequest& req, Millis timeout,
              const std::shared_ptr<CallBatch>& batch, size_t index) {
  caf::actor_addr addr = target.actor.address();
  auto dead = self->state.dead.find(addr);
  if (dead != self->state.dead.end()) {
    batch->set(index, make_error(ErrorCode::unavailable, "{} is dead ({}); method '{}' not sent",
                                 who(target.context), dead->second, req.method));
    return;
  }
  Target& t = watch(self, target.actor, target.context);
  uint64_t id = self->state.next_id++;
  t.calls.emplace(id, PendingCall{batch, index, req.method});
  self->request(target.actor, timeout, call_atom::value, std::move(req))
      .then([=](CallReply& reply) { finish(self, addr, id, std::move(reply.result)); },
            [=](caf::error& err) { finish(self, addr, id, to_status(err)); });
}

void on_down(Hub self, const caf::down_msg& dm) {
  std::string reason = caf::to_string(dm.reason);
  auto agent = self->state.agents.find(dm.source);
  if (agent != self->state.agents.end()) {
    spdlog::error("agent {} is down ({})", agent->second, reason);
    self->state.agents.erase(agent);
  }
  auto t = self->state.targets.find(dm.source);
  if (t == self->state.targets.end()) return;
  self->state.dead[dm.source] = reason;
  for (auto& [id, call] : t->second.calls) {
    call.batch->set(call.index,
                    make_error(ErrorCode::unavailable, "{} died during '{}': {}",
                               who(t->second.context), call.method, reason));
  }
  if (!t->second.calls.empty()) spdlog::error("{} died: {}", who(t->second.context), reason);
  self->state.targets.erase(t);
}

caf::behavior hub_behavior(Hub self) {
  self->set_down_handler([=](caf::down_msg& dm) { on_down(self, dm); });
  return {
      [=](batch_atom, std::shared_ptr<internal::BatchJob> job) {
        for (size_t i = 0; i < job->targets.size(); ++i) {
          send_one(self, job->targets[i], job->requests[i], job->timeout, job->batch, i);
        }
      },
      [=](watch_atom, const caf::actor& worker, const WorkerContext& context) {
        watch(self, worker, context);
      },
      [=](watch_atom, const caf::actor& agent, const std::string& address) {
        self->state.agents[agent.address()] = address;
        self->monitor(agent);
      },
      [=](down_atom, const WorkerDown& down) {
        spdlog::warn("agent reports rank {} of group '{}' on {} terminated: {}", down.rank,
                     down.group, down.host, down.reason);
      },
  };
}

}  // namespace

CallHub::CallHub(caf::actor_system& system, Millis default_timeout)
    : hub_(system.spawn(hub_behavior)), default_timeout_(default_timeout) {}

CallHub::~CallHub() { caf::anon_send_exit(hub_, caf::exit_reason::user_shutdown); }

std::shared_ptr<CallBatch> CallHub::call(const std::vector<WorkerRef>& targets,
                                         std::vector<CallRequest> requests, Millis timeout) {
  auto job = std::make_shared<internal::BatchJob>();
  job->targets = targets;
  job->requests = std::move(requests);
  job->timeout = timeout.count() > 0 ? timeout : default_timeout_;
  job->batch = std::make_shared<CallBatch>(targets.size());
  auto batch = job->batch;
  if (targets.empty()) return batch;
  caf::anon_send(hub_, batch_atom::value, std::move(job));
  return batch;
}

void CallHub::watch_worker(const WorkerRef& worker) {
  caf::anon_send(hub_, watch_atom::value, worker.actor, worker.context);
}

void CallHub::watch_agent(const caf::actor& agent, const std::string& address) {
  caf::anon_send(hub_, watch_atom::value, agent, address);
}

}  // namespace tessera::runtime
