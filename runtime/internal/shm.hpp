// shm.hpp: shared-memory frames for same-host peers (private to runtime/).
//
// Note [Shared-memory transport]
// For a peer on the same machine the owner writes the encoded frame once into a fresh memfd
// (the only copy: the same one a socket write would make) and passes the descriptor over a
// Unix-domain socket (SCM_RIGHTS). The receiver maps it and decodes in place: its tensors alias
// the mapping, and the mapping is unmapped when the last tensor goes. A memfd has no name, so
// nothing leaks in /dev/shm when either process dies: the kernel frees it with the last
// descriptor or mapping.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "proto/buffer.hpp"
#include "proto/codec.hpp"
#include "proto/status.hpp"

namespace tessera::runtime::internal {

/// A memfd holding `frame` (the caller closes the returned descriptor). Errors name the call.
Result<int> frame_to_memfd(const proto::EncodedFrame& frame);

/// Maps `size` bytes of memfd `fd` as a Buffer (unmapped when the Buffer dies) and closes `fd`.
/// Errors: the fd is smaller than `size`, mmap fails.
Result<std::shared_ptr<proto::Buffer>> map_memfd(int fd, uint64_t size);

/// Sends `size` bytes plus descriptor `fd` on the blocking-or-not stream socket `sock`
/// (one sendmsg; retries on EAGAIN with poll up to `timeout_ms`).
Status send_with_fd(int sock, const uint8_t* data, size_t size, int fd, int timeout_ms);

/// Identity of this machine: boot id + host name. Equal ids mean shared memory can work.
const std::string& machine_id();

/// This machine's host name.
std::string host_name();

}  // namespace tessera::runtime::internal
