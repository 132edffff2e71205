// store.hpp (internal): TCPStore rendezvous shared by the Gloo and NCCL backends.
#pragma once

#include <chrono>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "proto/status.hpp"
#include "runtime/collective/communicator.hpp"

namespace tessera::collective::internal {

/// Connects to (rank 0: serves) the TCPStore at master_addr:master_port.
Result<c10::intrusive_ptr<c10d::Store>> connect_tcp_store(const CommunicatorOptions& options);

/// Sets "<prefix>/join/<rank>" and waits for all `size` ranks' keys; on timeout the error names
/// the ranks whose key is missing ("peer rank 1 did not join within 300 ms").
Status wait_for_joins(c10d::Store& store, const std::string& prefix, int rank, int size,
                      std::chrono::milliseconds timeout);

/// True when a library message reads like a timeout (Gloo/TCPStore wording varies).
bool mentions_timeout(const std::string& message);

}  // namespace tessera::collective::internal
