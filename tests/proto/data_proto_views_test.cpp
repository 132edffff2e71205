// DataProto views: index, slice, chunk, split, concat (zero-copy proofs and meta merge).
#include <utility>

#include "tests/proto/test_util.hpp"

namespace tessera::proto {
namespace {

using namespace testing;  // NOLINT: the proto test helpers (test_util.hpp)
using json = nlohmann::json;
namespace ti = torch::indexing;

TEST(DataProtoIndex, IntegerGivesItem) {
  DataProto d = make_proto(5);
  DataProtoItem item = unwrap(d.index(-2));
  const at::Tensor& x = *d.batch().find("x");
  EXPECT_TRUE(item.batch.find("x")->equal(x[3]));
  EXPECT_TRUE(shares_storage(*item.batch.find("x"), x));
  EXPECT_EQ(item.batch.find("ids")->item<int64_t>(), 103);
  EXPECT_EQ(item.non_tensor_batch.find("uid")->str(0), "u3");
  EXPECT_EQ(item.meta_info, d.meta_info());
  expect_error(d.index(5), ErrorCode::out_of_range, "row 5");
  expect_error(d.index(-6), ErrorCode::out_of_range, "row -6");
}

TEST(DataProtoIndex, OtherKindsDispatch) {
  DataProto d = make_proto(6);
  EXPECT_EQ(uids(unwrap(d.index(Slice{1, 5, 2}))), expected_uids({1, 3}));
  EXPECT_EQ(uids(unwrap(d.index(std::vector<int64_t>{4, -6}))), expected_uids({4, 0}));
  EXPECT_EQ(uids(unwrap(d.index(std::vector<bool>{true, false, false, false, false, true}))),
            expected_uids({0, 5}));
  EXPECT_EQ(uids(unwrap(d.index(torch::tensor({2, 2}, torch::kLong)))), expected_uids({2, 2}));
}

TEST(DataProtoSlice, PythonSemanticsAsViews) {
  const int64_t n = 7;
  DataProto d = make_proto(n);
  const at::Tensor& x = *d.batch().find("x");
  const std::vector<std::optional<int64_t>> bounds = {std::nullopt, -9, -3, -1, 0, 2, 5, 7, 10};
  for (auto start : bounds) {
    for (auto stop : bounds) {
      for (int64_t step : {1, 2, 3}) {
        DataProto s = unwrap(d.slice(start, stop, step));
        // Reference: torch's own Python-style indexing of the source tensor.
        at::Tensor expected = x.index({ti::Slice(start ? c10::optional<int64_t>(*start) : c10::nullopt,
                                                 stop ? c10::optional<int64_t>(*stop) : c10::nullopt, step)});
        const at::Tensor& got = *s.batch().find("x");
        ASSERT_TRUE(got.equal(expected));
        ASSERT_EQ(s.size(), expected.size(0));
        if (s.size() > 0) {
          ASSERT_TRUE(shares_storage(got, x));
        }
        std::vector<int64_t> rows;
        for (int64_t r = 0; r < expected.size(0); ++r) rows.push_back(static_cast<int64_t>(expected[r][0].item<float>() / 3));
        ASSERT_EQ(uids(s), expected_uids(rows));
        if (s.size() > 0) {
          ASSERT_EQ(s.non_tensor_batch().find("uid")->storage_id(), d.non_tensor_batch().find("uid")->storage_id());
        }
      }
    }
  }
  expect_error(d.slice(0, 3, 0), ErrorCode::invalid_argument, "step");
}

TEST(DataProtoChunk, EqualChunksAreViews) {
  DataProto d = make_proto(8);
  auto chunks = unwrap(d.chunk(4));
  ASSERT_EQ(chunks.size(), 4u);
  const at::Tensor& x = *d.batch().find("x");
  auto ref = x.chunk(4);
  for (size_t i = 0; i < 4; ++i) {
    const at::Tensor& c = *chunks[i].batch().find("x");
    EXPECT_TRUE(c.equal(ref[i]));
    EXPECT_EQ(c.data_ptr(), static_cast<float*>(x.data_ptr()) + 6 * i);  // a view, no copy
    EXPECT_EQ(uids(chunks[i]), expected_uids({int64_t(2 * i), int64_t(2 * i + 1)}));
    EXPECT_EQ(chunks[i].non_tensor_batch().find("uid")->storage_id(),
              d.non_tensor_batch().find("uid")->storage_id());
    EXPECT_EQ(chunks[i].meta_info(), d.meta_info());
  }
}

// Note [Fast row views]: views built without LibTorch's view ops must be what narrow/slice give
// (sizes, strides, offset, storage, dtype, device, version counter), and tensors that autograd
// or a TensorImpl subclass must see through keep LibTorch's own views.
TEST(DataProtoChunk, DirectViewsMatchLibTorchViews) {
  DataProto d = make_proto(8);
  const at::Tensor x = *d.batch().find("x");
  auto expect_same_view = [](const at::Tensor& got, const at::Tensor& want) {
    EXPECT_EQ(got.sizes(), want.sizes());
    EXPECT_EQ(got.strides(), want.strides());
    EXPECT_EQ(got.storage_offset(), want.storage_offset());
    EXPECT_TRUE(got.storage().is_alias_of(want.storage()));
    EXPECT_EQ(got.scalar_type(), want.scalar_type());
    EXPECT_EQ(got.device(), want.device());
    EXPECT_EQ(got.is_contiguous(), want.is_contiguous());
    EXPECT_TRUE(got.equal(want));
  };
  for (int64_t step : {1, 3}) {
    for (int64_t start : {0, 2, 7}) {
      DataProto s = unwrap(d.slice(start, std::nullopt, step));
      expect_same_view(*s.batch().find("x"), x.slice(0, start, 8, step));
    }
  }
  DataProto empty_tail = unwrap(d.slice(8, 8, 1));
  expect_same_view(*empty_tail.batch().find("x"), x.narrow(0, 8, 0));

  // A write through a chunk is a write to the batch, and bumps the version autograd checks.
  auto chunks = unwrap(d.chunk(4));
  at::Tensor c1 = *chunks[1].batch().find("x");
  const auto version = x._version();
  c1.add_(1000);
  EXPECT_EQ(x._version(), version + 1);
  EXPECT_EQ(x[2][0].item<float>(), 1000 + 6);

  // Autograd must see a view of a tensor requiring grad: its chunks keep their grad_fn.
  DataProto g = make_proto(4);
  TensorDict t = g.batch();
  t.insert_or_assign("w", torch::ones({4, 2}, torch::requires_grad()));
  DataProto with_grad = unwrap(DataProto::from_dict(t));
  auto gc = unwrap(with_grad.chunk(2));
  const at::Tensor& w1 = *gc[1].batch().find("w");
  EXPECT_TRUE(w1.requires_grad());
  EXPECT_TRUE(w1.is_view());
  w1.sum().backward();
  const at::Tensor& w = *with_grad.batch().find("w");
  EXPECT_TRUE(w.grad().equal(torch::tensor({0.f, 0.f, 1.f, 1.f}).unsqueeze(1).expand({4, 2})));

  // Inside InferenceMode a view of a normal tensor stays a normal tensor.
  {
    c10::InferenceMode guard;
    auto ic = unwrap(d.chunk(2));
    EXPECT_FALSE(ic[0].batch().find("x")->is_inference());
    expect_same_view(*ic[1].batch().find("x"), x.narrow(0, 4, 4));
  }
}

TEST(DataProtoChunk, Errors) {
  DataProto d = make_proto(5);
  expect_error(d.chunk(2), ErrorCode::invalid_argument, "length 5 is not divisible by 2");
  expect_error(d.chunk(0), ErrorCode::invalid_argument, "chunks must be >= 1");
}

TEST(DataProtoChunk, PaddingEnabledFollowsTensorDictChunk) {
  DataProto d = make_proto(7, /*auto_padding=*/true);
  auto chunks = unwrap(d.chunk(4));
  auto ref = d.batch().find("x")->chunk(4);  // torch.chunk: 2, 2, 2, 1
  ASSERT_EQ(chunks.size(), ref.size());
  for (size_t i = 0; i < chunks.size(); ++i) EXPECT_TRUE(chunks[i].batch().find("x")->equal(ref[i]));
  // 5 rows into 4: torch.chunk gives 3 pieces of 2, 2, 1 -> error rather than fewer chunks.
  DataProto five = make_proto(5, /*auto_padding=*/true);
  EXPECT_EQ(five.batch().find("x")->chunk(4).size(), 3u);
  expect_error(five.chunk(4), ErrorCode::invalid_argument, "only 3 chunks");
}

TEST(DataProtoChunk, EmptyAndKeyless) {
  auto empty = unwrap(make_proto(0).chunk(3));
  ASSERT_EQ(empty.size(), 3u);
  for (const auto& c : empty) EXPECT_EQ(c.size(), 0);
  DataProto meta_only;
  meta_only.meta_info()["k"] = 1;
  auto chunks = unwrap(meta_only.chunk(2));
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[1].meta_info()["k"], 1);
}

TEST(DataProtoSplit, LastPieceShorter) {
  DataProto d = make_proto(7);
  auto parts = unwrap(d.split(3));
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(uids(parts[2]), expected_uids({6}));
  auto ref = d.batch().find("x")->split(3);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(parts[i].batch().find("x")->equal(ref[i]));
    EXPECT_TRUE(shares_storage(*parts[i].batch().find("x"), *d.batch().find("x")));
  }
  EXPECT_TRUE(unwrap(make_proto(0).split(2)).empty());
  expect_error(d.split(0), ErrorCode::invalid_argument, "split_size");
}

