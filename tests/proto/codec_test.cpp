// Wire codec: round trips (every dtype, column types, meta, empty, non-contiguous, split pieces),
// zero-copy encode and decode, buffer lifetime, encode errors.
#include <cmath>
#include <cstring>
#include <limits>

#include "proto/codec.hpp"
#include "tests/proto/test_util.hpp"

namespace tessera::proto {
namespace {

using namespace testing;  // NOLINT: the proto test helpers (test_util.hpp)
using json = nlohmann::json;

DataProto round_trip(const DataProto& d, const EncodeOptions& opt = {}) {
  EncodedFrame frame = unwrap(encode(d, opt));
  return unwrap(decode(unwrap(frame.flatten())));
}

void expect_same(const DataProto& a, const DataProto& b) {
  ASSERT_EQ(a.batch().keys(), b.batch().keys());
  for (const auto& [key, t] : a.batch()) {
    const at::Tensor& u = *b.batch().find(key);
    EXPECT_EQ(t.scalar_type(), u.scalar_type()) << key;
    EXPECT_EQ(t.sizes(), u.sizes()) << key;
    EXPECT_TRUE(t.equal(u)) << key;
  }
  ASSERT_EQ(a.non_tensor_batch().keys(), b.non_tensor_batch().keys());
  for (const auto& [key, c] : a.non_tensor_batch()) EXPECT_TRUE(c.equals(*b.non_tensor_batch().find(key))) << key;
  EXPECT_EQ(a.meta_info(), b.meta_info());
}

at::Tensor random_of(c10::ScalarType dtype, std::vector<int64_t> shape) {
  torch::manual_seed(42);
  if (dtype == torch::kBool) return torch::rand(shape) > 0.5;
  if (at::isFloatingType(dtype)) return torch::randn(shape).to(dtype);
  return torch::randint(-100, 100, shape).to(dtype);
}

TEST(Codec, RoundTripsEveryDtype) {
  const std::vector<c10::ScalarType> dtypes = {torch::kFloat,  torch::kDouble, torch::kHalf,
                                               torch::kBFloat16, torch::kLong,  torch::kInt,
                                               torch::kShort,  torch::kChar,   torch::kByte,
                                               torch::kBool};
  TensorDict t;
  for (auto dt : dtypes) {
    EXPECT_TRUE(is_wire_dtype(dt));
    t.insert_or_assign(c10::toString(dt), random_of(dt, {5, 3, 2}));
  }
  t.insert_or_assign("odd_bytes", random_of(torch::kByte, {5, 7}));  // 7-byte rows, not a word multiple
  DataProto d = unwrap(DataProto::from_dict(t));
  expect_same(d, round_trip(d));
  EXPECT_FALSE(is_wire_dtype(torch::kComplexFloat));
}

TEST(Codec, RoundTripsColumnsAndMeta) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::string binary("a\0b\xff", 4);
  NonTensorBatch c;
  c.insert_or_assign("s", Column::strings({binary, "", "ünïcode"}));
  c.insert_or_assign("i", Column::int64s({std::numeric_limits<int64_t>::min(), 0, std::numeric_limits<int64_t>::max()}));
  c.insert_or_assign("d", Column::doubles({nan, -0.0, std::numeric_limits<double>::infinity()}));
  c.insert_or_assign("j", Column::jsons({json{{"a", {1, 2}}}, nullptr, json::array({"x", 1.5, true})}));
  json meta = {{"temperature", 0.7}, {"metrics", {{"a", json::array({1, 2})}}}, {"nested", {{"k", {{"v", "w"}}}}}};
  DataProto d = unwrap(DataProto::from_dict({{"t", torch::arange(3)}}, c, meta));
  DataProto back = round_trip(d);
  expect_same(d, back);
  EXPECT_EQ(back.non_tensor_batch().find("s")->str(0), binary);
  EXPECT_TRUE(std::signbit(back.non_tensor_batch().find("d")->f64(1)));
  // Folded (width > 1) columns keep their width.
  DataProto folded = unwrap(make_proto(6).fold_batch_dim(3));
  DataProto fb = round_trip(folded);
  EXPECT_EQ(fb.non_tensor_batch().find("uid")->width(), 2);
  expect_same(folded, fb);
}

TEST(Codec, EmptyDataProtos) {
  DataProto nothing;
  DataProto back = round_trip(nothing);
  EXPECT_EQ(back.size(), 0);
  EXPECT_TRUE(back.batch().empty());
  DataProto zero_rows = make_proto(0);
  expect_same(zero_rows, round_trip(zero_rows));
  DataProto cols_only = unwrap(DataProto::from_dict({}, {{"s", Column::strings({"a", "b"})}}));
  expect_same(cols_only, round_trip(cols_only));
}

TEST(Codec, NonContiguousTensors) {
  at::Tensor base = torch::arange(24, torch::kFloat).reshape({4, 6});
  at::Tensor t = base.t();  // [6, 4], not contiguous
  at::Tensor s = base.slice(1, 0, 6, 2);  // strided columns
  DataProto d = unwrap(DataProto::from_dict({{"t", t}}));
  DataProto d2 = unwrap(DataProto::from_dict({{"s", s}}));
  expect_same(d, round_trip(d));
  expect_same(d2, round_trip(d2));
  // A view with a storage offset (a chunk) encodes only its own rows.
  DataProto chunk = unwrap(make_proto(8).chunk(4))[3];
  expect_same(chunk, round_trip(chunk));
}

TEST(Codec, LargeTensorsAreSplitIntoPieces) {
  at::Tensor big = torch::arange(250, torch::kFloat).reshape({50, 5});  // 1000 bytes
  at::Tensor small = torch::arange(50, torch::kShort);                 // 100 bytes
  DataProto d = unwrap(DataProto::from_dict({{"big", big}, {"small", small}}));
  EncodeOptions opt;
  opt.max_piece_bytes = 130;  // rounded down to 128
  EncodedFrame frame = unwrap(encode(d, opt));
  // header, 8 pieces of big (7 x 128 + 104), a 24-byte pad to the next 64 boundary, 1 piece of small.
  ASSERT_EQ(frame.segments().size(), 1u + 8u + 1u + 1u);
  for (size_t k = 1; k < 8; ++k) EXPECT_EQ(frame.segments()[k].size, 128u);
  EXPECT_EQ(frame.segments()[8].size, 1000u - 7 * 128);
  EXPECT_EQ(frame.segments()[9].size, 24u);
  auto buf = unwrap(frame.flatten());
  DataProto back = unwrap(decode(buf));
  expect_same(d, back);
  // Adjacent pieces still decode as one zero-copy view.
  const auto* p = static_cast<const uint8_t*>(back.batch().find("big")->data_ptr());
  EXPECT_TRUE(p >= buf->data() && p < buf->data() + buf->size());
}

TEST(Codec, EncodeCopiesNoTensorBytes) {
  DataProto d = make_proto(16);
  EncodedFrame frame = unwrap(encode(d));
  std::set<const void*> seg_ptrs;
  size_t total = 0;
  for (const auto& s : frame.segments()) {
    seg_ptrs.insert(s.data);
    total += s.size;
  }
  EXPECT_EQ(total, frame.size());
  for (const auto& [key, t] : d.batch()) EXPECT_TRUE(seg_ptrs.count(t.data_ptr())) << key;
  std::vector<uint8_t> flat(frame.size());
  frame.flatten_into(flat.data());
  auto info = unwrap(peek_frame(flat.data(), flat.size()));
  EXPECT_EQ(info.frame_bytes, frame.size());
  EXPECT_EQ(info.data_offset % 64, 0u);
  EXPECT_EQ(info.data_offset + info.data_bytes, frame.size());
  expect_same(d, unwrap(decode_copy(flat.data(), flat.size())));
}

TEST(Codec, DecodeIsZeroCopyAndKeepsTheBufferAlive) {
  DataProto d = make_proto(32);
  EncodedFrame frame = unwrap(encode(d));
  auto owned = unwrap(frame.flatten());
  bool released = false;
  auto buffer = Buffer::wrap(owned->data(), owned->size(), [&released, owned] { released = true; });
  const uint8_t* lo = buffer->data();
  const uint8_t* hi = lo + buffer->size();
  at::Tensor survivor;
  {
    DataProto back = unwrap(decode(buffer));
    for (const auto& [key, t] : back.batch()) {
      const auto* p = static_cast<const uint8_t*>(t.data_ptr());
      EXPECT_TRUE(p >= lo && p + t.nbytes() <= hi) << key;  // points inside the receive buffer
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << key;
    }
    survivor = *back.batch().find("x");
    buffer.reset();  // the caller's handle goes away; the tensors keep the bytes alive
    EXPECT_FALSE(released);
  }
  EXPECT_FALSE(released);
  EXPECT_TRUE(survivor.equal(*d.batch().find("x")));
  survivor = at::Tensor();
  EXPECT_TRUE(released);
}

TEST(Codec, EncodeErrors) {
  DataProto c = unwrap(DataProto::from_dict({{"z", torch::zeros({2}, torch::kComplexFloat)}}));
  expect_error(encode(c), ErrorCode::invalid_argument, "tensor 'z' has unsupported dtype");
  DataProto m = make_proto(1);
  m.meta_info()["bad"] = std::string("\xff\xfe", 2);  // not UTF-8: JSON cannot carry it
  expect_error(encode(m), ErrorCode::invalid_argument, "meta_info");
  DataProto j = unwrap(DataProto::from_dict({}, {{"j", Column::jsons({json(std::string("\xc3", 1))})}}));
  expect_error(encode(j), ErrorCode::invalid_argument, "column 'j' row 0");
  // Keys travel as Cap'n Proto Text, which cannot hold NUL (found by the fuzzer: "\0" and ""
  // collapsed into one key).
  DataProto nul = unwrap(DataProto::from_dict({}, {{std::string("a\0b", 3), Column::int64s({1})}}));
  expect_error(encode(nul), ErrorCode::invalid_argument, "non_tensor_batch key 'a' contains a NUL byte");
  DataProto tnul = unwrap(DataProto::from_dict({{std::string("\0", 1), torch::zeros({1})}}));
  expect_error(encode(tnul), ErrorCode::invalid_argument, "batch key '' contains a NUL byte");
}

TEST(Codec, DecodeLimits) {
  json deep = json::object();
  json* cur = &deep;
  for (int i = 0; i < 40; ++i) cur = &((*cur)["k"] = json::object());
  DataProto d = make_proto(1);
  d.meta_info()["deep"] = deep;
  auto buf = unwrap(unwrap(encode(d)).flatten());
  DecodeOptions strict;
  strict.max_json_depth = 16;
  expect_error(decode(buf, strict), ErrorCode::corrupt_data, "meta_info nests deeper than 16");
  EXPECT_TRUE(decode(buf).ok());
  DecodeOptions tiny;
  tiny.max_header_bytes = 64;
  expect_error(decode(buf, tiny), ErrorCode::corrupt_data, "exceeds the limit");
  DataProto wide = unwrap(DataProto::from_dict({{"t", torch::zeros({1, 1, 1, 1})}}));
  DecodeOptions flat;
  flat.max_ndim = 3;
  expect_error(decode(unwrap(unwrap(encode(wide)).flatten()), flat), ErrorCode::corrupt_data, "4 dims");
}

TEST(Codec, UnalignedBufferIsRejectedButDecodeCopyWorks) {
  auto buf = unwrap(unwrap(encode(make_proto(2))).flatten());
  std::vector<uint8_t> shifted(buf->size() + 1);
  std::memcpy(shifted.data() + 1, buf->data(), buf->size());
  auto unaligned = Buffer::wrap(shifted.data() + 1, buf->size(), nullptr);
  expect_error(decode(unaligned), ErrorCode::corrupt_data, "not 8-byte aligned");
  EXPECT_TRUE(decode_copy(shifted.data() + 1, buf->size()).ok());
}

}  // namespace
}  // namespace tessera::proto
