// data_plane.hpp: moves DataProto payloads between processes, outside CAF.
//
// Every process (driver, agent) runs one DataPlane: a Boost.Asio server on a TCP port and on an
// abstract Unix socket, plus the PayloadStore of what this process serves. publish() stores a
// DataProto (copying nothing) and returns a PayloadHandle that a CAF message can carry; whoever
// holds the handle pulls the payload, or a row slice of it, with fetch():
//   * owner is this process -> the stored DataProto itself (views, no bytes copied);
//   * owner on the same machine -> the receiver lends the owner one of its pooled memfd
//     segments over the Unix socket, the owner writes the frame into it (one copy, into memory
//     already mapped on both sides) and the receiver decodes in place
//     (Note [Landing segments] in runtime/internal/shm_pool.hpp);
//   * otherwise -> the frame over TCP, written with scatter/gather straight from tensor memory,
//     read into one aligned buffer and decoded zero-copy.
// Wire details: Note [Data plane protocol] in runtime/internal/dp_protocol.hpp. A garbage or
// truncated request closes that one connection with a logged error; the server keeps serving.
//
// Lifetimes: a payload published for `consumers` consuming fetches is dropped after the last
// one; one published with consumers == 0 lives until release(). So memory stays bounded by
// what is published and not yet consumed or released (stats().payload_bytes).
//
// Thread-safety: every method may be called from any thread. fetch() blocks the calling
// thread (at most DataPlaneConfig::io_timeout).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "proto/data_proto.hpp"
#include "proto/status.hpp"
#include "runtime/config.hpp"
#include "runtime/messages.hpp"

namespace tessera::runtime {

namespace internal {
class PayloadStore;
class DataPlaneServer;
class DataPlaneClient;
}  // namespace internal

/// Counters of what moved, for tests ("which bytes moved") and benchmarks.
struct DataPlaneStats {
  uint64_t payloads = 0;          ///< Payloads currently stored.
  uint64_t payload_bytes = 0;     ///< Their tensor bytes.
  uint64_t served_tcp_bytes = 0;  ///< Frame bytes this server wrote to TCP/Unix sockets.
  uint64_t served_shm_bytes = 0;  ///< Frame bytes this server handed over as memfds.
  uint64_t fetched_remote_bytes = 0;  ///< Frame bytes this process fetched from other processes.
  uint64_t local_fetches = 0;     ///< fetch() calls answered from this process's own store.
  uint64_t remote_fetches = 0;    ///< fetch() calls that went to another process.
  uint64_t bad_requests = 0;      ///< Connections closed for a garbage or truncated request.
  // Shared-memory caches (Note [Landing segments]); bounded by DataPlaneConfig.
  uint64_t landing_idle_bytes = 0;          ///< Idle landing segments kept (<= landing_idle_bytes).
  uint64_t landing_idle_segments = 0;       ///< How many.
  uint64_t landing_segments_created = 0;    ///< Landing segments created so far.
  uint64_t landing_segments_destroyed = 0;  ///< Landing segments unmapped and closed so far.
  uint64_t peer_mapped_bytes = 0;       ///< Peers' segments kept mapped (<= peer_mapping_bytes).
  uint64_t peer_mappings = 0;           ///< How many.
  uint64_t peer_mappings_evicted = 0;   ///< Dropped from the cache to honour its cap.
};

/// One process's payload server and client.
class DataPlane {
 public:
  /// Binds the TCP server (config.bind_host:config.port) and the Unix socket, starts the
  /// server threads. Errors name the address that could not be bound.
  static Result<std::unique_ptr<DataPlane>> start(const DataPlaneConfig& config);
  ~DataPlane();  ///< Stops the server threads; outstanding handles become unfetchable.

  DataPlane(const DataPlane&) = delete;
  DataPlane& operator=(const DataPlane&) = delete;

  /// Random id of this instance (PayloadHandle::owner).
  uint64_t owner() const { return owner_; }
  /// Address put in handles.
  const std::string& host() const { return host_; }
  /// The bound TCP port.
  uint16_t port() const;

  /// Stores `data` and returns its handle. `consumers` consuming fetches drop it; 0 means it
  /// lives until release().
  PayloadHandle publish(proto::DataProto data, uint32_t consumers);
  /// Pulls rows [slice.row_begin, slice.row_end) of a payload (from this process, shared
  /// memory or TCP). With `consume`, counts as one of the payload's consumers. Errors name the
  /// payload and its owner's address: not_found (consumed, released, owner restarted),
  /// unavailable (owner unreachable), timeout, corrupt_data (a bad frame).
  Result<proto::DataProto> fetch(const PayloadSlice& slice, bool consume);
  /// fetch() of several slices, the remote ones concurrently. Results in input order.
  std::vector<Result<proto::DataProto>> fetch_all(const std::vector<PayloadSlice>& slices,
                                                  bool consume);
  /// Drops a payload here or at its owner. not_found if it is already gone.
  Status release(const PayloadHandle& handle);

  /// True if this process owns `handle`.
  bool is_local(const PayloadHandle& handle) const { return handle.owner == owner_; }
  /// A handle slice covering every row.
  static PayloadSlice whole(const PayloadHandle& handle) {
    return PayloadSlice{handle, 0, handle.rows};
  }

  /// Current counters.
  DataPlaneStats stats() const;

  /// Shared counters (the server and the client update them).
  struct Counters {
    std::atomic<uint64_t> served_tcp_bytes{0};
    std::atomic<uint64_t> served_shm_bytes{0};
    std::atomic<uint64_t> fetched_remote_bytes{0};
    std::atomic<uint64_t> local_fetches{0};
    std::atomic<uint64_t> remote_fetches{0};
    std::atomic<uint64_t> bad_requests{0};
  };

 private:
  DataPlane() = default;

  DataPlaneConfig config_;
  uint64_t owner_ = 0;
  std::string host_;
  std::unique_ptr<internal::PayloadStore> store_;
  std::unique_ptr<Counters> counters_;
  std::unique_ptr<internal::DataPlaneServer> server_;
  std::unique_ptr<internal::DataPlaneClient> client_;
};

}  // namespace tessera::runtime
