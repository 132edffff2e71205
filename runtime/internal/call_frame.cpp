// call_frame.cpp: the call channel's frame format (Note [Call channel]).
#include "runtime/internal/call_frame.hpp"

#include <cstring>
#include <exception>
#include <string>
#include <utility>

#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/deserializer.hpp>
#include <caf/sec.hpp>

namespace tessera::runtime::internal {
namespace {

template <class T>
void put_le(char* p, T v) { std::memcpy(p, &v, sizeof v); }
template <class T>
T get_le(const char* p) { T v; std::memcpy(&v, p, sizeof v); return v; }

// A frame: the header, then `body` serialised with CAF's binary format right behind it.
template <class T>
Result<std::vector<char>> encode_any(caf::actor_system& sys, FrameKind kind, uint64_t id,
                                     T& body) {
  std::vector<char> buf(kChannelHeaderBytes, '\0');
  caf::binary_serializer sink(sys, buf);
  if (auto err = sink(body)) {
    return make_error(ErrorCode::internal, "cannot encode a call frame: {}", sys.render(err));
  }
  put_le(buf.data(), kChannelFrameMagic);
  put_le(buf.data() + 4, static_cast<uint8_t>(kind));
  put_le(buf.data() + 8, id);
  put_le(buf.data() + 16, static_cast<uint64_t>(buf.size() - kChannelHeaderBytes));
  return buf;
}

// Note [Bounded frame decoding]
// CAF 0.17's binary_deserializer resizes a byte vector (WireValue::frame, AgentCallReply::codes)
// to the size its sequence header claims before it checks that the bytes are there: a 118-byte
// call frame that claims a 4 GiB WireValue::frame allocates and zero-fills 4 GiB before failing
// (found by tests/fuzz/fuzz_call_frame; the input is tests/fuzz/regressions/fuzz_call_frame/).
// Every element of every sequence in a frame body (bytes, integers, strings, structs) takes at
// least one byte, so a sequence with more elements than there are bytes left is a lie:
// BoundedDeserializer refuses it before any container grows. It forwards everything else to a
// binary_deserializer (which is final, hence the wrapper). Strings are read by the inner
// deserializer, which checks their length against the bytes left itself.
class BoundedDeserializer final : public caf::deserializer {
 public:
  BoundedDeserializer(caf::actor_system& sys, const char* data, size_t size)
      : caf::deserializer(sys), inner_(sys, data, size) {}

  size_t remaining() const { return inner_.remaining(); }
  /// The first sequence refused, as (claimed elements, bytes left); zeros if none.
  std::pair<size_t, size_t> refused() const { return refused_; }

  caf::error begin_object(uint16_t& nr, std::string& name) override {
    return inner_.begin_object(nr, name);
  }
  caf::error end_object() override { return inner_.end_object(); }
  caf::error begin_sequence(size_t& num) override {
    if (auto err = inner_.begin_sequence(num)) return err;
    if (num > inner_.remaining()) {
      refused_ = {num, inner_.remaining()};
      num = 0;
      return caf::sec::end_of_stream;
    }
    return caf::none;
  }
  caf::error end_sequence() override { return inner_.end_sequence(); }
  caf::error apply_raw(size_t num_bytes, void* data) override {
    return inner_.apply_raw(num_bytes, data);
  }

 protected:
  caf::error apply_impl(int8_t& x) override { return inner_.apply(x); }
  caf::error apply_impl(uint8_t& x) override { return inner_.apply(x); }
  caf::error apply_impl(int16_t& x) override { return inner_.apply(x); }
  caf::error apply_impl(uint16_t& x) override { return inner_.apply(x); }
  caf::error apply_impl(int32_t& x) override { return inner_.apply(x); }
  caf::error apply_impl(uint32_t& x) override { return inner_.apply(x); }
  caf::error apply_impl(int64_t& x) override { return inner_.apply(x); }
  caf::error apply_impl(uint64_t& x) override { return inner_.apply(x); }
  caf::error apply_impl(float& x) override { return inner_.apply(x); }
  caf::error apply_impl(double& x) override { return inner_.apply(x); }
  caf::error apply_impl(long double& x) override { return inner_.apply(x); }
  caf::error apply_impl(std::string& x) override { return inner_.apply(x); }
  caf::error apply_impl(std::u16string& x) override { return inner_.apply(x); }
  caf::error apply_impl(std::u32string& x) override { return inner_.apply(x); }

 private:
  caf::binary_deserializer inner_;
  std::pair<size_t, size_t> refused_{0, 0};
};

template <class T>
Status decode_any(caf::actor_system& sys, const char* data, size_t size, T& body) {
  BoundedDeserializer source(sys, data, size);
  try {  // Note [Bounded frame decoding]; should a size still get through, it throws here
    if (auto err = source(body)) {
      auto [claimed, left] = source.refused();
      if (claimed != 0) {
        return make_error(ErrorCode::corrupt_data,
                          "undecodable frame body: a sequence of {} elements with {} bytes left",
                          claimed, left);
      }
      return make_error(ErrorCode::corrupt_data, "undecodable frame body: {}", sys.render(err));
    }
  } catch (const std::exception& e) {
    return make_error(ErrorCode::corrupt_data, "undecodable frame body: {}", e.what());
  }
  if (source.remaining() != 0) {
    return make_error(ErrorCode::corrupt_data, "{} stray bytes after the frame body",
                      source.remaining());
  }
  return Status();
}

}  // namespace

Result<FrameHeader> parse_frame_header(const char* header, FrameKind expected, uint64_t max_body) {
  uint32_t magic = get_le<uint32_t>(header);
  if (magic != kChannelFrameMagic) {
    return make_error(ErrorCode::corrupt_data, "bad frame magic 0x{:08x}", magic);
  }
  uint8_t k = get_le<uint8_t>(header + 4);
  if (k != static_cast<uint8_t>(expected)) {
    return make_error(ErrorCode::corrupt_data, "unexpected frame kind {}", k);
  }
  FrameHeader h;
  h.kind = expected;
  h.id = get_le<uint64_t>(header + 8);
  h.body_bytes = get_le<uint64_t>(header + 16);
  if (h.body_bytes > max_body) {
    return make_error(ErrorCode::corrupt_data, "frame body of {} bytes exceeds the limit {}",
                      h.body_bytes, max_body);
  }
  return h;
}

Status decode_frame_body(caf::actor_system& sys, const char* data, size_t size, ChannelCall& out) {
  return decode_any(sys, data, size, out);
}

Status decode_frame_body(caf::actor_system& sys, const char* data, size_t size,
                         AgentCallReply& out) {
  return decode_any(sys, data, size, out);
}

Result<std::vector<char>> encode_frame(caf::actor_system& sys, uint64_t id,
                                       const ChannelCall& call) {
  // CAF 0.17's serializer takes its argument by non-const reference; it only reads it.
  return encode_any(sys, FrameKind::call, id, const_cast<ChannelCall&>(call));
}

Result<std::vector<char>> encode_frame(caf::actor_system& sys, uint64_t id,
                                       const AgentCallReply& reply) {
  return encode_any(sys, FrameKind::reply, id, const_cast<AgentCallReply&>(reply));
}

}  // namespace tessera::runtime::internal
