// DataProto row operations: select_idxs, reorder, repeat, sample_level_repeat, padding,
// pad_to_divisor / unpad, fold / unfold, make_iterator.
#include <set>

#include "tests/proto/test_util.hpp"

namespace tessera::proto {
namespace {

using namespace testing;  // NOLINT: the proto test helpers (test_util.hpp)
using json = nlohmann::json;

at::Tensor x_rows(const DataProto& d, const std::vector<int64_t>& rows) {
  return d.batch().find("x")->index_select(0, torch::tensor(rows, torch::kLong));
}

TEST(DataProtoSelectIdxs, IndexListsMasksAndTensors) {
  DataProto d = make_proto(5);
  DataProto s = unwrap(d.select_idxs(std::vector<int64_t>{3, -1, 0, 3}));
  EXPECT_TRUE(s.batch().find("x")->equal(x_rows(d, {3, 4, 0, 3})));
  EXPECT_EQ(uids(s), expected_uids({3, 4, 0, 3}));
  EXPECT_FALSE(shares_storage(*s.batch().find("x"), *d.batch().find("x")));
  EXPECT_EQ(s.meta_info(), d.meta_info());
  at::Tensor mask = torch::tensor({1, 0, 1, 0, 1}, torch::kBool);
  DataProto m = unwrap(d.select_idxs(mask));
  EXPECT_TRUE(m.batch().find("x")->equal(d.batch().find("x")->index({mask})));
  EXPECT_EQ(uids(m), expected_uids({0, 2, 4}));
  EXPECT_EQ(uids(unwrap(d.select_idxs(torch::tensor({4, 1}, torch::kInt)))), expected_uids({4, 1}));
  EXPECT_EQ(unwrap(d.select_idxs(std::vector<int64_t>{})).size(), 0);
}

TEST(DataProtoSelectIdxs, Errors) {
  DataProto d = make_proto(3);
  expect_error(d.select_idxs(std::vector<int64_t>{0, 3}), ErrorCode::out_of_range, "index 3 (position 1)");
  expect_error(d.select_idxs(std::vector<int64_t>{-4}), ErrorCode::out_of_range, "index -4");
  expect_error(d.select_idxs(std::vector<bool>{true}), ErrorCode::invalid_argument, "1 entries for 3 rows");
  expect_error(d.select_idxs(torch::tensor({true, false}, torch::kBool)), ErrorCode::invalid_argument,
               "2 entries for 3 rows");
  expect_error(d.select_idxs(torch::tensor({0.0, 1.0})), ErrorCode::invalid_argument, "integer or bool");
  expect_error(d.select_idxs(torch::zeros({1, 1}, torch::kLong)), ErrorCode::invalid_argument, "1-D");
  expect_error(d.select_idxs(at::Tensor()), ErrorCode::invalid_argument, "undefined");
}

TEST(DataProtoReorder, InPlaceGather) {
  DataProto d = make_proto(4);
  DataProto before = d;
  at::Tensor perm = torch::tensor({2, 0, 3, 1}, torch::kLong);
  ASSERT_OK(d.reorder(perm));
  EXPECT_TRUE(d.batch().find("x")->equal(before.batch().find("x")->index_select(0, perm)));
  EXPECT_EQ(uids(d), expected_uids({2, 0, 3, 1}));
  EXPECT_EQ(uids(before), expected_uids({0, 1, 2, 3}));  // a copy made before is untouched
  expect_error(d.reorder(torch::tensor({0, 9}, torch::kLong)), ErrorCode::out_of_range, "reorder");
}

TEST(DataProtoRepeat, InterleaveAndTile) {
  DataProto d = make_proto(3);
  const at::Tensor& x = *d.batch().find("x");
  DataProto inter = unwrap(d.repeat(2, /*interleave=*/true));
  EXPECT_TRUE(inter.batch().find("x")->equal(x.repeat_interleave(2, 0)));
  EXPECT_EQ(uids(inter), expected_uids({0, 0, 1, 1, 2, 2}));
  DataProto tiled = unwrap(d.repeat(2, /*interleave=*/false));
  EXPECT_TRUE(tiled.batch().find("x")->equal(x.repeat({2, 1})));
  EXPECT_EQ(uids(tiled), expected_uids({0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(unwrap(d.repeat(0)).size(), 0);
  expect_error(d.repeat(-1), ErrorCode::invalid_argument, "times");
}

TEST(DataProtoSampleLevelRepeat, VariableCounts) {
  DataProto d = make_proto(3);
  at::Tensor counts = torch::tensor({2, 0, 3}, torch::kLong);
  DataProto r = unwrap(d.sample_level_repeat(counts));
  EXPECT_TRUE(r.batch().find("x")->equal(d.batch().find("x")->repeat_interleave(counts, 0)));
  EXPECT_EQ(uids(r), expected_uids({0, 0, 2, 2, 2}));
  EXPECT_EQ(uids(unwrap(d.sample_level_repeat(std::vector<int64_t>{1, 1, 1}))), expected_uids({0, 1, 2}));
  expect_error(d.sample_level_repeat(std::vector<int64_t>{1, 1}), ErrorCode::invalid_argument, "2 repeat counts for 3 rows");
  expect_error(d.sample_level_repeat(std::vector<int64_t>{1, -1, 1}), ErrorCode::invalid_argument, "row 1 is negative");
  expect_error(d.sample_level_repeat(torch::tensor({1.0, 1.0, 1.0})), ErrorCode::invalid_argument, "integer");
}

TEST(DataProtoPadding, AppendsCopiesWithoutMutating) {
  DataProto d = make_proto(3);
  const void* x_ptr = d.batch().find("x")->data_ptr();
  DataProto last = unwrap(d.padding(2));
  EXPECT_TRUE(last.batch().find("x")->equal(x_rows(d, {0, 1, 2, 2, 2})));
  EXPECT_EQ(uids(last), expected_uids({0, 1, 2, 2, 2}));
  EXPECT_EQ(uids(unwrap(d.padding(2, "last"))), expected_uids({0, 1, 2, 2, 2}));
  DataProto first = unwrap(d.padding(1, "first"));
  EXPECT_EQ(uids(first), expected_uids({0, 1, 2, 0}));
  // The caller's object is untouched (verl mutated it).
  EXPECT_EQ(d.size(), 3);
  EXPECT_EQ(d.batch().find("x")->data_ptr(), x_ptr);
  EXPECT_EQ(uids(d), expected_uids({0, 1, 2}));
  EXPECT_EQ(unwrap(d.padding(0)).size(), 3);
  expect_error(d.padding(1, "middle"), ErrorCode::invalid_argument, "\"middle\"");
  expect_error(d.padding(-1), ErrorCode::invalid_argument, "padding_size");
  expect_error(make_proto(0).padding(2), ErrorCode::invalid_argument, "empty");
}

TEST(DataProtoPadToDivisor, CopiesFromTheBeginning) {
  DataProto d = make_proto(5);
  auto [padded, pad] = unwrap(d.pad_to_divisor(4));
  EXPECT_EQ(pad, 3);
  EXPECT_EQ(uids(padded), expected_uids({0, 1, 2, 3, 4, 0, 1, 2}));
  EXPECT_TRUE(padded.batch().find("x")->equal(x_rows(d, {0, 1, 2, 3, 4, 0, 1, 2})));
  EXPECT_EQ(d.size(), 5);  // not mutated
  // More padding than rows wraps around, like verl's repeated data[:take].
  auto [wrapped, pad2] = unwrap(pad_dataproto_to_divisor(make_proto(3), 8));
  EXPECT_EQ(pad2, 5);
  EXPECT_EQ(uids(wrapped), expected_uids({0, 1, 2, 0, 1, 2, 0, 1}));
  auto [same, pad0] = unwrap(d.pad_to_divisor(5));
  EXPECT_EQ(pad0, 0);
  EXPECT_EQ(same.batch().find("x")->data_ptr(), d.batch().find("x")->data_ptr());
  DataProto back = unwrap(unpad_dataproto(padded, pad));
  EXPECT_TRUE(back.batch().find("x")->equal(*d.batch().find("x")));
  EXPECT_EQ(uids(back), uids(d));
  EXPECT_TRUE(shares_storage(*back.batch().find("x"), *padded.batch().find("x")));
  EXPECT_EQ(unwrap(d.unpad(0)).size(), 5);
  expect_error(d.pad_to_divisor(0), ErrorCode::invalid_argument, "size_divisor");
  expect_error(d.unpad(6), ErrorCode::out_of_range, "pad_size 6");
  expect_error(d.unpad(-1), ErrorCode::out_of_range, "pad_size -1");
}

TEST(DataProtoFold, FoldAndUnfoldRoundTrip) {
  DataProto d = make_proto(6);
  DataProto f = unwrap(fold_batch_dim(d, 2));
  EXPECT_EQ(f.size(), 2);
  EXPECT_TRUE(f.batch().find("x")->equal(d.batch().find("x")->reshape({2, 3, 3})));
  EXPECT_TRUE(f.batch().find("ids")->equal(d.batch().find("ids")->reshape({2, 3})));
  const Column& uid = *f.non_tensor_batch().find("uid");
  EXPECT_EQ(uid.width(), 3);
  EXPECT_EQ(uid.row_json(1), json::array({"u3", "u4", "u5"}));
  DataProto u = unwrap(unfold_batch_dim(f, 2));
  EXPECT_TRUE(u.batch().find("x")->equal(*d.batch().find("x")));
  EXPECT_EQ(uids(u), uids(d));
  EXPECT_EQ(u.meta_info(), d.meta_info());
  expect_error(d.fold_batch_dim(4), ErrorCode::invalid_argument, "not divisible");
  expect_error(d.fold_batch_dim(0), ErrorCode::invalid_argument, "not divisible");
  expect_error(d.unfold_batch_dim(0), ErrorCode::invalid_argument, "batch_dims");
  expect_error(d.unfold_batch_dim(3), ErrorCode::invalid_argument, "2-D at most");
  expect_error(unwrap(d.select(std::nullopt, std::vector<std::string>{})).unfold_batch_dim(3),
               ErrorCode::invalid_argument, "tensor 'x' has 2 dims");
  DataProto t = unwrap(DataProto::from_dict({{"a", torch::zeros({2, 3})}, {"b", torch::zeros({2, 4})}}));
  expect_error(t.unfold_batch_dim(2), ErrorCode::invalid_argument, "'a' and 'b' disagree");
  DataProto three = unwrap(DataProto::from_dict({{"a", torch::arange(24).reshape({2, 3, 4})}}));
  EXPECT_TRUE(unwrap(three.unfold_batch_dim(3)).batch().find("a")->equal(torch::arange(24)));
}

TEST(DataProtoIterator, InOrderWithoutShuffle) {
  DataProto d = make_proto(6);
  DataProtoIterator it = unwrap(d.make_iterator(2, /*epochs=*/2));
  EXPECT_EQ(it.batches_per_epoch(), 3);
  EXPECT_EQ(it.total_batches(), 6);
  std::vector<std::string> seen;
  while (auto b = it.next()) {
    EXPECT_EQ(b->size(), 2);
    EXPECT_EQ(b->meta_info(), d.meta_info());
    for (const auto& u : uids(*b)) seen.push_back(u);
  }
  EXPECT_EQ(seen, expected_uids({0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5}));
  EXPECT_FALSE(it.next().has_value());
}

TEST(DataProtoIterator, ShuffleIsSeededAndCoversEveryRowOncePerEpoch) {
  DataProto d = make_proto(12);
  auto order = [&](int64_t seed) {
    DataProtoIterator it = unwrap(d.make_iterator(4, /*epochs=*/3, seed, /*shuffle=*/true));
    std::vector<std::vector<int64_t>> epochs(3);
    int64_t n = 0;
    while (auto b = it.next()) {
      const at::Tensor& ids = *b->batch().find("ids");
      for (int64_t i = 0; i < ids.size(0); ++i) {
        int64_t row = ids[i].item<int64_t>() - 100;
        epochs[n / 3].push_back(row);
        EXPECT_EQ(b->non_tensor_batch().find("uid")->str(i), "u" + std::to_string(row));
        EXPECT_TRUE(b->batch().find("x")->index({i}).equal(d.batch().find("x")->index({row})));
      }
      EXPECT_EQ(b->meta_info(), d.meta_info());
      ++n;
    }
    EXPECT_EQ(n, 9);
    return epochs;
  };
  auto a = order(7);
  EXPECT_EQ(a, order(7));  // deterministic
  EXPECT_NE(a, order(8));
  for (const auto& epoch : a) {
    std::set<int64_t> rows(epoch.begin(), epoch.end());
    EXPECT_EQ(epoch.size(), 12u);
    EXPECT_EQ(rows.size(), 12u);  // every row exactly once
  }
  EXPECT_NE(a[0], a[1]);  // each epoch reshuffles
}

TEST(DataProtoIterator, Errors) {
  DataProto d = make_proto(5);
  expect_error(d.make_iterator(2), ErrorCode::invalid_argument, "5 % 2 != 0");
  expect_error(d.make_iterator(0), ErrorCode::invalid_argument, "mini_batch_size");
  expect_error(d.make_iterator(5, -1), ErrorCode::invalid_argument, "epochs");
  DataProtoIterator none = unwrap(d.make_iterator(5, 0));
  EXPECT_FALSE(none.next().has_value());
}

}  // namespace
}  // namespace tessera::proto
