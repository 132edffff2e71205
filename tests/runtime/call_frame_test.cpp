// call_frame_test.cpp: the call channel's frame format without a socket
// (runtime/internal/call_frame.hpp), and the inputs that once broke it
// (tests/fuzz/regressions/fuzz_call_frame/, found by tests/fuzz/fuzz_call_frame).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>

#include "runtime/actor_system.hpp"
#include "runtime/internal/call_frame.hpp"

namespace tessera::runtime {
namespace {

using internal::ChannelCall;
using internal::FrameKind;
using internal::kChannelHeaderBytes;

class CallFrameTest : public ::testing::Test {
 protected:
  // Configured as every node is (runtime/actor_system.cpp), with the deterministic scheduler.
  void SetUp() override {
    auto sys = ActorSystem::start(RuntimeConfig{}, ActorSystemOptions{false, true});
    ASSERT_TRUE(sys.ok()) << sys.status().to_string();
    owner_ = std::move(sys).value();
  }
  std::unique_ptr<ActorSystem> owner_;
  caf::actor_system& sys() { return owner_->system(); }
};

ChannelCall sample_call() {
  ChannelCall call;
  call.workers = {3, 4};
  CallRequest r;
  r.method = "compute_values";
  WireValue v;
  v.kind = static_cast<uint8_t>(WireKind::proto_inline);
  v.frame = {'a', 'b', 'c'};
  r.args = {v};
  call.requests = {r, r};
  return call;
}

TEST_F(CallFrameTest, AFrameRoundTripsThroughHeaderAndBody) {
  auto frame = internal::encode_frame(sys(), 77, sample_call());
  ASSERT_TRUE(frame.ok()) << frame.status().to_string();
  auto header = internal::parse_frame_header(frame->data(), FrameKind::call, 1 << 20);
  ASSERT_TRUE(header.ok()) << header.status().to_string();
  EXPECT_EQ(header->id, 77u);
  ASSERT_EQ(header->body_bytes, frame->size() - kChannelHeaderBytes);
  ChannelCall back;
  Status st = internal::decode_frame_body(sys(), frame->data() + kChannelHeaderBytes,
                                          header->body_bytes, back);
  ASSERT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(back.workers, sample_call().workers);
  ASSERT_EQ(back.requests.size(), 2u);
  EXPECT_EQ(back.requests[1].method, "compute_values");
  EXPECT_EQ(back.requests[1].args.at(0).frame, (std::vector<char>{'a', 'b', 'c'}));
}

TEST_F(CallFrameTest, BadHeadersAreCorruptDataNamingTheFault) {
  auto frame = internal::encode_frame(sys(), 1, sample_call());
  ASSERT_TRUE(frame.ok());
  auto wrong_kind = internal::parse_frame_header(frame->data(), FrameKind::reply, 1 << 20);
  EXPECT_EQ(wrong_kind.status().code(), ErrorCode::corrupt_data);
  EXPECT_NE(wrong_kind.status().message().find("unexpected frame kind 1"), std::string::npos);
  auto too_big = internal::parse_frame_header(frame->data(), FrameKind::call, 8);
  EXPECT_EQ(too_big.status().code(), ErrorCode::corrupt_data);
  EXPECT_NE(too_big.status().message().find("exceeds the limit 8"), std::string::npos);
  std::vector<char> bad = *frame;
  bad[0] = 'X';
  auto bad_magic = internal::parse_frame_header(bad.data(), FrameKind::call, 1 << 20);
  EXPECT_NE(bad_magic.status().message().find("bad frame magic"), std::string::npos);
}

TEST_F(CallFrameTest, StrayAndMissingBodyBytesAreCorruptData) {
  auto frame = internal::encode_frame(sys(), 1, sample_call());
  ASSERT_TRUE(frame.ok());
  std::vector<char> body(frame->begin() + kChannelHeaderBytes, frame->end());
  body.push_back('\0');
  ChannelCall out;
  Status stray = internal::decode_frame_body(sys(), body.data(), body.size(), out);
  EXPECT_NE(stray.message().find("1 stray bytes"), std::string::npos) << stray.to_string();
  ChannelCall cut;
  Status short_body = internal::decode_frame_body(sys(), body.data(), body.size() - 3, cut);
  EXPECT_EQ(short_body.code(), ErrorCode::corrupt_data) << short_body.to_string();
}

// Note [Bounded frame decoding]: a byte vector whose size field claims 4 GiB in a 94-byte body
// is refused without allocating it (before the fix: a 4 GiB zero-filled allocation).
TEST_F(CallFrameTest, FuzzRegressionsDecodeWithoutLargeAllocations) {
  const char* src = std::getenv("TESSERA_SOURCE_DIR");
  ASSERT_NE(src, nullptr) << "run through ctest (TESSERA_SOURCE_DIR)";
  std::filesystem::path dir = std::filesystem::path(src) / "tests/fuzz/regressions/fuzz_call_frame";
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ++files;
    // As the fuzzer reads them: frames back to back, the kind from the first one.
    ASSERT_GE(bytes.size(), kChannelHeaderBytes) << entry.path();
    FrameKind kind = bytes[4] == 1 ? FrameKind::call : FrameKind::reply;
    size_t at = 0;
    while (bytes.size() - at >= kChannelHeaderBytes) {
      auto h = internal::parse_frame_header(bytes.data() + at, kind, 1 << 20);
      if (!h.ok() || h->body_bytes > bytes.size() - at - kChannelHeaderBytes) break;
      const char* body = bytes.data() + at + kChannelHeaderBytes;
      ChannelCall call;
      AgentCallReply reply;
      Status st = kind == FrameKind::call
                      ? internal::decode_frame_body(sys(), body, h->body_bytes, call)
                      : internal::decode_frame_body(sys(), body, h->body_bytes, reply);
      if (!st.ok()) {
        EXPECT_EQ(st.code(), ErrorCode::corrupt_data) << entry.path() << ": " << st.to_string();
        break;
      }
      at += kChannelHeaderBytes + h->body_bytes;
    }
  }
  EXPECT_GE(files, 1u);
}

// The fuzzer's input: its first lying size (an args vector of 2^31 - 1 values) is refused; the
// 4 GiB WireValue::frame behind it was the allocation.
TEST_F(CallFrameTest, ALyingSequenceSizeIsRefusedBeforeAllocating) {
  const char* src = std::getenv("TESSERA_SOURCE_DIR");
  ASSERT_NE(src, nullptr) << "run through ctest (TESSERA_SOURCE_DIR)";
  std::ifstream in(std::string(src) +
                       "/tests/fuzz/regressions/fuzz_call_frame/oom-wirevalue-frame-size-4gib",
                   std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(bytes.size(), 118u);
  auto h = internal::parse_frame_header(bytes.data(), FrameKind::call, 1 << 20);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  ChannelCall call;
  Status st = internal::decode_frame_body(sys(), bytes.data() + kChannelHeaderBytes,
                                          h->body_bytes, call);
  EXPECT_EQ(st.code(), ErrorCode::corrupt_data);
  EXPECT_NE(st.message().find("a sequence of 2147483647 elements with 15 bytes left"), std::string::npos)
      << st.to_string();
}

}  // namespace
}  // namespace tessera::runtime
