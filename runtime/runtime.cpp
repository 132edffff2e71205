// runtime.cpp: the driver-side Runtime (see the header).
#include "runtime/runtime.hpp"

#include <unistd.h>

#include <set>

#include <caf/io/middleman.hpp>
#include <caf/io/middleman_actor.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "runtime/agent.hpp"
#include "runtime/auth.hpp"
#include "runtime/errors.hpp"
#include "runtime/internal/call_channel.hpp"
#include "runtime/internal/shm.hpp"
#include "runtime/wire.hpp"

namespace tessera::runtime {
namespace {

Result<std::pair<std::string, uint16_t>> split_address(const std::string& address) {
  auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return make_error(ErrorCode::invalid_argument, "agent address '{}' is not host:port", address);
  }
  try {
    int port = std::stoi(address.substr(colon + 1));
    if (port <= 0 || port > 65535) throw std::out_of_range("port");
    return std::make_pair(address.substr(0, colon), static_cast<uint16_t>(port));
  } catch (const std::exception&) {
    return make_error(ErrorCode::invalid_argument, "agent address '{}': bad port", address);
  }
}

// Connects through the middleman actor with a deadline (caf::io/openssl::remote_actor wait
// without one, and a TLS peer that rejects us can leave the handshake hanging).
Result<caf::actor> connect_actor(caf::actor_system& sys, const std::string& host, uint16_t port,
                                 bool tls, Millis timeout) {
  caf::io::middleman_actor mm =
      tls ? sys.openssl_manager().actor_handle() : sys.middleman().actor_handle();
  caf::scoped_actor self{sys};
  Status st;
  caf::actor out;
  self->request(mm, timeout, caf::connect_atom::value, host, port)
      .receive(
          [&](const caf::node_id&, caf::strong_actor_ptr& ptr, const std::set<std::string>&) {
            if (ptr) out = caf::actor_cast<caf::actor>(std::move(ptr));
            else st = make_error(ErrorCode::not_found, "nothing is published there");
          },
          [&](caf::error& e) { st = to_status(e); });
  if (st.ok()) return out;
  if (!tls) return st;
  // Note [TLS in CAF 0.17] (actor_system.cpp): a failed verification just drops the connection.
  return Status(st.code(), st.message() + " (TLS: the agent's certificate must be signed by a CA "
                "in cluster.tls_cafile, and ours by one in the agent's --tls-cafile)");
}

// Note [Agent authentication], driver side: check the agent's proof, then prove ourselves.
Result<AgentInfo> authenticate(caf::actor_system& sys, const caf::actor& agent,
                               const RuntimeConfig& cfg, const caf::actor& hub) {
  TESSERA_ASSIGN_OR_RETURN(std::string nd, random_bytes(32));
  caf::scoped_actor self{sys};
  Status st;
  std::string na;
  std::string proof;
  self->request(agent, cfg.connect_timeout, hello_atom::value, nd)
      .receive([&](std::string& n, std::string& p) { na = std::move(n), proof = std::move(p); },
               [&](caf::error& e) { st = to_status(e); });
  TESSERA_RETURN_IF_ERROR(st);
  if (!constant_time_equal(proof, agent_proof(cfg.token, nd, na))) {
    return make_error(ErrorCode::permission_denied,
                      "the agent could not prove it holds our token (tokens differ)");
  }
  AgentInfo info;
  self->request(agent, cfg.connect_timeout, auth_atom::value, driver_proof(cfg.token, na, nd), hub)
      .receive([&](AgentInfo& i) { info = std::move(i); },
               [&](caf::error& e) { st = to_status(e); });
  TESSERA_RETURN_IF_ERROR(st);
  return info;
}

}  // namespace

Result<std::unique_ptr<Runtime>> Runtime::start(const RuntimeConfig& config,
                                                const WorkerTypeRegistry& registry) {
  std::unique_ptr<Runtime> rt(new Runtime());
  rt->config_ = config;
  ActorSystemOptions options{!config.agents.empty(), false};
  TESSERA_ASSIGN_OR_RETURN(rt->actors_, ActorSystem::start(config, options));
  TESSERA_ASSIGN_OR_RETURN(rt->data_plane_, DataPlane::start(config.data_plane));
  rt->hub_ = std::make_unique<CallHub>(rt->system(), config.call_timeout, config.idle_poll);
  if (config.agents.empty()) {
    TESSERA_RETURN_IF_ERROR(rt->start_embedded(registry));
  } else {
    TESSERA_RETURN_IF_ERROR(rt->connect_agents());
  }
  return rt;
}

