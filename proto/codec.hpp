// codec.hpp: the DataProto wire format (Note [Wire format] in proto/codec_encode.cpp).
//
// A frame is a 32-byte prefix, a Cap'n Proto header (keys, dtypes, shapes, piece offsets and
// lengths, non-tensor values, meta_info as JSON text) and the raw tensor bytes, each piece
// 64-byte aligned. Only proto/ sees the Cap'n Proto schema; everyone else uses this API.
//
//   encode()  copies no tensor bytes: it returns a scatter/gather list of segments (the header,
//             then pointers into tensor memory) for writev, or flatten() into one buffer.
//   decode()  is zero-copy: tensors are from_blob views on the Buffer that keep it alive.
//             Untrusted bytes never crash or over-read; every malformed frame is a Status error
//             (corrupt_data) saying what is wrong.
//
// Thread-safety: free functions; an EncodedFrame may be read from several threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "proto/buffer.hpp"
#include "proto/data_proto.hpp"
#include "proto/status.hpp"

namespace tessera::proto {

/// Size of the fixed frame prefix (magic, version, header length, data length).
inline constexpr size_t kFramePrefixBytes = 32;
/// Default largest tensor piece: the largest multiple of 64 below Cap'n Proto's Data limit
/// (2^29 - 1 bytes); it also keeps every iovec far below Linux's 2 GiB per-write cap.
inline constexpr uint64_t kDefaultMaxPieceBytes = (uint64_t{1} << 29) - 64;

/// Options of encode().
struct EncodeOptions {
  /// Tensors larger than this are listed as several pieces. Rounded down to a multiple of 64,
  /// at least 64. Tests lower it to exercise splitting.
  uint64_t max_piece_bytes = kDefaultMaxPieceBytes;
};

/// Limits applied by decode() to untrusted frames.
struct DecodeOptions {
  /// Largest accepted Cap'n Proto header. Cap'n Proto's traversal limit is derived from the
  /// actual header size (Note [Decode limits] in proto/codec_decode.cpp).
  uint64_t max_header_bytes = uint64_t{1} << 30;
  /// Largest accepted tensor rank.
  int64_t max_ndim = 64;
  /// Deepest accepted nesting of meta_info / JSON column values.
  int64_t max_json_depth = 128;
};

/// One contiguous piece of a frame, for writev (segments are written in order).
struct FrameSegment {
  const uint8_t* data;
  size_t size;
};

/// The result of encode(): segments that together are one frame. Holds the header bytes and
/// references to the (contiguous) tensors, so the segments stay valid while it lives.
/// REQUIRES: the encoded tensors are not written to until the frame has been sent.
class EncodedFrame {
 public:
  /// The segments in order; their sizes sum to size(). Count grows with the tensor pieces,
  /// so a transport must batch writev calls by IOV_MAX.
  const std::vector<FrameSegment>& segments() const { return segments_; }
  /// Total frame size in bytes.
  size_t size() const { return size_; }
  /// Copies the frame into `dst` in one pass. REQUIRES: dst holds size() bytes.
  void flatten_into(uint8_t* dst) const;
  /// A new aligned Buffer holding the whole frame.
  Result<std::shared_ptr<Buffer>> flatten() const;

 private:
  friend class FrameBuilder;
  std::vector<FrameSegment> segments_;
  size_t size_ = 0;
  std::shared_ptr<const std::vector<uint8_t>> header_;  // prefix + capnp header + padding
  std::vector<at::Tensor> tensors_;                     // contiguous tensors the segments alias
};

/// What a frame prefix announces: lets a transport size the receive buffer after 32 bytes.
struct FrameInfo {
  uint64_t header_bytes;  ///< Cap'n Proto header size (a multiple of 8).
  uint64_t data_offset;   ///< Offset of the tensor bytes from the frame start (64-aligned).
  uint64_t data_bytes;    ///< Tensor bytes (including alignment padding between pieces).
  uint64_t frame_bytes;   ///< Total frame size: data_offset + data_bytes.
};

/// Encodes `data` (tensors must be on CPU; non-contiguous ones are made contiguous, the only
/// copy). Errors: a tensor not on CPU or of an unsupported dtype, meta_info or a JSON value
/// that cannot be serialised (invalid UTF-8), each naming the key.
Result<EncodedFrame> encode(const DataProto& data, const EncodeOptions& options = {});

/// Parses and validates a frame prefix. REQUIRES: size >= kFramePrefixBytes is not required;
/// fewer bytes give an error. Errors: bad magic, unsupported version, absurd lengths.
Result<FrameInfo> peek_frame(const uint8_t* data, size_t size);

/// Decodes a frame occupying the whole buffer, zero-copy. Errors (corrupt_data) for any
/// malformed frame: truncation, trailing bytes, bad magic/version, corrupt header, unknown
/// dtype, shape/length disagreement, negative dims, offsets past the end, misaligned or
/// overlapping pieces, JSON too deep. REQUIRES: buffer->data() is 8-byte aligned (Buffer's
/// own allocations are 64-aligned); otherwise an error is returned.
Result<DataProto> decode(std::shared_ptr<Buffer> buffer, const DecodeOptions& options = {});

/// Copies `size` bytes into a new aligned Buffer and decodes it (for bytes of unknown alignment).
Result<DataProto> decode_copy(const void* data, size_t size, const DecodeOptions& options = {});

/// Wire dtype support: true for f32, f64, f16, bf16, i64, i32, i16, i8, u8, bool.
bool is_wire_dtype(c10::ScalarType dtype);

}  // namespace tessera::proto
