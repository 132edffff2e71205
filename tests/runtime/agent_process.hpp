// agent_process.hpp: starts and stops real agent processes for integration tests.
//
// The test binary re-executes itself (/proc/self/exe) with --tessera-agent; agent_test_main()
// turns that into run_agent() with the test worker types. Waiting is by poll() on the agent's
// stdout pipe (the ready line) and on a pidfd (its exit), with deadlines; nothing sleeps.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "proto/status.hpp"
#include "runtime/worker.hpp"

namespace tessera::runtime::testing {

/// One running agent process.
class AgentProcess {
 public:
  /// Starts `/proc/self/exe --tessera-agent <args>` and waits (at most 30 s) for its ready line.
  static Result<AgentProcess> start(const std::vector<std::string>& args);
  /// Starts it and returns its exit status instead (for agents that must refuse to start).
  static Result<int> run_to_exit(const std::vector<std::string>& args);

  AgentProcess() = default;
  AgentProcess(AgentProcess&& other) noexcept;
  AgentProcess& operator=(AgentProcess&& other) noexcept;
  ~AgentProcess();  ///< SIGKILLs a still-running agent and reaps it.

  /// Sends `sig`.
  void signal(int sig) const;
  /// Sends SIGSTOP and returns once the process is stopped (waitpid WUNTRACED).
  Status stop();
  /// Waits for the exit (at most `timeout`); the wait status, or timeout.
  Result<int> wait(std::chrono::milliseconds timeout);

  pid_t pid() const { return pid_; }
  /// "127.0.0.1:PORT" the agent listens on.
  const std::string& address() const { return address_; }
  /// The data plane's TCP port.
  uint16_t data_plane_port() const { return data_plane_port_; }
  /// The call channel's TCP port (Note [Call channel]); 0 if none is offered.
  uint16_t call_port() const { return call_port_; }

 private:
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  int pidfd_ = -1;
  std::string address_;
  uint16_t data_plane_port_ = 0;
  uint16_t call_port_ = 0;
};

/// Writes a 0600 token file under the test temp dir; returns its path.
std::string write_token_file(const std::string& name, const std::string& token, int mode = 0600);

/// If argv[1] is --tessera-agent, runs an agent with the worker types of `registry` and returns
/// its exit status; otherwise returns -1 (run the tests).
int agent_test_main(int argc, char** argv, const WorkerTypeRegistry& registry);

}  // namespace tessera::runtime::testing