TEST(DataProtoConcat, ChunkThenConcatIsZeroCopy) {
  DataProto d = make_proto(16);
  auto chunks = unwrap(d.chunk(8));
  DataProto joined = unwrap(DataProto::concat(chunks));
  for (const auto& key : d.batch().keys()) {
    const at::Tensor& a = *d.batch().find(key);
    const at::Tensor& b = *joined.batch().find(key);
    EXPECT_EQ(a.data_ptr(), b.data_ptr()) << key;
    EXPECT_TRUE(b.storage().is_alias_of(a.storage())) << key;
    EXPECT_TRUE(a.equal(b));
  }
  for (const auto& key : d.non_tensor_batch().keys()) {
    const Column& a = *d.non_tensor_batch().find(key);
    const Column& b = *joined.non_tensor_batch().find(key);
    EXPECT_EQ(a.storage_id(), b.storage_id()) << key;
    EXPECT_EQ(a.storage_offset(), b.storage_offset());
    EXPECT_TRUE(a.equals(b));
  }
  // Adjacent views of a slice re-join too.
  DataProto mid = unwrap(d.slice(4, 12));
  DataProto rejoined = unwrap(DataProto::concat(unwrap(mid.split(3))));
  EXPECT_EQ(rejoined.batch().find("x")->data_ptr(), mid.batch().find("x")->data_ptr());
}

