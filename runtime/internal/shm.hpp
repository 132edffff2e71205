// shm.hpp: shared-memory frames for same-host peers (private to runtime/).
//
// Same-host transfers use memfd segments passed over Unix sockets (SCM_RIGHTS); see
// Note [Landing segments] in runtime/internal/shm_pool.hpp. A memfd has no name, so nothing
// leaks in /dev/shm when a process dies: the kernel frees it with the last descriptor/mapping.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "proto/buffer.hpp"
#include "proto/codec.hpp"
#include "proto/status.hpp"

namespace tessera::runtime::internal {

/// One non-blocking recvmsg of up to `size` bytes from stream socket `sock`: the bytes read
/// (0: none available yet). A descriptor that comes with them (SCM_RIGHTS) replaces `*fd`,
/// closing the previous one; the caller owns `*fd`. Errors: EOF (unavailable), recvmsg failure.
Result<size_t> recv_some_with_fd(int sock, uint8_t* data, size_t size, int* fd);

/// Sends `size` bytes plus descriptor `fd` on the blocking-or-not stream socket `sock`
/// (one sendmsg; retries on EAGAIN with poll up to `timeout_ms`).
Status send_with_fd(int sock, const uint8_t* data, size_t size, int fd, int timeout_ms);

/// Identity of this machine: boot id + host name. Equal ids mean shared memory can work.
const std::string& machine_id();

/// This machine's host name.
std::string host_name();

}  // namespace tessera::runtime::internal
