// dp_protocol.hpp: the data plane's request/response headers (private to runtime/).
//
// Note [Data plane protocol]
// A client connection carries any number of request/response exchanges, one at a time:
//   request   48 bytes: magic "TDP1" | op u8 | flags u8 | 0 u16 | owner u64 | id u64 | key u64 |
//                       row_begin i64 | row_end i64            (little endian)
//   response  32 bytes: magic "TDR1" | status u8 (ErrorCode) | transport u8 | 0 u16 |
//                       body_bytes u64 | 0 u64 | 0 u64
//             then body_bytes bytes: the frame (status ok, transport inline), or a one-line error
//             message (status != ok).
//   Same-host frames (Unix-socket connections, Note [Landing segments] in shm_pool.hpp):
//             the owner answers transport landing_needed with the frame size and no body; the
//             receiver sends a 16-byte landing message "TDL1" | 0 u32 | bytes u64 carrying the
//             memfd of one of its segments (SCM_RIGHTS); the owner writes the frame into it and
//             answers transport shm (no body: the bytes are in the segment).
// Anything else (bad magic, unknown op, a request cut short) closes that connection and is
// logged; the server keeps serving every other connection. Requests are validated before any
// lookup; row ranges are checked against the payload.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "proto/status.hpp"

namespace tessera::runtime::internal {

inline constexpr uint32_t kRequestMagic = 0x31504454;   // "TDP1"
inline constexpr uint32_t kResponseMagic = 0x31524454;  // "TDR1"
inline constexpr size_t kRequestBytes = 48;
inline constexpr size_t kResponseBytes = 32;
inline constexpr uint64_t kMaxErrorMessageBytes = 4096;

/// Request operations.
enum class Op : uint8_t { fetch = 1, release = 2 };
/// Request flag bits.
inline constexpr uint8_t kFlagConsume = 1;
/// Response transports.
enum class Transport : uint8_t { inline_body = 0, shm = 1, landing_needed = 2 };
/// Landing message magic "TDL1" and size.
inline constexpr uint32_t kLandingMagic = 0x314c4454;
inline constexpr size_t kLandingBytes = 16;

/// A decoded request.
struct Request {
  Op op = Op::fetch;
  uint8_t flags = 0;
  uint64_t owner = 0;
  uint64_t id = 0;
  uint64_t key = 0;
  int64_t row_begin = 0;
  int64_t row_end = -1;  ///< -1: to the end.
};

/// A decoded response header.
struct ResponseHeader {
  ErrorCode status = ErrorCode::ok;
  Transport transport = Transport::inline_body;
  uint64_t body_bytes = 0;
};

namespace detail {
template <class T>
void put(uint8_t* p, size_t off, T v) { std::memcpy(p + off, &v, sizeof v); }
template <class T>
T get(const uint8_t* p, size_t off) { T v; std::memcpy(&v, p + off, sizeof v); return v; }
}  // namespace detail

/// Serialises a request into 48 bytes.
inline void write_request(const Request& r, uint8_t* out) {
  std::memset(out, 0, kRequestBytes);
  detail::put(out, 0, kRequestMagic);
  detail::put(out, 4, static_cast<uint8_t>(r.op));
  detail::put(out, 5, r.flags);
  detail::put(out, 8, r.owner);
  detail::put(out, 16, r.id);
  detail::put(out, 24, r.key);
  detail::put(out, 32, r.row_begin);
  detail::put(out, 40, r.row_end);
}

/// Parses 48 untrusted bytes; errors (corrupt_data) name what is wrong.
inline Result<Request> read_request(const uint8_t* in) {
  if (detail::get<uint32_t>(in, 0) != kRequestMagic) {
    return make_error(ErrorCode::corrupt_data, "bad request magic 0x{:08x}",
                      detail::get<uint32_t>(in, 0));
  }
  Request r;
  uint8_t op = detail::get<uint8_t>(in, 4);
  if (op != static_cast<uint8_t>(Op::fetch) && op != static_cast<uint8_t>(Op::release)) {
    return make_error(ErrorCode::corrupt_data, "unknown request op {}", op);
  }
  r.op = static_cast<Op>(op);
  r.flags = detail::get<uint8_t>(in, 5);
  r.owner = detail::get<uint64_t>(in, 8);
  r.id = detail::get<uint64_t>(in, 16);
  r.key = detail::get<uint64_t>(in, 24);
  r.row_begin = detail::get<int64_t>(in, 32);
  r.row_end = detail::get<int64_t>(in, 40);
  if (r.row_begin < 0 || r.row_end < -1 || (r.row_end >= 0 && r.row_end < r.row_begin)) {
    return make_error(ErrorCode::corrupt_data, "bad row range [{}, {})", r.row_begin, r.row_end);
  }
  return r;
}

/// Serialises a response header into 32 bytes.
inline void write_response(const ResponseHeader& h, uint8_t* out) {
  std::memset(out, 0, kResponseBytes);
  detail::put(out, 0, kResponseMagic);
  detail::put(out, 4, static_cast<uint8_t>(h.status));
  detail::put(out, 5, static_cast<uint8_t>(h.transport));
  detail::put(out, 8, h.body_bytes);
}

/// Parses 32 untrusted bytes; `max_body` bounds body_bytes (errors name the limit).
inline Result<ResponseHeader> read_response(const uint8_t* in, uint64_t max_body) {
  if (detail::get<uint32_t>(in, 0) != kResponseMagic) {
    return make_error(ErrorCode::corrupt_data, "bad response magic 0x{:08x}",
                      detail::get<uint32_t>(in, 0));
  }
  ResponseHeader h;
  uint8_t status = detail::get<uint8_t>(in, 4);
  uint8_t transport = detail::get<uint8_t>(in, 5);
  if (status > static_cast<uint8_t>(ErrorCode::cancelled) || transport > 2) {
    return make_error(ErrorCode::corrupt_data, "bad response status {} / transport {}", status,
                      transport);
  }
  h.status = static_cast<ErrorCode>(status);
  h.transport = static_cast<Transport>(transport);
  h.body_bytes = detail::get<uint64_t>(in, 8);
  uint64_t limit = h.status == ErrorCode::ok ? max_body : kMaxErrorMessageBytes;
  if (h.body_bytes > limit) {
    return make_error(ErrorCode::corrupt_data, "response body of {} bytes exceeds the limit {}",
                      h.body_bytes, limit);
  }
  return h;
}

}  // namespace tessera::runtime::internal
