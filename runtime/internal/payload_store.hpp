// payload_store.hpp: the payloads one process serves, with their lifetimes (private).
//
// Each entry is a DataProto (tensors held by reference: publishing copies nothing) plus the
// number of consuming fetches still expected. A consuming fetch decrements it; at zero the
// entry is dropped, and so are its tensors once the last in-flight send finishes with them.
// `remaining == 0` at publish means "until released". release() drops an entry at once.
//
// Thread-safety: all methods are safe to call concurrently.
#pragma once

#include <cstdint>
#include <mutex>
#include <random>
#include <unordered_map>

#include "proto/data_proto.hpp"
#include "proto/status.hpp"

namespace tessera::runtime::internal {

/// id -> payload, thread-safe.
class PayloadStore {
 public:
  /// What put() assigned.
  struct Ticket {
    uint64_t id;
    uint64_t key;
    uint64_t bytes;
  };

  /// Stores `data`; `consumers` consuming fetches drop it (0: only release() does).
  Ticket put(proto::DataProto data, uint32_t consumers);
  /// The payload (shallow copy). With `consume`, counts one consumer. Errors: unknown id or
  /// wrong key (both not_found: a wrong key must not reveal that the id exists).
  Result<proto::DataProto> get(uint64_t id, uint64_t key, bool consume);
  /// Drops the payload. not_found if absent (already consumed or released).
  Status release(uint64_t id, uint64_t key);

  size_t count() const;
  uint64_t bytes() const;

 private:
  struct Entry {
    proto::DataProto data;
    uint64_t key;
    uint64_t bytes;
    uint32_t remaining;  // 0: until released
  };

  mutable std::mutex mutex_;
  std::unordered_map<uint64_t, Entry> entries_;
  uint64_t next_id_ = 1;
  uint64_t total_bytes_ = 0;
  std::mt19937_64 rng_{std::random_device{}()};
};

/// Sum of the tensors' byte sizes.
uint64_t tensor_bytes(const proto::DataProto& data);

}  // namespace tessera::runtime::internal
