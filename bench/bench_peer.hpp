// bench_peer.hpp: the two-process harness bench_collective and bench_fsdp share. The benchmark
// process is rank 0; its peer (rank 1) is the same binary re-executed with <peer_env>=<port> in
// its environment and stdout sent to /dev/null, so the benchmark JSON on rank 0's stdout stays
// clean. Header-only, no gtest: benchmarks include it directly.
#pragma once

#include <fcntl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include <benchmark/benchmark.h>

#include "proto/free_port.hpp"

namespace tessera::bench {

/// A TCP port for the peers' rendezvous (Note [Ports outside the ephemeral range]).
inline int free_loopback_port() {
  Result<uint16_t> port = proto::pick_free_port("0.0.0.0");
  if (!port.ok()) {
    std::fprintf(stderr, "%s\n", port.status().to_string().c_str());
    std::exit(2);
  }
  return *port;
}

/// Forks the peer: the child re-executes /proc/self/exe with `peer_env`=<port> set and stdout on
/// /dev/null (exit 127 if exec fails). Returns the child's pid in the parent.
inline pid_t spawn_peer(const char* peer_env, int port) {
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::setenv(peer_env, std::to_string(port).c_str(), 1);
  int devnull = ::open("/dev/null", O_WRONLY);
  ::dup2(devnull, STDOUT_FILENO);
  const char* argv[] = {"/proc/self/exe", nullptr};
  ::execv("/proc/self/exe", const_cast<char* const*>(argv));
  ::_exit(127);
}

/// Rank 0's side of a launched pair: the rendezvous port and the peer's pid.
struct PeerLaunch {
  int port = 0;
  pid_t peer = 0;
};

/// Rank 0's start of main(): initialises Google Benchmark (nullopt, like its own mains' return 1,
/// on an unrecognised argument), then picks a free port and spawns the peer on it.
inline std::optional<PeerLaunch> init_and_spawn_peer(int* argc, char** argv, const char* peer_env) {
  benchmark::Initialize(argc, argv);
  if (benchmark::ReportUnrecognizedArguments(*argc, argv)) return std::nullopt;
  PeerLaunch launch;
  launch.port = free_loopback_port();
  launch.peer = spawn_peer(peer_env, launch.port);
  return launch;
}

/// Waits for the peer and returns rank 0's exit code: `rc` when it is non-zero or the peer exited
/// 0, else `peer_failed_rc`.
inline int wait_peer(pid_t peer, int rc, int peer_failed_rc) {
  int status = 0;
  ::waitpid(peer, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = rc ? rc : peer_failed_rc;
  return rc;
}

}  // namespace tessera::bench