// The overload over pointers (the dispatch layer's collect: outputs are not copied first) gives
// what the one over values gives, zero-copy re-join included.
TEST(DataProtoConcat, OverPointersMatchesOverValues) {
  DataProto d = make_proto(6);
  auto chunks = unwrap(d.chunk(3));
  for (const std::vector<size_t>& order : {std::vector<size_t>{0, 1, 2}, std::vector<size_t>{2, 0, 1}}) {
    std::vector<DataProto> values;
    std::vector<const DataProto*> refs;
    for (size_t i : order) {
      values.push_back(chunks[i]);
      refs.push_back(&chunks[i]);
    }
    DataProto by_value = unwrap(DataProto::concat(values));
    DataProto by_ref = unwrap(DataProto::concat(refs));
    EXPECT_TRUE(by_ref.batch().find("x")->equal(*by_value.batch().find("x")));
    EXPECT_EQ(uids(by_ref), uids(by_value));
    EXPECT_EQ(by_ref.meta_info(), by_value.meta_info());
    EXPECT_EQ(shares_storage(*by_ref.batch().find("x"), *d.batch().find("x")), order[0] == 0);
  }
}

// Inputs holding the same keys inserted in another order are joined key by key, and the
// output keeps input 0's order.
TEST(DataProtoConcat, KeysInAnotherOrderAreMatchedByName) {
  DataProto a = make_proto(2);
  DataProto b = make_proto(3);
  TensorDict reversed_batch;
  for (auto it = b.batch().end(); it != b.batch().begin();) {
    --it;
    reversed_batch.insert_or_assign(it->first, it->second);
  }
  NonTensorBatch reversed_columns;
  for (auto it = b.non_tensor_batch().end(); it != b.non_tensor_batch().begin();) {
    --it;
    reversed_columns.insert_or_assign(it->first, it->second);
  }
  DataProto c = unwrap(DataProto::from_dict(reversed_batch, reversed_columns, b.meta_info()));
  ASSERT_NE(c.batch().keys(), a.batch().keys());
  ASSERT_NE(c.non_tensor_batch().keys(), a.non_tensor_batch().keys());
  DataProto joined = unwrap(DataProto::concat({a, c}));
  EXPECT_EQ(joined.batch().keys(), a.batch().keys());
  EXPECT_EQ(joined.non_tensor_batch().keys(), a.non_tensor_batch().keys());
  DataProto expected = unwrap(DataProto::concat({a, b}));
  for (const auto& [key, t] : expected.batch()) EXPECT_TRUE(joined.batch().find(key)->equal(t)) << key;
  EXPECT_EQ(uids(joined), expected_uids({0, 1, 0, 1, 2}));
  EXPECT_EQ(joined.non_tensor_batch().find("score")->size(), 5);
}

