// DataProto construction and key operations: from_dict, size, accessors, select, pop, rename,
// union_, is_padding_enabled, check_consistency.
#include <cmath>
#include <cstdlib>
#include <limits>

#include "tests/proto/test_util.hpp"

namespace tessera::proto {
namespace {

using namespace testing;  // NOLINT: the proto test helpers (test_util.hpp)
using json = nlohmann::json;

TEST(DataProtoFromDict, BuildsAndKeepsKeyOrder) {
  DataProto d = make_proto(4);
  EXPECT_EQ(d.size(), 4);
  EXPECT_EQ(d.batch().keys(), (std::vector<std::string>{"x", "ids"}));
  EXPECT_EQ(d.non_tensor_batch().keys(), (std::vector<std::string>{"uid", "score"}));
  EXPECT_EQ(d.meta_info()["temperature"], 0.7);
  EXPECT_TRUE(d.check_consistency().ok());
  EXPECT_FALSE(d.is_padding_enabled());
}

TEST(DataProtoFromDict, RejectsMismatchedLengths) {
  TensorDict t{{"a", torch::zeros({4, 2})}, {"b", torch::zeros({3})}};
  expect_error(DataProto::from_dict(t), ErrorCode::invalid_argument, "'b' has 3 rows but 'a' has 4");
  TensorDict ok{{"a", torch::zeros({4, 2})}};
  NonTensorBatch c{{"s", Column::strings({"x"})}};
  expect_error(DataProto::from_dict(ok, c), ErrorCode::invalid_argument, "'s' has 1 rows");
  TensorDict scalar{{"s", torch::tensor(1.0)}};
  expect_error(DataProto::from_dict(scalar), ErrorCode::invalid_argument, "0-dim");
  expect_error(DataProto::from_dict(ok, {}, json::array()), ErrorCode::invalid_argument, "JSON object");
}

TEST(DataProtoFromDict, AutoPaddingAndEnv) {
  DataProto d = make_proto(3, /*auto_padding=*/true);
  EXPECT_EQ(d.meta_info()[kAutoPaddingKey], true);
  EXPECT_TRUE(d.is_padding_enabled());
  DataProto plain = make_proto(3);
  ASSERT_EQ(::setenv("VERL_AUTO_PADDING", "TRUE", 1), 0);
  EXPECT_TRUE(plain.is_padding_enabled());
  ASSERT_EQ(::setenv("VERL_AUTO_PADDING", "0", 1), 0);
  EXPECT_FALSE(plain.is_padding_enabled());
  ::unsetenv("VERL_AUTO_PADDING");
}

TEST(DataProtoSize, FollowsVerlLen) {
  EXPECT_EQ(DataProto().size(), 0);
  NonTensorBatch c{{"s", Column::strings({"a", "b"})}};
  EXPECT_EQ(unwrap(DataProto::from_dict({}, c)).size(), 2);
}

TEST(DataProtoAccessors, TensorColumnSet) {
  DataProto d = make_proto(3);
  EXPECT_TRUE(unwrap(d.tensor("ids")).equal(torch::tensor({100, 101, 102}, torch::kLong)));
  EXPECT_EQ(unwrap(d.column("uid")).str(2), "u2");
  expect_error(d.tensor("nope"), ErrorCode::not_found, "'nope'");
  expect_error(d.column("nope"), ErrorCode::not_found, "'nope'");
  ASSERT_OK(d.set_tensor("y", torch::ones({3, 5})));
  EXPECT_EQ(d.batch().keys().back(), "y");
  expect_error(d.set_tensor("z", torch::ones({2})), ErrorCode::invalid_argument, "'z' has 2 rows");
  expect_error(d.set_tensor("z", torch::tensor(1)), ErrorCode::invalid_argument, "batch dim");
  ASSERT_OK(d.set_column("n", Column::int64s({1, 2, 3})));
  expect_error(d.set_column("m", Column::int64s({1})), ErrorCode::invalid_argument, "'m' has 1 rows");
  DataProto single = unwrap(DataProto::from_dict({{"a", torch::zeros({2})}}));
  ASSERT_OK(single.set_tensor("a", torch::zeros({5})));  // replacing the only key may resize
  EXPECT_EQ(single.size(), 5);
}

TEST(DataProtoSelect, SubsetsWithoutCopyingTensors) {
  DataProto d = make_proto(4);
  d.meta_info()["eos"] = 2;
  DataProto s = unwrap(d.select(std::vector<std::string>{"ids"}, std::vector<std::string>{"uid"},
                                std::vector<std::string>{"eos"}));
  EXPECT_EQ(s.batch().keys(), std::vector<std::string>{"ids"});
  EXPECT_EQ(s.non_tensor_batch().keys(), std::vector<std::string>{"uid"});
  EXPECT_EQ(s.meta_info(), (json{{"eos", 2}}));
  EXPECT_EQ(s.batch().find("ids")->data_ptr(), d.batch().find("ids")->data_ptr());
  EXPECT_EQ(s.non_tensor_batch().find("uid")->storage_id(), d.non_tensor_batch().find("uid")->storage_id());
  DataProto all = unwrap(d.select());
  EXPECT_EQ(all.batch().keys(), d.batch().keys());
  EXPECT_EQ(all.meta_info(), d.meta_info());
  DataProto deep = unwrap(d.select(std::nullopt, std::nullopt, std::nullopt, /*deepcopy=*/true));
  EXPECT_NE(deep.non_tensor_batch().find("uid")->storage_id(), d.non_tensor_batch().find("uid")->storage_id());
  EXPECT_TRUE(deep.non_tensor_batch().find("uid")->equals(*d.non_tensor_batch().find("uid")));
}

TEST(DataProtoSelect, MissingKeys) {
  DataProto d = make_proto(2);
  expect_error(d.select(std::vector<std::string>{"x", "nope"}), ErrorCode::not_found, "batch key 'nope'");
  expect_error(d.select(std::nullopt, std::vector<std::string>{"nope"}), ErrorCode::not_found,
               "non_tensor_batch key 'nope'");
  expect_error(d.select(std::nullopt, std::nullopt, std::vector<std::string>{"nope"}), ErrorCode::not_found,
               "meta_info key 'nope'");
}

TEST(DataProtoPop, RemovesAndReturns) {
  DataProto d = make_proto(3);
  const void* ids_ptr = d.batch().find("ids")->data_ptr();
  DataProto p = unwrap(d.pop(std::vector<std::string>{"ids"}, std::vector<std::string>{"score"},
                             std::vector<std::string>{"temperature"}));
  EXPECT_EQ(p.batch().keys(), std::vector<std::string>{"ids"});
  EXPECT_EQ(p.batch().find("ids")->data_ptr(), ids_ptr);
  EXPECT_EQ(p.non_tensor_batch().keys(), std::vector<std::string>{"score"});
  EXPECT_EQ(p.meta_info(), (json{{"temperature", 0.7}}));
  EXPECT_EQ(d.batch().keys(), std::vector<std::string>{"x"});
  EXPECT_EQ(d.non_tensor_batch().keys(), std::vector<std::string>{"uid"});
  EXPECT_TRUE(d.meta_info().empty());
  DataProto none = unwrap(d.pop());
  EXPECT_TRUE(none.batch().empty());
  EXPECT_EQ(d.batch().size(), 1u);
}

TEST(DataProtoPop, MissingKeyLeavesObjectUnchanged) {
  DataProto d = make_proto(3);
  expect_error(d.pop(std::vector<std::string>{"x", "nope"}), ErrorCode::not_found, "batch key 'nope'");
  expect_error(d.pop(std::nullopt, std::nullopt, std::vector<std::string>{"nope"}), ErrorCode::not_found,
               "meta_info key 'nope'");
  expect_error(d.pop(std::vector<std::string>{"x", "x"}), ErrorCode::invalid_argument, "twice");
  EXPECT_EQ(d.batch().keys(), (std::vector<std::string>{"x", "ids"}));
  EXPECT_TRUE(d.meta_info().contains("temperature"));
}

TEST(DataProtoRename, KeepsPositionAndIsAtomic) {
  DataProto d = make_proto(2);
  const void* x_ptr = d.batch().find("x")->data_ptr();
  ASSERT_OK(d.rename({"x"}, {"obs"}));
  EXPECT_EQ(d.batch().keys(), (std::vector<std::string>{"obs", "ids"}));
  EXPECT_EQ(d.batch().find("obs")->data_ptr(), x_ptr);
  ASSERT_OK(d.rename({"obs", "ids"}, {"ids2", "obs2"}));
  EXPECT_EQ(d.batch().keys(), (std::vector<std::string>{"ids2", "obs2"}));
  expect_error(d.rename({"ids2"}, {"a", "b"}), ErrorCode::invalid_argument, "lengths must match");
  expect_error(d.rename({"ids2", "nope"}, {"z", "y"}), ErrorCode::not_found, "'nope'");
  EXPECT_EQ(d.batch().keys(), (std::vector<std::string>{"ids2", "obs2"}));  // unchanged
  expect_error(d.rename({"ids2"}, {"obs2"}), ErrorCode::already_exists, "'obs2'");
}

TEST(DataProtoUnion, AddsNewKeysAndChecksSharedOnes) {
  DataProto a = make_proto(3);
  DataProto b = unwrap(a.select(std::vector<std::string>{"ids"}, std::vector<std::string>{"uid"}));
  ASSERT_OK(b.set_tensor("new", torch::ones({3, 2})));
  ASSERT_OK(b.set_column("tag", Column::int64s({1, 2, 3})));
  b.meta_info()["extra"] = "yes";
  ASSERT_OK(a.union_(b));
  EXPECT_EQ(a.batch().keys(), (std::vector<std::string>{"x", "ids", "new"}));
  EXPECT_EQ(a.non_tensor_batch().keys(), (std::vector<std::string>{"uid", "score", "tag"}));
  EXPECT_EQ(a.meta_info()["extra"], "yes");
}

TEST(DataProtoUnion, NanAwareEquality) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  at::Tensor t = torch::tensor({1.0f, nan, 3.0f});
  DataProto a = unwrap(DataProto::from_dict({{"v", t}}));
  DataProto b = unwrap(DataProto::from_dict({{"v", t.clone()}}));  // a different copy holding NaN
  ASSERT_OK(a.union_(b));
  NonTensorBatch c1{{"d", Column::doubles({std::nan(""), 1.0, 2.0})}};
  NonTensorBatch c2{{"d", Column::doubles({std::nan(""), 1.0, 2.0})}};
  DataProto ca = unwrap(DataProto::from_dict({}, c1));
  ASSERT_OK(ca.union_(unwrap(DataProto::from_dict({}, c2))));
}

TEST(DataProtoUnion, ConflictsAreErrorsAndAtomic) {
  DataProto a = make_proto(3);
  DataProto b = make_proto(3);
  ASSERT_OK(b.set_tensor("brand_new", torch::zeros({3})));
  ASSERT_OK(b.set_tensor("ids", torch::tensor({100, 101, 999}, torch::kLong)));
  expect_error(a.union_(b), ErrorCode::invalid_argument, "batch key 'ids'");
  EXPECT_FALSE(a.batch().contains("brand_new"));  // atomic
  DataProto c = make_proto(3);
  ASSERT_OK(c.set_column("uid", Column::strings({"u0", "u1", "zz"})));
  expect_error(a.union_(c), ErrorCode::invalid_argument, "non_tensor_batch key 'uid'");
  DataProto m = make_proto(3);
  m.meta_info()["temperature"] = 1.0;
  expect_error(a.union_(m), ErrorCode::invalid_argument, "meta_info key 'temperature'");
  expect_error(a.union_(make_proto(4)), ErrorCode::invalid_argument, "sizes differ (3 vs 4)");
  DataProto shape = make_proto(3);
  ASSERT_OK(shape.set_tensor("x", torch::zeros({3, 4})));
  expect_error(a.union_(shape), ErrorCode::invalid_argument, "batch key 'x'");
}

TEST(DataProtoUnion, IntoEmpty) {
  DataProto e;
  ASSERT_OK(e.union_(make_proto(5)));
  EXPECT_EQ(e.size(), 5);
}

TEST(DataProtoTo, MovesToCpuAndRejectsMissingDevice) {
  DataProto d = make_proto(2);
  ASSERT_OK(d.to(torch::Device(torch::kCPU)));
  EXPECT_TRUE(d.batch().find("x")->device().is_cpu());
  if (!torch::cuda::is_available()) {
    expect_error(d.to(torch::Device(torch::kCUDA, 0)), ErrorCode::invalid_argument, "batch key 'x'");
    EXPECT_TRUE(d.batch().find("x")->device().is_cpu());
  }
}

}  // namespace
}  // namespace tessera::proto
