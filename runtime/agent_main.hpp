// agent_main.hpp: the `tessera agent` process body (app/cmd_agent.cpp parses the command line;
// test helper binaries call the same function with their own worker types).
//
// Start-up refuses loudly: an unreadable or group/other-accessible token file, bad devices,
// CUDA devices in a CPU build, TLS files that CAF's openssl module rejects, a busy port.
// When ready it prints ONE line to stdout and flushes it (deploy scripts and tests read it):
//   tessera agent ready listen=HOST:PORT data_plane=HOST:PORT call=PORT|off devices=cpu:0 pid=PID
// SIGTERM / SIGINT stop it: every hosted worker actor gets exit(user_shutdown), the actor system
// is given RuntimeConfig::shutdown_timeout, and the process exits (with status 1 and an error
// line if some actor did not stop in time: it never hangs).
#pragma once

#include <string>

#include "runtime/config.hpp"
#include "runtime/worker.hpp"

namespace tessera::runtime {

/// Command-line options of `tessera agent`.
struct AgentOptions {
  std::string listen = "127.0.0.1:7700";  ///< HOST:PORT for CAF (port 0: any free port).
  std::string devices = "cpu:1";          ///< parse_devices() syntax.
  std::string token_file;                 ///< Required.
  std::string tls_cert;                   ///< PEM certificate (with tls_key: TLS on).
  std::string tls_key;                    ///< PEM private key.
  std::string tls_cafile;                 ///< CA bundle to verify drivers (optional).
  std::string data_plane_listen;          ///< HOST:PORT for payloads; default: listen host, any port.
  std::string advertise_host;             ///< Host put in payload handles; default: listen host.
  /// HOST:PORT of the call channel (Note [Call channel]); default: listen host, any port;
  /// "off": none (calls go through CAF). Never offered with TLS.
  std::string call_listen;
  RuntimeConfig runtime;                  ///< Timeouts and scheduler settings.
};

/// Runs an agent until SIGTERM/SIGINT; returns the process exit status (errors are logged).
/// REQUIRES: called from the main thread before any other thread exists (it blocks the stop
/// signals so that every thread inherits the mask, then waits for them with sigwait).
int run_agent(const AgentOptions& options, const WorkerTypeRegistry& registry);

}  // namespace tessera::runtime
