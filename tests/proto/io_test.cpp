// save/load: round trip through a file, atomic replace, errors naming the file.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "proto/codec.hpp"
#include "tests/proto/test_util.hpp"

namespace tessera::proto {
namespace {

namespace fs = std::filesystem;
using namespace testing;  // NOLINT: the proto test helpers (test_util.hpp)

class ProtoIo : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tessera_proto_io_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

TEST_F(ProtoIo, SaveLoadRoundTrip) {
  DataProto d = make_proto(9);
  d.meta_info()["metrics"] = {{"a", {1, 2}}};
  const std::string p = path("batch.tdp");
  ASSERT_OK(d.save(p));
  DataProto back = unwrap(DataProto::load(p));
  EXPECT_TRUE(back.batch().find("x")->equal(*d.batch().find("x")));
  EXPECT_TRUE(back.batch().find("ids")->equal(*d.batch().find("ids")));
  EXPECT_EQ(uids(back), uids(d));
  EXPECT_TRUE(back.non_tensor_batch().find("score")->equals(*d.non_tensor_batch().find("score")));
  EXPECT_EQ(back.meta_info(), d.meta_info());
  // The file holds exactly one frame, and no temporary file is left behind.
  EXPECT_EQ(fs::file_size(p), unwrap(encode(d)).size());
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
  // Writing to a loaded (mapped, copy-on-write) tensor never reaches the file.
  back.batch().find("x")->fill_(-1);
  EXPECT_TRUE(unwrap(DataProto::load(p)).batch().find("x")->equal(*d.batch().find("x")));
}

TEST_F(ProtoIo, SaveReplacesAtomically) {
  const std::string p = path("batch.tdp");
  ASSERT_OK(make_proto(2).save(p));
  DataProto held = unwrap(DataProto::load(p));  // keeps the old mapping alive
  ASSERT_OK(make_proto(5).save(p));
  EXPECT_EQ(unwrap(DataProto::load(p)).size(), 5);
  EXPECT_EQ(held.size(), 2);
  EXPECT_EQ(uids(held), uids(make_proto(2)));
}

TEST_F(ProtoIo, TruncatedAndCorruptFilesNameTheFile) {
  const std::string p = path("batch.tdp");
  ASSERT_OK(make_proto(4).save(p));
  const auto full = fs::file_size(p);
  fs::resize_file(p, full - 10);
  auto r = DataProto::load(p);
  expect_error(r, ErrorCode::corrupt_data, p);
  EXPECT_NE(r.status().message().find("truncated"), std::string::npos);
  {
    std::ofstream garbage(path("garbage.tdp"), std::ios::binary);
    garbage << "this is not a frame at all, just text";
  }
  expect_error(DataProto::load(path("garbage.tdp")), ErrorCode::corrupt_data, path("garbage.tdp"));
  { std::ofstream empty(path("empty.tdp")); }
  expect_error(DataProto::load(path("empty.tdp")), ErrorCode::corrupt_data, path("empty.tdp"));
  expect_error(DataProto::load(path("missing.tdp")), ErrorCode::not_found, path("missing.tdp"));
}

TEST_F(ProtoIo, SaveErrorsNameThePath) {
  const std::string p = path("no_such_dir/batch.tdp");
  expect_error(make_proto(1).save(p), ErrorCode::io_error, p);
  DataProto c = unwrap(DataProto::from_dict({{"z", torch::zeros({1}, torch::kComplexDouble)}}));
  expect_error(c.save(path("c.tdp")), ErrorCode::invalid_argument, path("c.tdp"));
  EXPECT_FALSE(fs::exists(path("c.tdp")));
}

}  // namespace
}  // namespace tessera::proto