Status Runtime::start_embedded(const WorkerTypeRegistry& registry) {
  TESSERA_ASSIGN_OR_RETURN(std::vector<std::string> devices,
                           parse_devices(config_.embedded_devices));
  TESSERA_RETURN_IF_ERROR(check_devices_supported(devices));
  AgentEnv env;
  env.registry = &registry;
  env.data_plane = data_plane_.get();
  env.devices = devices;
  env.host = internal::host_name();
  env.trust_local_only = true;
  env.spawn_timeout = config_.spawn_timeout;
  env.inline_payload_max_bytes = config_.inline_payload_max_bytes;
  env.idle_poll = config_.idle_poll;
  caf::actor agent = spawn_agent_actor(system(), env);
  actors_->track(agent);
  AgentInfo info{env.host, internal::machine_id(), devices, static_cast<int64_t>(::getpid()),
                 "0.1.0", 0, 0, ""};
  nodes_.push_back(Node{agent, std::move(info), "embedded", true});
  return Status();
}

Status Runtime::connect_agents() {
  if (config_.token.empty()) {
    return make_error(ErrorCode::invalid_argument, "cluster.agents needs a token (token_file)");
  }
  for (const std::string& address : config_.agents) {
    TESSERA_ASSIGN_OR_RETURN(auto hp, split_address(address));
    Result<caf::actor> agent = connect_actor(system(), hp.first, hp.second, actors_->tls(),
                                                config_.connect_timeout);
    if (!agent.ok()) return agent.status().with_context("connecting to agent " + address);
    Result<AgentInfo> info = authenticate(system(), *agent, config_, hub_->actor());
    if (!info.ok()) return info.status().with_context("authenticating with agent " + address);
    hub_->watch_agent(*agent, address);
    open_call_channel(*agent, address, hp.first, *info);
    std::string transport = hub_->channel_transport(*agent);
    spdlog::info("connected to agent {} ({}, devices {}, calls through {})", address, info->host,
                 fmt::join(info->devices, ","),
                 transport.empty() ? "CAF" : "its call channel over " + transport);
    nodes_.push_back(Node{*agent, std::move(info).value(), address, false});
  }
  return Status();
}

// Note [Call channel]: used when the agent offers one and neither side has TLS. A channel that
// cannot be opened is not fatal: calls to that agent go through CAF (slower), with a warning.
void Runtime::open_call_channel(const caf::actor& agent, const std::string& address,
                                const std::string& host, const AgentInfo& info) {
  if (!config_.call_channel || actors_->tls() || info.call_port == 0) return;
  // Note [Local call socket]: same machine, and the same-host shortcuts are on.
  std::string local_socket;
  if (config_.data_plane.shared_memory && info.host_id == internal::machine_id()) {
    local_socket = internal::channel_local_socket(info.pid, info.call_port);
  }
  Status st = hub_->open_channel(agent, address, host, info.call_port, local_socket,
                                 info.call_session, info.call_key, config_.connect_timeout,
                                 config_.data_plane.max_frame_bytes);
  if (!st.ok()) {
    spdlog::warn("agent {}: {}; its calls go through CAF", address, st.message());
  }
}

Result<ResourcePool> Runtime::resource_pool(const std::vector<int>& process_on_nodes) const {
  std::vector<NodeDevices> nodes;
  for (const Node& n : nodes_) nodes.push_back(NodeDevices{n.info.host, n.address, n.info.devices});
  return ResourcePool::make(std::move(nodes), process_on_nodes);
}

Result<uint16_t> Runtime::rendezvous_port(const Node& node) {
  caf::scoped_actor self{system()};
  Status st;
  uint16_t port = 0;
  self->request(node.agent, config_.connect_timeout, rdzv_atom::value)
      .receive([&](uint16_t p) { port = p; }, [&](caf::error& e) { st = to_status(e); });
  if (!st.ok()) return st.with_context("rendezvous port from " + node.address);
  return port;
}

Runtime::~Runtime() { shutdown(); }

}  // namespace tessera::runtime
