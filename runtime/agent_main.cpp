// agent_main.cpp: `tessera agent` (see the header).
#include "runtime/agent_main.hpp"

#include <signal.h>
#include <unistd.h>

#include <cstdio>

#include <caf/io/middleman.hpp>
#include <caf/openssl/publish.hpp>
#include <caf/send.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "runtime/actor_system.hpp"
#include "runtime/agent.hpp"
#include "runtime/data_plane.hpp"
#include "runtime/errors.hpp"
#include "runtime/internal/call_channel.hpp"

namespace tessera::runtime {
namespace {

Result<std::pair<std::string, uint16_t>> parse_listen(const std::string& text, const char* what) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return make_error(ErrorCode::invalid_argument, "{} '{}' is not HOST:PORT", what, text);
  }
  try {
    int port = std::stoi(text.substr(colon + 1));
    if (port < 0 || port > 65535) throw std::out_of_range("port");
    return std::make_pair(text.substr(0, colon), static_cast<uint16_t>(port));
  } catch (const std::exception&) {
    return make_error(ErrorCode::invalid_argument, "{} '{}': bad port", what, text);
  }
}

// Everything the agent process owns, built in order; members destroyed in reverse.
struct AgentProcess {
  std::unique_ptr<ActorSystem> actors;
  std::unique_ptr<DataPlane> data_plane;
  std::unique_ptr<internal::ChannelServer> channel;  // stopped before the actors
  caf::actor agent;
  uint16_t port = 0;
  std::vector<std::string> devices;
};

Status configure(const AgentOptions& o, RuntimeConfig& cfg, std::vector<std::string>& devices) {
  if (o.token_file.empty()) {
    return make_error(ErrorCode::invalid_argument, "--token-file is required");
  }
  TESSERA_ASSIGN_OR_RETURN(cfg.token, read_token_file(o.token_file));
  TESSERA_ASSIGN_OR_RETURN(devices, parse_devices(o.devices));
  TESSERA_RETURN_IF_ERROR(check_devices_supported(devices));
  cfg.tls_cert = o.tls_cert;
  cfg.tls_key = o.tls_key;
  cfg.tls_cafile = o.tls_cafile;
  return Status();
}

Status start_data_plane(const AgentOptions& o, const std::string& listen_host, RuntimeConfig& cfg,
                        AgentProcess& p) {
  cfg.data_plane.bind_host = listen_host;
  if (!o.data_plane_listen.empty()) {
    TESSERA_ASSIGN_OR_RETURN(auto hp, parse_listen(o.data_plane_listen, "--data-plane-listen"));
    cfg.data_plane.bind_host = hp.first;
    cfg.data_plane.port = hp.second;
  }
  cfg.data_plane.advertise_host = o.advertise_host.empty() ? listen_host : o.advertise_host;
  if (cfg.data_plane.advertise_host == "0.0.0.0") cfg.data_plane.advertise_host.clear();
  TESSERA_ASSIGN_OR_RETURN(p.data_plane, DataPlane::start(cfg.data_plane));
  return Status();
}

// Note [Call channel]: offered only without TLS (its frames are not encrypted).
Status start_channel(const AgentOptions& o, const std::string& listen_host,
                     const RuntimeConfig& cfg, AgentProcess& p) {
  if (o.call_listen == "off") return Status();
  if (p.actors->tls()) {
    if (!o.call_listen.empty()) {
      return make_error(ErrorCode::invalid_argument, "--call-listen: the call channel is not "
                        "encrypted, so it is not offered with TLS (drop --call-listen)");
    }
    return Status();
  }
  std::pair<std::string, uint16_t> hp{listen_host, 0};
  if (!o.call_listen.empty()) {
    TESSERA_ASSIGN_OR_RETURN(hp, parse_listen(o.call_listen, "--call-listen"));
  }
  TESSERA_ASSIGN_OR_RETURN(p.channel, internal::ChannelServer::start(
                                          p.actors->system(), hp.first, hp.second,
                                          o.advertise_host.empty() ? listen_host : o.advertise_host,
                                          cfg.data_plane.max_frame_bytes, cfg.idle_poll));
  return Status();
}

Status publish(AgentProcess& p, const std::string& host, uint16_t port) {
  caf::expected<uint16_t> bound =
      p.actors->tls() ? caf::openssl::publish(p.agent, port, host.c_str(), true)
                      : p.actors->system().middleman().publish(p.agent, port, host.c_str(), true);
  if (!bound) {
    return to_status(bound.error()).with_context(fmt::format("cannot listen on {}:{}", host, port));
  }
  p.port = *bound;
  return Status();
}

Result<std::string> start(const AgentOptions& o, const WorkerTypeRegistry& registry,
                          AgentProcess& p) {
  RuntimeConfig cfg = o.runtime;
  TESSERA_RETURN_IF_ERROR(configure(o, cfg, p.devices));
  TESSERA_ASSIGN_OR_RETURN(auto listen, parse_listen(o.listen, "--listen"));
  TESSERA_ASSIGN_OR_RETURN(p.actors, ActorSystem::start(cfg, ActorSystemOptions{true, false}));
  TESSERA_RETURN_IF_ERROR(start_data_plane(o, listen.first, cfg, p));
  TESSERA_RETURN_IF_ERROR(start_channel(o, listen.first, cfg, p));
  AgentEnv env;
  env.registry = &registry;
  env.data_plane = p.data_plane.get();
  env.devices = p.devices;
  env.host = o.advertise_host.empty() ? listen.first : o.advertise_host;
  env.token = cfg.token;
  env.spawn_timeout = cfg.spawn_timeout;
  env.inline_payload_max_bytes = cfg.inline_payload_max_bytes;
  env.idle_poll = cfg.idle_poll;
  env.channel = p.channel.get();
  p.agent = spawn_agent_actor(p.actors->system(), env);
  p.actors->track(p.agent);
  TESSERA_RETURN_IF_ERROR(publish(p, listen.first, listen.second));
  return fmt::format("tessera agent ready listen={}:{} data_plane={}:{} call={} devices={} pid={}",
                     listen.first, p.port, p.data_plane->host(), p.data_plane->port(),
                     p.channel ? std::to_string(p.channel->port()) : std::string("off"),
                     fmt::join(p.devices, ","), ::getpid());
}

int wait_for_stop_signal(const sigset_t& stop) {
  int sig = 0;
  while (sigwait(&stop, &sig) != 0) {
  }
  return sig;
}

}  // namespace

int run_agent(const AgentOptions& options, const WorkerTypeRegistry& registry) {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);  // every thread started below inherits this
  AgentProcess p;
  Result<std::string> ready = start(options, registry, p);
  if (!ready.ok()) {
    spdlog::error("tessera agent: {}", ready.status().to_string());
    if (p.channel) p.channel->stop();
    if (p.actors && !p.actors->shutdown()) std::_Exit(1);
    return 2;
  }
  std::printf("%s\n", ready->c_str());
  std::fflush(stdout);
  int sig = wait_for_stop_signal(stop);
  spdlog::info("tessera agent: signal {} received; stopping hosted workers", sig);
  if (p.channel) p.channel->stop();  // no new calls; its threads no longer hold worker handles
  if (!p.actors->shutdown()) {
    spdlog::error("tessera agent: exiting with actors still running");
    std::fflush(nullptr);
    std::_Exit(1);
  }
  p.actors.reset();
  p.data_plane.reset();
  return 0;
}

}  // namespace tessera::runtime
