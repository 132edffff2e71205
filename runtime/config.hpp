// config.hpp: RuntimeConfig, everything the runtime reads; passed in, never global.
//
// The driver fills it from the `cluster.*` section of its YAML config (from_json below); the
// agent from its command line. Every duration is finite: there is no "wait forever".
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "proto/status.hpp"

namespace tessera::runtime {

using Millis = std::chrono::milliseconds;

/// Options of the data plane (runtime/data_plane.hpp).
struct DataPlaneConfig {
  std::string bind_host = "127.0.0.1";  ///< Address the TCP server binds ("0.0.0.0": all).
  uint16_t port = 0;                    ///< TCP port; 0 picks a free one.
  std::string advertise_host;           ///< Address put in handles; empty: bind_host.
  /// Same-host peers exchange frames through memfd, and a driver calls same-host agents
  /// through their local socket (Note [Local call socket] in runtime/internal/call_channel.hpp).
  bool shared_memory = true;
  uint64_t max_frame_bytes = uint64_t{64} << 30;  ///< Largest frame accepted from a peer.
  Millis io_timeout{60000};             ///< Per fetch: connect + request + response.
  // Note [Mapped-memory caps]: both caches pin real memory (memfd pages), per process. 512 MiB
  // each holds one 256 MiB frame's segment (258 MiB: the frame rounded up to 2 MiB) with room
  // to spare, so a 256 MiB payload going driver -> agent -> driver reuses warm segments (no
  // page faults) after its first trip, while a process pins at most 1 GiB for these caches.
  // Larger payloads still move through shared memory, in segments created for them and
  // destroyed after use (slower: fresh pages). 0 disables the cache, never shared memory.
  uint64_t landing_idle_bytes = uint64_t{512} << 20;  ///< Idle landing segments kept for reuse.
  uint64_t peer_mapping_bytes = uint64_t{512} << 20;  ///< Peers' segments kept mapped.
  int io_threads = 1;                   ///< Server threads.
};

/// Configuration of one process's runtime (driver or agent).
struct RuntimeConfig {
  // ---- cluster ---------------------------------------------------------------------------------
  /// Agents as "host:port". Empty: the embedded default (workers live in this process).
  std::vector<std::string> agents;
  /// Shared secret (the token file's contents). Required when `agents` is not empty.
  std::string token;
  /// Devices of the embedded default, "cpu:N" or "cuda:0-7" (parse_devices syntax).
  std::string embedded_devices = "cpu:1";
  /// TLS for CAF connections (CAF's openssl module); all three empty: plain TCP.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_cafile;

  // ---- actor system ----------------------------------------------------------------------------
  std::string scheduler_policy = "sharing";  ///< "sharing" halves small-message RTT here.
  int scheduler_max_threads = 2;
  Millis heartbeat_interval{500};  ///< BASP heartbeats (0 disables): catch silent partitions.
  Millis connection_timeout{4000}; ///< Drop a peer silent this long (0 disables).
  /// How long an idle worker thread, a waiting caller and a call channel's readers keep polling
  /// before they sleep (Note [Local lanes] in runtime/local_lane.hpp); 0 disables polling. It
  /// must outlast the gap between the calls of a burst: on a loaded 2-vCPU machine a 2-agent
  /// round trip measured 310 us (median) at 200, 275 at 1000, 243 at 2000.
  std::chrono::microseconds idle_poll{1000};
  /// Driver: call agents' workers over each agent's call channel when it offers one (Note
  /// [Call channel] in runtime/internal/call_channel.hpp); false, or TLS on: through CAF.
  bool call_channel = true;

  // ---- deadlines -------------------------------------------------------------------------------
  Millis call_timeout{600000};     ///< Default per-call deadline.
  Millis connect_timeout{10000};   ///< Connecting to and authenticating an agent.
  Millis spawn_timeout{120000};    ///< Spawning (and constructing) one worker actor.
  Millis shutdown_timeout{5000};   ///< Waiting for actors to stop before giving up on them.

  // ---- payloads --------------------------------------------------------------------------------
  /// A DataProto result or argument crossing processes travels inline in the CAF message when
  /// its encoded frame is at most this big; bigger ones go through the data plane.
  uint64_t inline_payload_max_bytes = 64 * 1024;
  DataPlaneConfig data_plane;

  /// Reads the `cluster` section: keys agents, token, token_file, embedded_devices, tls_cert,
  /// tls_key, tls_cafile, call_channel, call_timeout_s, connect_timeout_s, spawn_timeout_s,
  /// shutdown_timeout_s, heartbeat_interval_ms, connection_timeout_ms, idle_poll_us, scheduler_max_threads,
  /// inline_payload_max_bytes, data_plane {bind_host, port, advertise_host, shared_memory,
  /// landing_idle_bytes, peer_mapping_bytes}.
  /// An unknown key is an error naming it ("cluster.foo").
  static Result<RuntimeConfig> from_json(const nlohmann::json& cluster);
};

/// Expands "cpu:4" -> cpu:0..cpu:3, "cuda:0-7" / "cuda:2" / "cuda:0,2" -> the listed ordinals,
/// comma-joined lists of both ("cpu:2,cuda:0"). Error names the bad text.
Result<std::vector<std::string>> parse_devices(const std::string& spec);

/// Reads a shared-secret token file. Errors: missing or unreadable, readable or writable by
/// group/others (mode & 077 != 0: "chmod 600 F"), shorter than 16 bytes after trimming.
Result<std::string> read_token_file(const std::string& path);

}  // namespace tessera::runtime

namespace tessera::runtime {

/// Error if a device does not parse or this process cannot reach it (proto::require_device: a cuda
/// device needs a CUDA build that sees it). The error names the device.
Status check_devices_supported(const std::vector<std::string>& devices);

}  // namespace tessera::runtime