TEST(DataProtoConcat, NonAdjacentInputsAreCopied) {
  DataProto d = make_proto(6);
  auto chunks = unwrap(d.chunk(3));
  DataProto joined = unwrap(DataProto::concat({chunks[2], chunks[0], chunks[1]}));
  const at::Tensor& x = *d.batch().find("x");
  at::Tensor expected = torch::cat({x.slice(0, 4, 6), x.slice(0, 0, 4)});
  EXPECT_TRUE(joined.batch().find("x")->equal(expected));
  EXPECT_FALSE(shares_storage(*joined.batch().find("x"), x));
  EXPECT_EQ(uids(joined), expected_uids({4, 5, 0, 1, 2, 3}));
  // Two unrelated DataProtos.
  DataProto both = unwrap(DataProto::concat({make_proto(2), make_proto(3)}));
  EXPECT_EQ(uids(both), expected_uids({0, 1, 0, 1, 2}));
  EXPECT_TRUE(both.batch().find("ids")->equal(torch::tensor({100, 101, 100, 101, 102}, torch::kLong)));
}

// The O(1) re-join takes the pieces' own layout as it is: strided pieces re-join as the strided
// view they came from; a gap, a reordering, another storage holding the next bytes, or other
// strides are copied instead.
TEST(DataProtoConcat, ReJoinsOnlyPiecesThatContinueOneAnother) {
  const at::Tensor x = torch::arange(24, torch::kFloat).reshape({8, 3});
  auto proto_of = [](at::Tensor t) { return unwrap(DataProto::from_dict({{"x", std::move(t)}})); };
  // Every other row, in two pieces: one view with the doubled row stride.
  DataProto strided = unwrap(DataProto::concat({proto_of(x.slice(0, 0, 4, 2)), proto_of(x.slice(0, 4, 8, 2))}));
  const at::Tensor& s = *strided.batch().find("x");
  EXPECT_TRUE(shares_storage(s, x));
  EXPECT_EQ(s.stride(0), 2 * x.stride(0));
  EXPECT_TRUE(s.equal(x.slice(0, 0, 8, 2)));
  // A gap between the pieces (rows 0-1 and 3-4).
  DataProto gap = unwrap(DataProto::concat({proto_of(x.slice(0, 0, 2)), proto_of(x.slice(0, 3, 5))}));
  EXPECT_FALSE(shares_storage(*gap.batch().find("x"), x));
  EXPECT_TRUE(gap.batch().find("x")->equal(torch::cat({x.slice(0, 0, 2), x.slice(0, 3, 5)})));
  // The next rows' bytes, but in another storage (a tensor over the same memory).
  at::Tensor alias = torch::from_blob(x[4].data_ptr(), {4, 3}, torch::kFloat);
  DataProto foreign = unwrap(DataProto::concat({proto_of(x.slice(0, 0, 4)), proto_of(alias)}));
  EXPECT_FALSE(shares_storage(*foreign.batch().find("x"), x));
  EXPECT_TRUE(foreign.batch().find("x")->equal(x));
  // Same storage, the second piece starting where the first ends, but with other strides.
  at::Tensor square = torch::arange(16, torch::kFloat).reshape({4, 4});
  at::Tensor other = square.as_strided({2, 4}, {1, 2}, 8);
  DataProto mixed = unwrap(DataProto::concat({proto_of(square.slice(0, 0, 2)), proto_of(other)}));
  EXPECT_FALSE(shares_storage(*mixed.batch().find("x"), square));
  EXPECT_TRUE(mixed.batch().find("x")->equal(torch::cat({square.slice(0, 0, 2), other})));
}

