// Malformed-frame corpus: thousands of frames derived from valid ones (every truncation, byte
// flips, absurd values patched over every header word, hand-patched fields). Each must decode
// to an error or to a well-formed DataProto whose every byte can be read; never a crash.
#include <algorithm>
#include <cstring>
#include <random>

#include "proto/codec.hpp"
#include "tests/proto/test_util.hpp"

namespace tessera::proto {
namespace {

using namespace testing;  // NOLINT: the proto test helpers (test_util.hpp)
using json = nlohmann::json;

/// A frame exercising every header feature: several dtypes, split pieces, all column kinds.
std::vector<uint8_t> sample_frame(EncodeOptions opt = {}) {
  TensorDict t;
  t.insert_or_assign("x", torch::arange(7 * 13, torch::kFloat).reshape({7, 13}));
  t.insert_or_assign("m", torch::ones({7, 3}, torch::kBool));
  t.insert_or_assign("h", torch::arange(7, torch::kHalf));
  NonTensorBatch c;
  c.insert_or_assign("s", Column::strings({"a", "bb", "", "dddd", "e", "f", "g"}));
  c.insert_or_assign("i", Column::int64s({1, 2, 3, 4, 5, 6, 7}));
  c.insert_or_assign("d", Column::doubles({1, 2, 3, 4, 5, 6, 7}));
  c.insert_or_assign("j", Column::jsons({1, "x", json::array(), json::object(), nullptr, true, 2.5}));
  DataProto d = unwrap(DataProto::from_dict(t, c, json{{"temperature", 0.5}, {"metrics", {{"a", 1}}}}));
  EncodedFrame f = unwrap(encode(d, opt));
  std::vector<uint8_t> out(f.size());
  f.flatten_into(out.data());
  return out;
}

/// Decodes `bytes`; if it succeeds, reads every tensor byte and every column value.
/// Returns true if decoding succeeded.
bool decode_and_touch(const std::vector<uint8_t>& bytes) {
  auto r = decode_copy(bytes.data(), bytes.size());
  if (!r.ok()) {
    EXPECT_EQ(r.status().code(), ErrorCode::corrupt_data) << r.status().to_string();
    EXPECT_EQ(r.status().message().find('\n'), std::string::npos) << r.status().message();
    return false;
  }
  EXPECT_TRUE(r->check_consistency().ok());
  for (const auto& [key, t] : r->batch()) {
    const auto* p = static_cast<const uint8_t*>(t.data_ptr());
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < t.nbytes(); ++i) sink = sink ^ p[i];
  }
  for (const auto& [key, c] : r->non_tensor_batch()) (void)c.to_json().dump(-1, ' ', false, json::error_handler_t::replace);
  return true;
}

TEST(MalformedFrames, EveryTruncationIsAnError) {
  std::vector<uint8_t> frame = sample_frame();
  ASSERT_TRUE(decode_and_touch(frame));
  for (size_t len = 0; len < frame.size(); ++len) {
    std::vector<uint8_t> cut(frame.begin(), frame.begin() + len);
    ASSERT_FALSE(decode_and_touch(cut)) << "prefix of " << len << " bytes decoded";
  }
  std::vector<uint8_t> longer = frame;
  longer.push_back(0);
  EXPECT_FALSE(decode_and_touch(longer));
}

TEST(MalformedFrames, ByteFlipsNeverCrash) {
  std::vector<uint8_t> frame = sample_frame();
  auto info = unwrap(peek_frame(frame.data(), frame.size()));
  int errors = 0;
  for (size_t pos = 0; pos < info.data_offset; ++pos) {
    for (uint8_t mask : {0x01, 0x80, 0xff}) {
      std::vector<uint8_t> bad = frame;
      bad[pos] ^= mask;
      errors += decode_and_touch(bad) ? 0 : 1;
    }
  }
  EXPECT_GT(errors, 0);
}

TEST(MalformedFrames, AbsurdValuesInEveryHeaderWord) {
  std::vector<uint8_t> frame = sample_frame();
  auto info = unwrap(peek_frame(frame.data(), frame.size()));
  const uint64_t absurd[] = {0,          1,          0xffffffffffffffffull, 0x7fffffffffffffffull,
                             1ull << 29, 1ull << 32, 1ull << 62,            0x8000000000000000ull,
                             63,         65,         frame.size()};
  for (size_t off = 0; off + 8 <= info.data_offset; off += 4) {  // every 4-byte step: u32 and u64 fields
    for (uint64_t v : absurd) {
      std::vector<uint8_t> bad = frame;
      std::memcpy(bad.data() + off, &v, 8);
      decode_and_touch(bad);
      std::vector<uint8_t> bad32 = frame;
      auto v32 = static_cast<uint32_t>(v >> (v > 0xffffffffull ? 32 : 0));
      std::memcpy(bad32.data() + off, &v32, 4);
      decode_and_touch(bad32);
    }
  }
}

TEST(MalformedFrames, RandomGarbageAndSplices) {
  std::mt19937_64 rng(1234);
  std::vector<uint8_t> frame = sample_frame();
  for (int i = 0; i < 300; ++i) {
    std::vector<uint8_t> bad = frame;
    const int edits = 1 + static_cast<int>(rng() % 8);
    for (int e = 0; e < edits; ++e) bad[rng() % bad.size()] = static_cast<uint8_t>(rng());
    decode_and_touch(bad);
    std::vector<uint8_t> garbage(rng() % 512);
    for (auto& b : garbage) b = static_cast<uint8_t>(rng());
    if (garbage.size() >= 8) std::memcpy(garbage.data(), "TSRPROTO", 8);
    decode_and_touch(garbage);
  }
}

/// Finds a little-endian u64 `value` in [from, to) of `bytes`, 8-aligned; npos if absent.
size_t find_u64(const std::vector<uint8_t>& bytes, uint64_t value, size_t from, size_t to) {
  for (size_t off = from; off + 8 <= to; off += 8) {
    uint64_t v;
    std::memcpy(&v, bytes.data() + off, 8);
    if (v == value) return off;
  }
  return std::string::npos;
}

TEST(MalformedFrames, PatchedFieldsGiveSpecificErrors) {
  std::vector<uint8_t> frame = sample_frame();
  auto info = unwrap(peek_frame(frame.data(), frame.size()));
  auto patched = [&](size_t off, uint64_t v) {
    std::vector<uint8_t> bad = frame;
    std::memcpy(bad.data() + off, &v, 8);
    return decode_copy(bad.data(), bad.size());
  };
  auto expect_corrupt = [](const Result<DataProto>& r, const std::string& needle) {
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().to_string();
  };
  expect_corrupt(patched(0, 0x4f544f5250525354ull ^ 1), "bad magic");
  uint64_t version_flags = 2;
  expect_corrupt(patched(8, version_flags), "unsupported frame version 2");
  expect_corrupt(patched(8, 1 | (uint64_t{1} << 32)), "unknown frame flags");
  expect_corrupt(patched(16, 12), "multiple of 8");
  expect_corrupt(patched(24, info.data_bytes + 64), "truncated");
  expect_corrupt(patched(24, 0xfffffffffffffff0ull), "absurd data length");
  // Tensor x: the piece (offset 0, length 7*13*4 = 364) sits in the header as two u64 words.
  const size_t hdr_end = kFramePrefixBytes + info.header_bytes;
  size_t piece_len = find_u64(frame, 364, kFramePrefixBytes, hdr_end);
  ASSERT_NE(piece_len, std::string::npos);
  expect_corrupt(patched(piece_len, 360), "shape needs 364 bytes");
  expect_corrupt(patched(piece_len, 1ull << 62), "past the data end");
  expect_corrupt(patched(piece_len - 8, 32), "not 64-byte aligned");
  // Tensor h's piece starts at 448 (x: [0, 364), m: [384, 405), h: [448, 462)); move it onto x.
  size_t h_off = find_u64(frame, 448, kFramePrefixBytes, hdr_end);
  ASSERT_NE(h_off, std::string::npos);
  expect_corrupt(patched(h_off, 0), "overlap");
  // Shape dims: x's second dim (13) and the row count (7).
  size_t dim13 = find_u64(frame, 13, kFramePrefixBytes, hdr_end);
  ASSERT_NE(dim13, std::string::npos);
  expect_corrupt(patched(dim13, static_cast<uint64_t>(-13)), "negative dim");
  expect_corrupt(patched(dim13, 1ull << 62), "overflows");
}

TEST(MalformedFrames, NulInNamesIsRejected) {
  NonTensorBatch c{{"colQ", Column::int64s({1})}};
  DataProto d = unwrap(DataProto::from_dict({{"tenQ", torch::zeros({1})}}, c));
  EncodedFrame f = unwrap(encode(d));
  std::vector<uint8_t> frame(f.size());
  f.flatten_into(frame.data());
  for (const std::string name : {"tenQ", "colQ"}) {
    std::vector<uint8_t> bad = frame;
    auto it = std::search(bad.begin(), bad.end(), name.begin(), name.end());
    ASSERT_NE(it, bad.end());
    it[3] = '\0';  // "tenQ" -> "ten\0": still NUL-terminated Text, but with an embedded NUL
    auto r = decode_copy(bad.data(), bad.size());
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("name contains a NUL byte"), std::string::npos) << r.status().to_string();
  }
}

