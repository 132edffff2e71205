// buffer.hpp: a byte buffer shared by a decoded DataProto's tensors.
//
// Zero-copy decode makes every tensor a `from_blob` view on the receive buffer whose deleter
// holds a std::shared_ptr<Buffer>; the buffer is freed when the last tensor (and the caller's
// handle) goes away. The data plane fills buffers (allocate), wraps memory it owns (wrap, e.g.
// a shared-memory segment) or maps files (map_file, used by DataProto::load).
//
// Thread-safety: the bytes are not synchronised; fill a buffer before decoding it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "proto/status.hpp"

namespace tessera::proto {

/// Alignment of Buffer::allocate and of tensor bytes inside a frame.
inline constexpr size_t kBufferAlignment = 64;

/// Contiguous bytes with an owner; always handled through std::shared_ptr<Buffer>.
class Buffer {
 public:
  /// A new, uninitialised, kBufferAlignment-aligned buffer of `size` bytes.
  /// Error (out_of_range) if the allocation fails.
  static Result<std::shared_ptr<Buffer>> allocate(size_t size);
  /// An aligned copy of `size` bytes at `data`.
  static Result<std::shared_ptr<Buffer>> copy_of(const void* data, size_t size);
  /// Wraps memory owned elsewhere; `release` runs when the Buffer dies (may be empty).
  static std::shared_ptr<Buffer> wrap(void* data, size_t size, std::function<void()> release);
  /// Maps `path` privately (copy-on-write: writes never reach the file). Errors name the path.
  static Result<std::shared_ptr<Buffer>> map_file(const std::string& path);

  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  Buffer(uint8_t* data, size_t size, std::function<void()> release)
      : data_(data), size_(size), release_(std::move(release)) {}

  uint8_t* data_;
  size_t size_;
  std::function<void()> release_;
};

}  // namespace tessera::proto
