// dp_server.hpp: the data plane's Asio server (private to runtime/).
//
// Accepts on TCP and on an abstract Unix socket ("\0tessera-dp-<owner hex>"); each connection
// is a Session that answers requests one at a time (Note [Data plane protocol]).
//
// Thread-safety: constructed and destroyed by DataPlane; the io threads own the sessions.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>

#include "proto/codec.hpp"
#include "proto/status.hpp"
#include "runtime/config.hpp"
#include "runtime/data_plane.hpp"
#include "runtime/internal/dp_protocol.hpp"
#include "runtime/internal/payload_store.hpp"
#include "runtime/internal/shm_pool.hpp"

namespace tessera::runtime::internal {

/// Frames at least this big go through a memfd on Unix-socket connections.
inline constexpr uint64_t kShmMinBytes = 256 * 1024;

/// Abstract Unix socket name of the data plane with this owner id (leading NUL included).
std::string unix_socket_name(uint64_t owner);

/// The server half of a DataPlane.
class DataPlaneServer {
 public:
  /// Binds and starts `config.io_threads` threads. Errors name the address.
  static Result<std::unique_ptr<DataPlaneServer>> start(const DataPlaneConfig& config,
                                                        uint64_t owner, PayloadStore& store,
                                                        DataPlane::Counters& counters);
  ~DataPlaneServer();

  uint16_t port() const { return port_; }

  /// Looks up, checks and encodes what `request` asks for (used by sessions).
  Result<proto::EncodedFrame> serve_fetch(const Request& request);
  /// Handles a release request.
  Status serve_release(const Request& request);

  const DataPlaneConfig& config() const { return config_; }
  DataPlane::Counters& counters() { return counters_; }
  MappingCache& mappings() { return mappings_; }

 private:
  DataPlaneServer(const DataPlaneConfig& config, uint64_t owner, PayloadStore& store,
                  DataPlane::Counters& counters);
  void accept_tcp();
  void accept_unix();

  DataPlaneConfig config_;
  uint64_t owner_;
  PayloadStore& store_;
  DataPlane::Counters& counters_;
  MappingCache mappings_;
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor tcp_acceptor_;
  boost::asio::local::stream_protocol::acceptor unix_acceptor_;
  uint16_t port_ = 0;
  std::vector<std::thread> threads_;
};

}  // namespace tessera::runtime::internal