TEST(MalformedFrames, NonAdjacentPiecesAreCopiedInOrder) {
  at::Tensor t = torch::arange(32, torch::kFloat).reshape({2, 16});  // 128 bytes = 2 pieces of 64
  DataProto d = unwrap(DataProto::from_dict({{"t", t}}));
  EncodeOptions opt;
  opt.max_piece_bytes = 64;
  EncodedFrame f = unwrap(encode(d, opt));
  std::vector<uint8_t> frame(f.size());
  f.flatten_into(frame.data());
  auto info = unwrap(peek_frame(frame.data(), frame.size()));
  // Pieces (0, 64), (64, 64) -> (64, 64), (0, 64): the second half comes first.
  const size_t hdr_end = kFramePrefixBytes + info.header_bytes;
  size_t at = std::string::npos;
  for (size_t off = kFramePrefixBytes; off + 32 <= hdr_end; off += 8) {
    uint64_t w[4];
    std::memcpy(w, frame.data() + off, 32);
    if (w[0] == 0 && w[1] == 64 && w[2] == 64 && w[3] == 64) at = off;
  }
  ASSERT_NE(at, std::string::npos);
  const uint64_t swapped[4] = {64, 64, 0, 64};
  std::memcpy(frame.data() + at, swapped, 32);
  auto buf = unwrap(Buffer::copy_of(frame.data(), frame.size()));
  DataProto back = unwrap(decode(buf));
  const at::Tensor& got = *back.batch().find("t");
  EXPECT_TRUE(got.equal(torch::cat({t.flatten().slice(0, 16, 32), t.flatten().slice(0, 0, 16)}).reshape({2, 16})));
  const auto* p = static_cast<const uint8_t*>(got.data_ptr());
  EXPECT_FALSE(p >= buf->data() && p < buf->data() + buf->size());  // copied, not a view
}

}  // namespace
}  // namespace tessera::proto
