// call_frame.hpp: the call channel's frame format as pure functions on bytes (private to
// runtime/). Note [Call channel] in runtime/internal/call_channel.hpp describes the channel;
// this file is its wire format without the sockets, so the parser can be tested and fuzzed
// (tests/fuzz/fuzz_call_frame.cpp) without a connection. ChannelClient and ChannelServer read
// and write every frame through these functions.
//
// Frames (little endian): header 24 bytes "TCF1" | kind u8 | 0 u8 | 0 u16 | call id u64 |
// body bytes u64, then the body: a ChannelCall (kind call) or an AgentCallReply (kind reply)
// in CAF's binary format.
//
// Thread-safety: free functions, no state; the actor system is only read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/meta/type_name.hpp>

#include "proto/status.hpp"
#include "runtime/messages.hpp"

namespace tessera::runtime::internal {

/// One call to several workers of one agent (AgentCall with actor ids instead of handles).
struct ChannelCall {
  std::vector<uint64_t> workers;      ///< caf::actor_id of each target, hosted by the agent.
  std::vector<CallRequest> requests;  ///< requests[i] goes to workers[i].
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ChannelCall& x) {
  return f(caf::meta::type_name("ChannelCall"), x.workers, x.requests);
}

inline constexpr uint32_t kChannelFrameMagic = 0x31464354;  // "TCF1"
inline constexpr uint32_t kChannelOkMagic = 0x4b4f4354;     // "TCOK"
inline constexpr size_t kChannelHeaderBytes = 24;
inline constexpr size_t kChannelNonceBytes = 32;
inline constexpr size_t kChannelHelloBytes = 8 + 32;  // session id, proof
enum class FrameKind : uint8_t { call = 1, reply = 2 };

/// A parsed frame header.
struct FrameHeader {
  FrameKind kind = FrameKind::call;
  uint64_t id = 0;          ///< The call id.
  uint64_t body_bytes = 0;  ///< Bytes of body that follow the header.
};

/// Parses the kChannelHeaderBytes bytes at `header`. Error corrupt_data naming the fault when
/// the magic is wrong, the kind is not `expected`, or the body is over `max_body` bytes.
/// REQUIRES: `header` points at kChannelHeaderBytes readable bytes.
Result<FrameHeader> parse_frame_header(const char* header, FrameKind expected, uint64_t max_body);

/// Decodes a frame body of `size` bytes at `data` into `out`. Error corrupt_data when the
/// bytes do not decode, a size field in them claims more than the bytes left (refused before
/// anything is allocated for it: Note [Bounded frame decoding]), or bytes are left over.
/// Never throws.
Status decode_frame_body(caf::actor_system& sys, const char* data, size_t size, ChannelCall& out);
Status decode_frame_body(caf::actor_system& sys, const char* data, size_t size,
                         AgentCallReply& out);

/// The whole frame (header and body) of call `id`. Error internal if CAF cannot encode it.
Result<std::vector<char>> encode_frame(caf::actor_system& sys, uint64_t id,
                                       const ChannelCall& call);
Result<std::vector<char>> encode_frame(caf::actor_system& sys, uint64_t id,
                                       const AgentCallReply& reply);

}  // namespace tessera::runtime::internal
