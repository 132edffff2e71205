// safetensors: round trips for every dtype, zero-copy mmap lifetime, sharded checkpoints, and a
// clear error (naming file and tensor) for each kind of malformed file.
#include <cstring>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "tests/workers/models/model_test_util.hpp"
#include "workers/models/safetensors.hpp"

namespace tessera::models {
namespace {

using testing::TempDir;

void write_raw(const std::string& path, const std::string& header, const std::string& data, int64_t n = -1) {
  std::ofstream out(path, std::ios::binary);
  uint64_t len = n >= 0 ? static_cast<uint64_t>(n) : header.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << header << data;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(Safetensors, RoundTripsEveryDtype) {
  TempDir dir;
  TensorMap t;
  t["f64"] = at::randn({3, 2}, at::kDouble);
  t["f32"] = at::randn({5});
  t["f16"] = at::randn({2, 3}).to(at::kHalf);
  t["bf16"] = at::randn({7}).to(at::kBFloat16);
  t["i64"] = at::arange(6, at::kLong).view({2, 3});
  t["i32"] = at::arange(3, at::kInt);
  t["u8"] = at::arange(5, at::kByte);
  t["bool"] = at::tensor({1, 0, 1}, at::kByte).to(at::kBool);
  t["scalar"] = at::tensor(3.5);
  t["empty"] = at::zeros({0, 4});
  t["strided"] = at::randn({4, 6}).t();  // non-contiguous input
  ASSERT_TRUE(write_safetensors(dir / "a.safetensors", t, {{"format", "pt"}}).ok());
  auto r = read_safetensors(dir / "a.safetensors");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->metadata.at("format"), "pt");
  ASSERT_EQ(r->tensors.size(), t.size());
  for (const auto& [name, v] : t) {
    const at::Tensor& got = r->tensors.at(name);
    EXPECT_EQ(got.scalar_type(), v.scalar_type()) << name;
    EXPECT_TRUE(at::equal(got, v)) << name;
  }
  // Header length is a multiple of 8 so every tensor is aligned.
  std::string bytes = read_bytes(dir / "a.safetensors");
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
}

TEST(Safetensors, TensorsAliasThePrivateMappingAndOutliveTheResult) {
  TempDir dir;
  at::Tensor x = at::arange(1024, at::kFloat);
  ASSERT_TRUE(write_safetensors(dir / "m.safetensors", {{"x", x}}).ok());
  std::string before = read_bytes(dir / "m.safetensors");
  at::Tensor loaded;
  {
    auto r = read_safetensors(dir / "m.safetensors");
    ASSERT_TRUE(r.ok());
    loaded = r->tensors.at("x");
  }
  EXPECT_TRUE(at::equal(loaded, x));
  loaded.mul_(2);  // copy-on-write: allowed, never reaches the file
  EXPECT_EQ(loaded[3].item<float>(), 6.0f);
  EXPECT_EQ(read_bytes(dir / "m.safetensors"), before);
  std::filesystem::remove(dir / "m.safetensors");  // the mapping keeps the data alive
  EXPECT_EQ(loaded[1023].item<float>(), 2046.0f);
}

TEST(Safetensors, ShardedCheckpointRoundTrip) {
  TempDir dir;
  TensorMap t;
  for (int i = 0; i < 6; ++i) t["layer." + std::to_string(i)] = at::randn({64, 16});  // 4 KiB each
  ASSERT_TRUE(write_safetensors_checkpoint(dir.path(), t, {/*max_shard_bytes=*/10000, "model"}).ok());
  EXPECT_TRUE(std::filesystem::exists(dir / "model.safetensors.index.json"));
  EXPECT_TRUE(std::filesystem::exists(dir / "model-00003-of-00003.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(dir / "model.safetensors"));
  auto index = nlohmann::json::parse(read_bytes(dir / "model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), 6 * 64 * 16 * 4);
  EXPECT_EQ(index["weight_map"]["layer.0"], "model-00001-of-00003.safetensors");
  auto r = read_safetensors_checkpoint(dir.path());
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->size(), t.size());
  for (const auto& [name, v] : t) EXPECT_TRUE(at::equal(r->at(name), v)) << name;
  // Rewriting as one file removes the stale index.
  ASSERT_TRUE(write_safetensors_checkpoint(dir.path(), t).ok());
  EXPECT_FALSE(std::filesystem::exists(dir / "model.safetensors.index.json"));
  EXPECT_EQ(read_safetensors_checkpoint(dir.path())->size(), t.size());
}

TEST(Safetensors, IndexNamingAMissingTensorIsAnError) {
  TempDir dir;
  ASSERT_TRUE(write_safetensors(dir / "s1.safetensors", {{"a", at::ones({2})}}).ok());
  std::ofstream(dir / "model.safetensors.index.json") << R"({"weight_map": {"a": "s1.safetensors", "b": "s1.safetensors"}})";
  auto r = read_safetensors_checkpoint(dir.path());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'b'"), std::string::npos) << r.status().to_string();
  std::ofstream(dir / "model.safetensors.index.json") << R"({"weight_map": {"a": "../etc/passwd"}})";
  EXPECT_FALSE(read_safetensors_checkpoint(dir.path()).ok());
}

struct Malformed {
  std::string name;
  std::string header;
  std::string data;
  int64_t header_len;     // -1: the real length
  std::string expect;     // substring of the error
};

class SafetensorsMalformed : public ::testing::TestWithParam<Malformed> {};

TEST_P(SafetensorsMalformed, GivesAClearError) {
  TempDir dir;
  const Malformed& m = GetParam();
  std::string path = dir / (m.name + ".safetensors");
  write_raw(path, m.header, m.data, m.header_len);
  auto r = read_safetensors(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().to_string();
  EXPECT_NE(r.status().message().find(m.expect), std::string::npos) << r.status().to_string();
}

const std::string kEight(8, '\0');

INSTANTIATE_TEST_SUITE_P(
    Cases, SafetensorsMalformed,
    ::testing::Values(
        Malformed{"header_past_eof", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", kEight, 4096,
                  "header length 4096 runs past the end"},
        Malformed{"not_json", "{not json at all", "", -1, "not a JSON object"},
        Malformed{"json_array", "[1,2]", "", -1, "not a JSON object"},
        Malformed{"unknown_dtype", R"({"w":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", "\0\0", -1,
                  "tensor 'w': unknown dtype 'F8_E4M3'"},
        Malformed{"past_end", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", kEight, -1,
                  "tensor 'w': data_offsets [0, 16] run past the end"},
        Malformed{"size_mismatch", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", kEight, -1,
                  "tensor 'w': shape [3] x 4 bytes does not match"},
        Malformed{"overlap",
                  R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                  kEight, -1, "overlap tensor 'a'"},
        Malformed{"hole",
                  R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"I8","shape":[2],"data_offsets":[6,8]}})",
                  kEight, -1, "tensor 'b': data_offsets start at 6 leaving a hole"},
        Malformed{"reversed", R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}})", kEight, -1,
                  "tensor 'w': data_offsets [8, 0] are reversed"},
        Malformed{"trailing", R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", kEight, -1,
                  "4 bytes of data after the last tensor"},
        Malformed{"negative_dim", R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "\0\0\0\0", -1,
                  "tensor 'w': bad dimension -1"},
        Malformed{"overflow", R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})",
                  "\0\0\0\0", -1, "tensor 'w': shape overflows"},
        Malformed{"missing_offsets", R"({"w":{"dtype":"F32","shape":[1]}})", "\0\0\0\0", -1,
                  "tensor 'w': 'data_offsets' must be two non-negative integers"},
        Malformed{"bad_metadata", R"({"__metadata__":{"k":1}})", "", -1, "'__metadata__.k' is not a string"}),
    [](const auto& info) { return info.param.name; });

