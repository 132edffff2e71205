// actor_system.cpp: CAF bootstrap and Note [Bounded shutdown].
#include "runtime/actor_system.hpp"

#include <chrono>
#include <fstream>
#include <thread>

#include <caf/io/middleman.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/send.hpp>
#include <spdlog/spdlog.h>

#include "runtime/errors.hpp"
#include "runtime/messages.hpp"

namespace tessera::runtime {
namespace {

std::string render_error(uint8_t code, caf::atom_value, const caf::message& context) {
  std::string text = "tessera " + to_string(static_cast<errc>(code));
  if (context.match_elements<std::string>()) text += ": " + context.get_as<std::string>(0);
  return text;
}

// Note [TLS in CAF 0.17]: CAF's openssl module, once given any certificate, key or CA file,
// requires a certificate chain valid under the CA file from BOTH sides of every connection
// (SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT) and checks the chain only, not the host
// name. Without a CA file it loads no trust store, so every peer would be refused: all three
// files are required together.
// CAF reads the TLS files only when the first connection comes (and then fails that
// connection): check them at start-up instead, so a typo is a one-line error naming the file.
Status check_pem_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::not_found, "TLS {} '{}' cannot be read", what, path);
  std::string head(4096, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  if (head.find("-----BEGIN ") == std::string::npos) {
    return make_error(ErrorCode::invalid_argument, "TLS {} '{}' is not a PEM file", what, path);
  }
  return Status();
}

Status configure_tls(const RuntimeConfig& config, const ActorSystemOptions& options,
                     caf::actor_system_config& cfg) {
  bool any = !config.tls_cert.empty() || !config.tls_key.empty() || !config.tls_cafile.empty();
  if (!any) return Status();
  if (config.tls_cert.empty() || config.tls_key.empty() || config.tls_cafile.empty()) {
    return make_error(ErrorCode::invalid_argument,
                      "TLS needs a certificate, its key and a CA file together (cluster.tls_cert, "
                      "tls_key, tls_cafile / --tls-cert, --tls-key, --tls-cafile): CAF 0.17 "
                      "verifies both sides; got cert '{}', key '{}', CA file '{}'",
                      config.tls_cert, config.tls_key, config.tls_cafile);
  }
  if (!options.network) {
    return make_error(ErrorCode::unimplemented, "TLS requested for a process without network");
  }
  TESSERA_RETURN_IF_ERROR(check_pem_file(config.tls_cert, "certificate"));
  TESSERA_RETURN_IF_ERROR(check_pem_file(config.tls_key, "key"));
  TESSERA_RETURN_IF_ERROR(check_pem_file(config.tls_cafile, "CA file"));
  cfg.load<caf::openssl::manager>();
  cfg.openssl_certificate = config.tls_cert;
  cfg.openssl_key = config.tls_key;
  cfg.openssl_cafile = config.tls_cafile;
  return Status();
}

}  // namespace

Status configure_actor_system(const RuntimeConfig& config, const ActorSystemOptions& options,
                              caf::actor_system_config& cfg) {
  cfg.add_message_types<caf::id_block::tessera>();
  cfg.add_error_category(kErrorCategory, render_error);
  std::string policy = options.testing ? "testing" : config.scheduler_policy;
  cfg.set("scheduler.policy", caf::atom_from_string(policy));
  cfg.set("scheduler.max-threads", static_cast<size_t>(std::max(1, config.scheduler_max_threads)));
  cfg.set("logger.verbosity", caf::atom("quiet"));
  cfg.set("logger.console", caf::atom("none"));
  if (options.network) {
    cfg.load<caf::io::middleman>();
    cfg.set("middleman.heartbeat-interval", caf::timespan{config.heartbeat_interval});
    cfg.set("middleman.connection-timeout", caf::timespan{config.connection_timeout});
  }
  return configure_tls(config, options, cfg);
}

Result<std::unique_ptr<ActorSystem>> ActorSystem::start(const RuntimeConfig& config,
                                                        const ActorSystemOptions& options) {
  std::unique_ptr<ActorSystem> out(new ActorSystem());
  out->config_ = config;
  out->cfg_ = std::make_unique<caf::actor_system_config>();
  TESSERA_RETURN_IF_ERROR(configure_actor_system(config, options, *out->cfg_));
  out->tls_ = !config.tls_cert.empty();
  out->testing_ = options.testing;
  try {
    out->system_ = std::make_unique<caf::actor_system>(*out->cfg_);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, "cannot start the CAF actor system: {}", e.what());
  }
  return out;
}

void ActorSystem::track(const caf::actor& actor) {
  std::lock_guard<std::mutex> lock(mutex_);
  tracked_.push_back(actor);
}

// Note [Bounded shutdown]: see the header. Polling the registry's running count is the only
// bounded wait CAF 0.17 offers (await_running_count_equal has no timeout).
bool ActorSystem::shutdown() {
  std::vector<caf::actor> actors;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopped_) return clean_;
    stopped_ = true;
    actors.swap(tracked_);
  }
  for (auto& a : actors) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  actors.clear();
  auto deadline = std::chrono::steady_clock::now() + config_.shutdown_timeout;
  while (system_->registry().running() > 0 && std::chrono::steady_clock::now() < deadline) {
    if (testing_) {
      dynamic_cast<caf::scheduler::test_coordinator&>(system_->scheduler()).run();
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  size_t left = system_->registry().running();
  if (left > 0) {
    spdlog::error("runtime shutdown: {} actor(s) still running after {} ms; abandoning them",
                  left, config_.shutdown_timeout.count());
    clean_ = false;
  }
  return clean_;
}

ActorSystem::~ActorSystem() {
  if (!system_) return;
  if (!shutdown()) {
    (void)system_.release();  // Note [Bounded shutdown]: never block in the destructor.
    (void)cfg_.release();
  }
}

}  // namespace tessera::runtime
