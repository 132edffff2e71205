// errors.hpp (internal): the Status an exception caught inside the FSDP engine becomes.
#pragma once

#include <exception>

#include "proto/status.hpp"

namespace tessera::fsdp::internal {

/// `where: <first line of the message>`; LibTorch's out-of-memory error is resource_exhausted
/// (with the allocator's sizes, without its advice), anything else internal.
Status from_exception(const char* where, const std::exception& e);

}  // namespace tessera::fsdp::internal
