// agent.cpp: the node agent actor (see the header; Note [Agent authentication]).
#include "runtime/agent.hpp"

#include <unistd.h>

#include <set>
#include <unordered_map>

#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "proto/free_port.hpp"
#include "runtime/auth.hpp"
#include "runtime/call_hub.hpp"
#include "runtime/errors.hpp"
#include "runtime/internal/call_channel.hpp"
#include "runtime/internal/shm.hpp"
#include "runtime/worker_actor.hpp"

namespace tessera::runtime {
namespace {

struct Hosted {
  caf::actor actor;
  WorkerContext context;
  std::string owner;  // node id (string) of the driver that spawned it
};

struct AgentState {
  AgentEnv env;
  std::unordered_map<std::string, std::pair<std::string, std::string>> challenges;  // node -> (Nd, Na)
  std::set<std::string> authenticated;
  std::unordered_map<std::string, caf::actor> reporters;   // node -> driver's call hub
  std::unordered_map<caf::actor_addr, std::string> reporter_nodes;
  std::unordered_map<caf::actor_addr, Hosted> workers;
  static inline const char* name = "tessera.agent";
};

using Agent = caf::stateful_actor<AgentState>*;

std::string sender_node(Agent self) {
  const auto& s = self->current_sender();
  return s ? caf::to_string(s->node()) : std::string();
}

Status check_sender(Agent self) {
  const auto& s = self->current_sender();
  if (!s) return make_error(ErrorCode::permission_denied, "agent: anonymous request refused");
  if (s->node() == self->node()) return Status();
  if (self->state.env.trust_local_only) {
    return make_error(ErrorCode::permission_denied, "embedded agent: remote request refused");
  }
  if (self->state.authenticated.count(caf::to_string(s->node())) > 0) return Status();
  return make_error(ErrorCode::permission_denied,
                    "agent on {}: driver node has not authenticated", self->state.env.host);
}

AgentInfo agent_info(Agent self) {
  const AgentEnv& env = self->state.env;
  return AgentInfo{env.host, internal::machine_id(), env.devices, static_cast<int64_t>(::getpid()),
                   "0.1.0", 0, 0, ""};
}

caf::result<std::string, std::string> on_hello(Agent self, const std::string& driver_nonce) {
  if (self->state.env.token.empty()) {
    return to_caf_error(make_error(ErrorCode::permission_denied, "agent has no token"));
  }
  if (driver_nonce.size() != 32) {
    return to_caf_error(make_error(ErrorCode::invalid_argument, "hello: nonce must be 32 bytes"));
  }
  Result<std::string> na = random_bytes(32);
  if (!na.ok()) return to_caf_error(na.status());
  self->state.challenges[sender_node(self)] = {driver_nonce, *na};
  return {*na, agent_proof(self->state.env.token, driver_nonce, *na)};
}

caf::result<AgentInfo> on_auth(Agent self, const std::string& proof, const caf::actor& hub) {
  std::string node = sender_node(self);
  auto it = self->state.challenges.find(node);
  if (it == self->state.challenges.end()) {
    return to_caf_error(make_error(ErrorCode::permission_denied, "auth without hello"));
  }
  auto [nd, na] = it->second;
  self->state.challenges.erase(it);  // single use
  if (!constant_time_equal(proof, driver_proof(self->state.env.token, na, nd))) {
    spdlog::warn("agent: refused a driver with a wrong token (node {})", node);
    return to_caf_error(make_error(ErrorCode::permission_denied,
                                   "agent on {}: wrong token", self->state.env.host));
  }
  self->state.authenticated.insert(node);
  if (hub) {
    self->state.reporters[node] = hub;
    self->state.reporter_nodes[hub.address()] = node;
    self->monitor(hub);
  }
  spdlog::info("agent: driver authenticated (node {})", node);
  AgentInfo info = agent_info(self);
  if (internal::ChannelServer* channel = self->state.env.channel) {
    Result<std::pair<uint64_t, std::string>> session = channel->open_session(node);
    if (!session.ok()) return to_caf_error(session.status());
    info.call_port = channel->port();
    info.call_session = session->first;
    info.call_key = std::move(session->second);
  }
  return info;
}

caf::result<caf::actor> on_spawn(Agent self, SpawnRequest req) {
  Status st = check_sender(self);
  const AgentEnv& env = self->state.env;
  if (st.ok() && std::find(env.devices.begin(), env.devices.end(), req.context.device) ==
                     env.devices.end()) {
    st = make_error(ErrorCode::invalid_argument, "agent on {}: no device '{}' (has {})", env.host,
                    req.context.device, fmt::join(env.devices, ","));
  }
  if (!st.ok()) return to_caf_error(st);
  if (req.context.host.empty()) req.context.host = env.host;
  WorkerHostEnv wenv{env.registry, env.data_plane, env.inline_payload_max_bytes, env.idle_poll};
  WorkerContext ctx = req.context;
  caf::actor worker = spawn_worker_actor(self->system(), std::move(req), wenv,
                                         env.detached_workers);
  std::string owner = sender_node(self);  // before make_response_promise takes the sender
  auto rp = self->make_response_promise<caf::actor>();
  self->request(worker, env.spawn_timeout, init_atom::value)
      .then(
          [=](const std::vector<MethodInfo>&) mutable {
            self->monitor(worker);
            self->state.workers[worker.address()] = Hosted{worker, ctx, owner};
            if (internal::ChannelServer* channel = self->state.env.channel) {
              channel->add_worker({worker, ctx, owner});
            }
            rp.deliver(worker);
          },
          [=](caf::error& err) mutable {
            self->send_exit(worker, caf::exit_reason::kill);
            rp.deliver(err);
          });
  return rp;
}

// Labels of an AgentCall's targets; known[i] is false for a worker this agent does not host
// for the calling driver.
std::vector<std::string> fan_out_labels(Agent self, const AgentCall& call, std::vector<bool>& known) {
  std::vector<std::string> labels;
  std::string caller = sender_node(self);
  for (size_t i = 0; i < call.workers.size(); ++i) {
    auto h = self->state.workers.find(call.workers[i].address());
    known.push_back(h != self->state.workers.end() && call.workers[i].node() == self->node() &&
                    h->second.owner == caller);
    labels.push_back(known.back() ? call_label(h->second.context, call.requests[i].method)
                                  : "a worker not hosted here");
  }
  return labels;
}

// Note [Call paths]: one AgentCall from a driver becomes LocalCalls to the hosted workers; the
// thread of the last answer replies once, on the agent's behalf, with (reply_atom, call_id,
// reply) to the caller (Note [Late replies]). A worker that dies with the call pending fails
// its target through the ReplySlot, so the fan-out always completes.
void on_call(Agent self, uint64_t call_id, AgentCall& call) {
  auto caller = caf::actor_cast<caf::actor>(self->current_sender());
  if (!caller) return;
  Status st = check_sender(self);
  if (st.ok() && call.workers.size() != call.requests.size()) {
    st = make_error(ErrorCode::invalid_argument, "agent on {}: AgentCall with {} workers and {} "
                    "requests", self->state.env.host, call.workers.size(), call.requests.size());
  }
  if (!st.ok()) {
    self->send(caller, reply_atom::value, call_id, internal::agent_refusal(call.requests.size(), st));
    return;
  }
  std::vector<bool> known;
  std::vector<std::string> labels = fan_out_labels(self, call, known);
  std::vector<caf::actor> targets(known.size());
  for (size_t i = 0; i < known.size(); ++i) {
    if (known[i]) targets[i] = call.workers[i];
  }
  caf::actor_addr me = self->address();
  internal::fan_out(std::move(targets), std::move(labels), std::move(call.requests),
                    self->state.env.host, [me, caller, call_id](AgentCallReply reply) {
                      if (auto agent = caf::actor_cast<caf::actor>(me)) {
                        caf::send_as(agent, caller, reply_atom::value, call_id, std::move(reply));
                      }
                    });
}

// Note [Late replies]: the driver dropped an answer; free the payloads it carried (only ones
// this process owns: the agent never does network I/O in its actor).
void on_release(Agent self, const std::vector<PayloadHandle>& handles) {
  if (!check_sender(self).ok()) return;
  DataPlane& dp = *self->state.env.data_plane;
  for (const PayloadHandle& h : handles) {
    if (dp.is_local(h)) (void)dp.release(h);
  }
}

// A hosted worker ended: report it. A driver's hub ended: stop that driver's workers.
void on_down(Agent self, const caf::down_msg& dm) {
  auto w = self->state.workers.find(dm.source);
  if (w != self->state.workers.end()) {
    const Hosted& h = w->second;
    std::string reason = caf::to_string(dm.reason);
    spdlog::warn("agent: {} of group '{}' terminated: {}", describe_worker(h.context),
                 h.context.group, reason);
    auto r = self->state.reporters.find(h.owner);
    if (r != self->state.reporters.end()) {
      self->send(r->second, down_atom::value,
                 WorkerDown{h.context.group, h.context.rank, h.context.host, reason});
    }
    if (self->state.env.channel) self->state.env.channel->remove_worker(dm.source.id());
    self->state.workers.erase(w);
    return;
  }
  auto rn = self->state.reporter_nodes.find(dm.source);
  if (rn == self->state.reporter_nodes.end()) return;
  std::string node = rn->second;
  spdlog::warn("agent: driver (node {}) is gone; stopping its workers", node);
  for (auto& [addr, h] : self->state.workers) {
    if (h.owner == node) self->send_exit(h.actor, caf::exit_reason::user_shutdown);
  }
  if (self->state.env.channel) self->state.env.channel->end_session(node);
  self->state.reporters.erase(node);
  self->state.authenticated.erase(node);
  self->state.reporter_nodes.erase(rn);
}

caf::behavior agent_behavior(Agent self, AgentEnv env) {
  self->state.env = std::move(env);
  self->set_down_handler([=](caf::down_msg& dm) { on_down(self, dm); });
  self->set_exit_handler([=](caf::exit_msg& msg) {
    for (auto& [addr, h] : self->state.workers) self->send_exit(h.actor, msg.reason);
    self->quit(msg.reason);
  });
  return {
      [=](hello_atom, const std::string& nonce) { return on_hello(self, nonce); },
      [=](auth_atom, const std::string& proof, const caf::actor& hub) {
        return on_auth(self, proof, hub);
      },
      [=](info_atom) -> caf::result<AgentInfo> {
        Status st = check_sender(self);
        if (!st.ok()) return to_caf_error(st);
        return agent_info(self);
      },
      [=](caf::spawn_atom, SpawnRequest& req) { return on_spawn(self, std::move(req)); },
      [=](call_atom, uint64_t call_id, AgentCall& call) { on_call(self, call_id, call); },
      [=](release_atom, const std::vector<PayloadHandle>& handles) { on_release(self, handles); },
      [=](rdzv_atom) -> caf::result<uint16_t> {
        Status st = check_sender(self);
        if (!st.ok()) return to_caf_error(st);
        Result<uint16_t> port = proto::pick_free_port("0.0.0.0");  // Note [Ports outside the ephemeral range]
        if (!port.ok()) return to_caf_error(port.status());
        return *port;
      },
  };
}

}  // namespace

caf::actor spawn_agent_actor(caf::actor_system& system, AgentEnv env) {
  return system.spawn(agent_behavior, std::move(env));
}

}  // namespace tessera::runtime
