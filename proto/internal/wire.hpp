// internal/wire.hpp: frame constants and the dtype table shared by codec_encode/codec_decode.
// Private to proto/ (it includes the generated Cap'n Proto header).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include <c10/core/ScalarType.h>

#include "proto/wire.capnp.h"

namespace tessera::proto::internal {

/// First 8 bytes of every frame.
inline constexpr char kFrameMagic[8] = {'T', 'S', 'R', 'P', 'R', 'O', 'T', 'O'};
/// Current layout version (prefix word at offset 8).
inline constexpr uint32_t kFrameVersion = 1;
/// Tensor pieces start on multiples of this within the frame.
inline constexpr uint64_t kPieceAlignment = 64;

/// The 32-byte prefix, little-endian (x86-64 and aarch64 are; the codec static_asserts it).
struct FramePrefix {
  char magic[8];
  uint32_t version;
  uint32_t flags;         // reserved, must be 0
  uint64_t header_bytes;  // Cap'n Proto flat message, a multiple of 8
  uint64_t data_bytes;    // tensor region, starting at align64(32 + header_bytes)
};
static_assert(sizeof(FramePrefix) == 32, "frame prefix must be 32 bytes");

inline uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/// One row of the dtype table.
struct DTypeInfo {
  wire::DType wire;
  c10::ScalarType torch;
  uint64_t itemsize;
};

/// Table of supported dtypes (f32, f64, f16, bf16, i64, i32, i16, i8, u8, bool).
inline constexpr DTypeInfo kDTypes[] = {
    {wire::DType::F32, c10::ScalarType::Float, 4},     {wire::DType::F64, c10::ScalarType::Double, 8},
    {wire::DType::F16, c10::ScalarType::Half, 2},      {wire::DType::BF16, c10::ScalarType::BFloat16, 2},
    {wire::DType::I64, c10::ScalarType::Long, 8},      {wire::DType::I32, c10::ScalarType::Int, 4},
    {wire::DType::I16, c10::ScalarType::Short, 2},     {wire::DType::I8, c10::ScalarType::Char, 1},
    {wire::DType::U8, c10::ScalarType::Byte, 1},       {wire::DType::BOOL, c10::ScalarType::Bool, 1},
};

inline std::optional<DTypeInfo> dtype_from_torch(c10::ScalarType t) {
  for (const auto& d : kDTypes) {
    if (d.torch == t) return d;
  }
  return std::nullopt;
}

inline std::optional<DTypeInfo> dtype_from_wire(uint16_t ordinal) {
  for (const auto& d : kDTypes) {
    if (static_cast<uint16_t>(d.wire) == ordinal) return d;
  }
  return std::nullopt;
}

}  // namespace tessera::proto::internal