TEST(Safetensors, TruncatedAndMissingFiles) {
  TempDir dir;
  std::ofstream(dir / "short.safetensors") << "abc";
  auto r = read_safetensors(dir / "short.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("truncated"), std::string::npos);
  EXPECT_NE(r.status().message().find("short.safetensors"), std::string::npos);
  std::ofstream(dir / "empty.safetensors");
  EXPECT_FALSE(read_safetensors(dir / "empty.safetensors").ok());
  auto missing = read_safetensors(dir / "nope.safetensors");
  EXPECT_EQ(missing.status().code(), ErrorCode::not_found);
  // A valid file cut short: the header now claims data past the end.
  ASSERT_TRUE(write_safetensors(dir / "ok.safetensors", {{"w", at::ones({16})}}).ok());
  std::string bytes = read_bytes(dir / "ok.safetensors");
  std::ofstream(dir / "cut.safetensors", std::ios::binary) << bytes.substr(0, bytes.size() - 10);
  auto cut = read_safetensors(dir / "cut.safetensors");
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find("tensor 'w'"), std::string::npos) << cut.status().to_string();
}

TEST(Safetensors, MisalignedTensorIsCopiedNotMisread) {
  TempDir dir;
  // An I8 tensor of 1 byte pushes the F32 tensor to an odd offset (legal, never written by us).
  std::string header = R"({"a":{"dtype":"I8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"F32","shape":[1],"data_offsets":[1,5]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  float f = 1.25f;
  std::string data(1, '\x07');
  data.append(reinterpret_cast<const char*>(&f), 4);
  write_raw(dir / "odd.safetensors", header, data);
  auto r = read_safetensors(dir / "odd.safetensors");
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->tensors.at("a").item<int8_t>(), 7);
  EXPECT_EQ(r->tensors.at("b").item<float>(), 1.25f);
}

}  // namespace
}  // namespace tessera::models
