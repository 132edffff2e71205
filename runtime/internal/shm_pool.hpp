// shm_pool.hpp: reusable shared-memory "landing" segments (private to runtime/).
//
// Note [Landing segments]
// Fresh shared memory is expensive here: populating a new 256 MiB memfd costs ~8x a memcpy of
// it (page allocation and zeroing), and so does tearing it down. So a same-host fetch lands in
// memory that is already allocated and already mapped on both sides:
//   * the RECEIVER owns a ShmPool of memfd segments, mapped once in its address space; a fetch
//     leases one, the decoded tensors alias it, and it returns to the pool when the last tensor
//     (the Buffer) goes away;
//   * the receiver passes the segment's descriptor to the owner (SCM_RIGHTS); the OWNER keeps a
//     MappingCache of such segments keyed by inode, so after the first transfer it writes into
//     an existing mapping: one memcpy, no page faults on either side.
// Both caches are bounded (DataPlaneConfig::landing_idle_bytes, peer_mapping_bytes): a segment
// returned to a full pool is destroyed, and the mapping cache unmaps LRU entries (down to none:
// a segment bigger than the whole cap stays mapped only while its transfer holds it).
// Segments are sealed against shrinking (F_SEAL_SHRINK) and the owner maps only such sealed
// memfds, so a peer cannot make the owner's writes fault (SIGBUS) by truncating its segment.
// A segment is reused only after the receiver's last tensor on it died, and the owner writes
// into a segment only while serving the fetch that lent it, so reuse never overwrites live data.
// A transfer that failed midway poisons its segment: it is destroyed, not reused.
//
// Thread-safety: both classes are safe to use from several threads.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "proto/buffer.hpp"
#include "proto/status.hpp"

namespace tessera::runtime::internal {

/// A leased landing segment: `buffer` covers the requested bytes; `fd` stays owned by the pool.
struct Landing {
  std::shared_ptr<proto::Buffer> buffer;
  int fd = -1;
  /// Set when a transfer into it failed midway: the peer might still write, so the segment is
  /// destroyed instead of reused when the buffer dies.
  std::shared_ptr<std::atomic<bool>> poisoned;
};

/// What a ShmPool holds and has done (tests check the caps through these).
struct ShmPoolStats {
  uint64_t idle_bytes = 0;     ///< Capacity of the idle segments kept for reuse.
  uint64_t idle_segments = 0;  ///< How many idle segments are kept.
  uint64_t created = 0;        ///< Segments created so far.
  uint64_t destroyed = 0;      ///< Segments unmapped and closed so far.
};

/// What a MappingCache holds and has done.
struct MappingCacheStats {
  uint64_t mapped_bytes = 0;  ///< Bytes of the cached peer segments.
  uint64_t mappings = 0;      ///< Cached peer segments.
  uint64_t evicted = 0;       ///< Entries dropped to honour the cap (unmapped once unused).
};

/// The receiver's pool of memfd segments.
class ShmPool {
 public:
  /// Keeps at most `max_idle_bytes` of idle segments; more are destroyed on return.
  explicit ShmPool(uint64_t max_idle_bytes);
  ~ShmPool();  ///< Idle segments are destroyed; leased ones when their Buffer dies.

  /// A segment of at least `bytes` (an idle one of up to 1.25x, else a new one).
  Result<Landing> acquire(uint64_t bytes);
  /// Current counters.
  ShmPoolStats stats() const;

  struct State;  // shared with the leases' release callbacks

 private:
  std::shared_ptr<State> state_;
};

/// The owner's cache of mapped receiver segments.
class MappingCache {
 public:
  /// A mapped segment; unmapped when the last holder lets go.
  struct Mapping {
    uint8_t* addr = nullptr;
    uint64_t size = 0;
    ~Mapping();
  };

  explicit MappingCache(uint64_t max_mapped_bytes) : max_bytes_(max_mapped_bytes) {}

  /// The mapping of memfd `fd` (at least `min_bytes` long), from the cache when this segment
  /// was seen before. Always closes `fd`. Errors: not a shrink-sealed memfd, too small, mmap.
  Result<std::shared_ptr<Mapping>> map(int fd, uint64_t min_bytes);
  /// Current counters.
  MappingCacheStats stats() const;

 private:
  using Key = std::pair<dev_t, ino_t>;
  mutable std::mutex mutex_;
  uint64_t max_bytes_;
  uint64_t bytes_ = 0;
  uint64_t evicted_ = 0;
  std::list<Key> lru_;  // front: most recent
  std::map<Key, std::pair<std::shared_ptr<Mapping>, std::list<Key>::iterator>> entries_;
};

}  // namespace tessera::runtime::internal