TEST(DataProtoConcat, Errors) {
  expect_error(DataProto::concat(std::vector<DataProto>{}), ErrorCode::invalid_argument, "no DataProto");
  expect_error(DataProto::concat(std::vector<const DataProto*>{}), ErrorCode::invalid_argument,
               "no DataProto");
  DataProto a = make_proto(2);
  DataProto b = make_proto(2);
  ASSERT_TRUE(b.pop(std::vector<std::string>{"ids"}).ok());
  expect_error(DataProto::concat({a, b}), ErrorCode::invalid_argument, "batch key 'ids' is missing from input 1");
  expect_error(DataProto::concat({b, a}), ErrorCode::invalid_argument, "'ids' of input 1 is missing from input 0");
  DataProto c = make_proto(2);
  ASSERT_OK(c.set_column("uid", Column::int64s({1, 2})));
  expect_error(DataProto::concat({a, c}), ErrorCode::invalid_argument, "non_tensor_batch key 'uid'");
  DataProto e = make_proto(2);
  ASSERT_OK(e.set_tensor("x", torch::zeros({2, 4})));
  expect_error(DataProto::concat({a, e}), ErrorCode::invalid_argument, "batch key 'x'");
}

TEST(DataProtoConcat, MetricsFromEveryInputAreKept) {
  std::vector<DataProto> ranks;
  for (int r = 0; r < 3; ++r) {
    DataProto d = make_proto(2);
    d.meta_info()["metrics"] = json{{"actor/pg_loss", 0.5 * r}, {"actor/lr", 1e-3}};
    ranks.push_back(d);
  }
  ranks[2].meta_info()["metrics"]["actor/entropy"] = json::array({1, 2});  // a list is flattened
  DataProto joined = unwrap(DataProto::concat(ranks));
  const json& m = joined.meta_info()["metrics"];
  EXPECT_EQ(m["actor/pg_loss"], json::array({0.0, 0.5, 1.0}));
  EXPECT_EQ(m["actor/lr"], json::array({1e-3, 1e-3, 1e-3}));
  EXPECT_EQ(m["actor/entropy"], json::array({1, 2}));
  EXPECT_EQ(joined.meta_info()["temperature"], 0.7);
  // Associative: concat(concat(a, b), c) == concat(a, b, c).
  DataProto ab = unwrap(DataProto::concat({ranks[0], ranks[1]}));
  DataProto abc = unwrap(DataProto::concat({ab, ranks[2]}));
  EXPECT_EQ(abc.meta_info()["metrics"], m);
  // A list of metric objects contributes each of them.
  DataProto listed = make_proto(1);
  listed.meta_info()["metrics"] = json::array({json{{"k", 1}}, json{{"k", 2}}});
  EXPECT_EQ(unwrap(DataProto::concat({listed})).meta_info()["metrics"]["k"], json::array({1, 2}));
}

