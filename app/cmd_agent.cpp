// `tessera agent`: the node agent (runtime::run_agent does the work; this file maps flags).
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <memory>

#include "app/commands.hpp"
#include "runtime/agent_main.hpp"
#include "app/worker_types.hpp"

namespace tessera::app {

void add_agent_commands(CLI::App& app) {
  auto opts = std::make_shared<runtime::AgentOptions>();
  auto shutdown_s = std::make_shared<double>(5.0);
  auto heartbeat_ms = std::make_shared<int64_t>(opts->runtime.heartbeat_interval.count());
  auto connection_timeout_ms = std::make_shared<int64_t>(opts->runtime.connection_timeout.count());
  auto idle_poll_us = std::make_shared<int64_t>(opts->runtime.idle_poll.count());
  CLI::App* cmd = app.add_subcommand(
      "agent", "Run a node agent: authenticate drivers, spawn worker actors on this node's devices");
  cmd->add_option("--listen", opts->listen, "HOST:PORT for drivers (port 0: any)")
      ->capture_default_str();
  cmd->add_option("--devices", opts->devices, "cpu:N | cuda:A-B (comma-separated list)")
      ->capture_default_str();
  cmd->add_option("--token-file", opts->token_file,
                  "Shared secret (mode 600); drivers must hold the same token")
      ->required();
  cmd->add_option("--tls-cert", opts->tls_cert, "PEM certificate: TLS for driver connections");
  cmd->add_option("--tls-key", opts->tls_key, "PEM private key of --tls-cert");
  cmd->add_option("--tls-cafile", opts->tls_cafile,
                  "CA bundle to verify drivers' certificates (required with --tls-cert/--tls-key)");
  cmd->add_option("--data-plane-listen", opts->data_plane_listen,
                  "HOST:PORT for payload transfers (default: --listen host, any port)");
  cmd->add_option("--call-listen", opts->call_listen,
                  "HOST:PORT for the call channel (default: --listen host, any port), also "
                  "offered to same-host drivers on an abstract Unix socket ('off': calls go "
                  "through CAF; never offered with TLS)");
  cmd->add_option("--advertise-host", opts->advertise_host,
                  "Host name or IP that drivers and peers use to reach this node");
  cmd->add_option("--shutdown-timeout-s", *shutdown_s, "Grace period for workers on SIGTERM")
      ->capture_default_str();
  cmd->add_option("--heartbeat-ms", *heartbeat_ms, "Heartbeat interval towards drivers (0: off)")
      ->capture_default_str();
  cmd->add_option("--connection-timeout-ms", *connection_timeout_ms,
                  "A silent driver connection is dropped after this long")
      ->capture_default_str();
  cmd->add_option("--idle-poll-us", *idle_poll_us,
                  "An idle worker polls this long for the next call before sleeping (0: never)")
      ->check(CLI::Range(int64_t{0}, int64_t{1000000}))
      ->capture_default_str();
  cmd->callback([opts, shutdown_s, heartbeat_ms, connection_timeout_ms, idle_poll_us] {
    opts->runtime.shutdown_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(*shutdown_s * 1000));
    opts->runtime.heartbeat_interval = std::chrono::milliseconds(*heartbeat_ms);
    opts->runtime.connection_timeout = std::chrono::milliseconds(*connection_timeout_ms);
    opts->runtime.idle_poll = std::chrono::microseconds(*idle_poll_us);
    exit_code() = runtime::run_agent(*opts, worker_types());
  });
}

}  // namespace tessera::app
