// dp_client.hpp: the data plane's fetching half (private to runtime/).
//
// Blocking calls built on Asio async operations run on a per-thread io_context with a deadline
// (run_until), so every fetch is bounded by DataPlaneConfig::io_timeout and fetches to several
// owners overlap. Idle connections are pooled by endpoint as raw descriptors, so any thread
// can reuse them.
//
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "proto/data_proto.hpp"
#include "proto/status.hpp"
#include "runtime/config.hpp"
#include "runtime/data_plane.hpp"
#include "runtime/internal/shm_pool.hpp"
#include "runtime/messages.hpp"

namespace tessera::runtime::internal {

/// Pool of idle connected sockets (descriptors) keyed by endpoint.
class ConnectionPool {
 public:
  ~ConnectionPool();
  /// An idle descriptor for `endpoint`, or -1.
  int take(const std::string& endpoint);
  /// Returns a healthy descriptor for reuse (at most 16 idle per endpoint; extras are closed).
  void put(const std::string& endpoint, int fd);

 private:
  std::mutex mutex_;
  std::multimap<std::string, int> idle_;
};

/// Fetches from and releases at other processes' data planes.
class DataPlaneClient {
 public:
  DataPlaneClient(const DataPlaneConfig& config, DataPlane::Counters& counters)
      : config_(config), counters_(counters), landings_(config.landing_idle_bytes) {}

  /// Fetches every slice (all remote), concurrently; results in input order.
  std::vector<Result<proto::DataProto>> fetch_all(const std::vector<PayloadSlice>& slices,
                                                  bool consume);
  /// Asks the owner to drop a payload.
  Status release(const PayloadHandle& handle);

  const DataPlaneConfig& config() const { return config_; }
  DataPlane::Counters& counters() { return counters_; }
  ConnectionPool& pool() { return pool_; }
  ShmPool& landings() { return landings_; }

 private:
  DataPlaneConfig config_;
  DataPlane::Counters& counters_;
  ConnectionPool pool_;
  ShmPool landings_;
};

}  // namespace tessera::runtime::internal