TEST(DataProtoConcat, OtherMetaKeysMustAgree) {
  DataProto a = make_proto(1);
  DataProto b = make_proto(1);
  DataProto c = make_proto(1);
  c.meta_info()["temperature"] = 1.0;
  b.meta_info()["only_b"] = true;
  expect_error(DataProto::concat({a, b, c}), ErrorCode::invalid_argument,
               "meta_info key 'temperature' differs between input 0 and input 2");
  DataProto ok = unwrap(DataProto::concat({a, b}));
  EXPECT_EQ(ok.meta_info()["only_b"], true);
  DataProto bad = make_proto(1);
  bad.meta_info()["metrics"] = 3;
  expect_error(DataProto::concat({a, bad}), ErrorCode::invalid_argument, "metrics");
}

// Note [Empty meta_info]: an empty meta_info is stored as null internally, which no reader sees:
// it reads as `{}`, a write makes it an object, and copies and views stay independent.
TEST(DataProtoMeta, EmptyMetaInfoReadsAsAnObject) {
  const DataProto none;
  EXPECT_TRUE(none.meta_info().is_object());
  EXPECT_TRUE(none.meta_info().empty());
  EXPECT_EQ(none.meta_info().dump(), "{}");
  DataProto d = unwrap(DataProto::from_dict({{"x", torch::arange(8, torch::kFloat)}}));
  EXPECT_TRUE(std::as_const(d).meta_info().is_object());
  auto chunks = unwrap(d.chunk(4));
  for (const DataProto& c : chunks) EXPECT_EQ(c.meta_info(), json::object());
  EXPECT_TRUE(unwrap(DataProto::concat(chunks)).meta_info().is_object());
  EXPECT_TRUE(d.check_consistency().ok());
  // Writing into one chunk's meta_info touches neither its siblings nor the source.
  chunks[1].meta_info()["temperature"] = 0.5;
  EXPECT_EQ(chunks[1].meta_info(), (json{{"temperature", 0.5}}));
  EXPECT_EQ(chunks[0].meta_info(), json::object());
  EXPECT_EQ(std::as_const(d).meta_info(), json::object());
  DataProto copy = d;
  copy.meta_info()["eos"] = 2;
  EXPECT_EQ(std::as_const(d).meta_info(), json::object());
  // The mutable accessor hands out an object even before anything is written.
  DataProto fresh;
  EXPECT_TRUE(fresh.meta_info().is_object());
  // An emptied meta_info is still an object; select with no meta keys gives `{}`.
  DataProto p = make_proto(2);
  (void)unwrap(p.pop(std::nullopt, std::nullopt, std::vector<std::string>{"temperature"}));
  EXPECT_TRUE(p.meta_info().is_object());
  EXPECT_TRUE(p.meta_info().empty());
  EXPECT_EQ(unwrap(p.select(std::nullopt, std::nullopt, std::vector<std::string>{})).meta_info(),
            json::object());
  // An item of a DataProto with no meta_info carries `{}` too.
  EXPECT_EQ(unwrap(d.index(int64_t{0})).meta_info, json::object());
}

}  // namespace
}  // namespace tessera::proto
