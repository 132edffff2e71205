// backends.hpp (internal): the constructors behind make_communicator's name table.
#pragma once

#include <memory>

#include "proto/status.hpp"
#include "runtime/collective/communicator.hpp"

namespace tessera::collective::internal {

/// Threads of one process; rendezvous through a process-wide registry keyed by inproc_key.
Result<std::shared_ptr<Communicator>> make_inproc_communicator(const CommunicatorOptions& options);

/// c10d ProcessGroupGloo over a TCPStore served by rank 0.
Result<std::shared_ptr<Communicator>> make_gloo_communicator(const CommunicatorOptions& options);

#ifdef TESSERA_WITH_CUDA
/// Raw NCCL; the unique id travels through a TCPStore served by rank 0.
Result<std::shared_ptr<Communicator>> make_nccl_communicator(const CommunicatorOptions& options);
#endif

/// "(rank r of n, group g)" used in every error message.
std::string rank_context(int rank, int size, const std::string& group);

/// "peer rank 3" or "peer ranks 0,2".
std::string describe_peers(const std::vector<int>& ranks);

/// One line of an exception's message (c10::Error without its backtrace).
std::string first_line(const std::exception& e);

/// The dtype reductions accumulate in: fp32 for half/bfloat16, otherwise the dtype itself.
at::ScalarType accumulate_dtype(at::ScalarType dtype);

}  // namespace tessera::collective::internal
