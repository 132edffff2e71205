// Tests of the Dispatch / Execute modes (dispatch/modes.hpp), with and without auto-padding.
// Expected rows are computed independently from row ids, not with the functions under test.
#include <gtest/gtest.h>

#include "dispatch/internal/concat_collect.hpp"
#include "dispatch/internal/row_plan.hpp"
#include "dispatch/modes.hpp"
#include "tests/dispatch/test_util.hpp"

namespace tessera::dispatch {
namespace {

using testing::ids;
using testing::rows;

SplitContext ctx(int32_t world, bool auto_padding = false) {
  SplitContext c;
  c.world_size = world;
  c.auto_padding = auto_padding;
  return c;
}

Result<SplitResult> split(const std::string& mode, const Args& args, const SplitContext& c) {
  return split_args(DispatchRegistry::global(), mode, args, c);
}

Result<Value> collect(const std::string& mode, const ValueList& outs, int32_t world, int64_t pad = 0) {
  CollectContext c;
  c.world_size = world;
  c.pad = pad;
  return collect_outputs(DispatchRegistry::global(), mode, ExecuteMode::all, outs, c);
}

std::vector<int64_t> range(int64_t b, int64_t e) {
  std::vector<int64_t> v;
  for (int64_t i = b; i < e; ++i) v.push_back(i);
  return v;
}

TEST(ExecuteMode, RanksAndParsing) {
  EXPECT_EQ(execute_ranks(ExecuteMode::all, 3), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(execute_ranks(ExecuteMode::rank_zero, 3), (std::vector<int32_t>{0}));
  EXPECT_EQ(*parse_execute_mode("rank_zero"), ExecuteMode::rank_zero);
  EXPECT_EQ(*parse_execute_mode("ALL"), ExecuteMode::all);
  auto bad = parse_execute_mode("SOME");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("SOME"), std::string::npos);
}

TEST(PadSize, MatchesVerlFormula) {
  for (int64_t n = 1; n <= 5; ++n)
    for (int64_t L = 0; L <= 12; ++L) EXPECT_EQ((L + pad_size_for(L, n)) % n, 0) << L << " " << n;
  EXPECT_EQ(pad_size_for(10, 4), 2);
  EXPECT_EQ(pad_size_for(8, 4), 0);
}

TEST(OneToAll, ReplicatesEveryArgAndCollectsAList) {
  Args args{Value(nlohmann::json{{"lr", 0.1}}), Value(rows(4))};
  auto s = split(Dispatch::ONE_TO_ALL, args, ctx(3));
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  ASSERT_EQ(s->per_rank.size(), 3u);
  for (const auto& a : s->per_rank) {
    ASSERT_EQ(a.size(), 2u);
    EXPECT_EQ(a[0].json()["lr"], 0.1);
    EXPECT_EQ(ids(a[1].proto()), range(0, 4));
  }
  auto c = collect(Dispatch::ONE_TO_ALL, {Value(1), Value(2), Value(3)}, 3);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c->is_list());
  EXPECT_EQ(c->list()[2].json(), 3);
}

TEST(AllToAll, PassesArgsOrScattersWhenEveryArgIsAList) {
  auto same = split(Dispatch::ALL_TO_ALL, {Value(7), Value(nlohmann::json::array({1, 2}))}, ctx(2));
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->per_rank[1][0].json(), 7);
  EXPECT_EQ(same->per_rank[1][1].json(), nlohmann::json::array({1, 2}));
  auto scattered = split(Dispatch::ALL_TO_ALL, {Value(nlohmann::json::array({1, 2})), Value(ValueList{Value("a"), Value("b")})}, ctx(2));
  ASSERT_TRUE(scattered.ok());
  EXPECT_EQ(scattered->per_rank[1][0].json(), 2);
  EXPECT_EQ(scattered->per_rank[1][1].json(), "b");
}

TEST(DpCompute, GivesElementIToRankIAndRejectsWrongLengths) {
  auto s = split(Dispatch::DP_COMPUTE, {Value(nlohmann::json::array({10, 11, 12}))}, ctx(3));
  ASSERT_TRUE(s.ok());
  for (int r = 0; r < 3; ++r) EXPECT_EQ(s->per_rank[r][0].json(), 10 + r);
  auto bad = split(Dispatch::DP_COMPUTE, {Value(nlohmann::json::array({1, 2}))}, ctx(3));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("argument 0"), std::string::npos) << bad.status().to_string();
  auto scalar = split(Dispatch::DP_COMPUTE, {Value(5)}, ctx(2));
  EXPECT_FALSE(scalar.ok());
  EXPECT_FALSE(collect(Dispatch::DP_COMPUTE, {Value(1)}, 2).ok());
}

TEST(DpComputeProto, ChunksAreViewsAndCollectConcats) {
  proto::DataProto data = rows(8);
  auto s = split(Dispatch::DP_COMPUTE_PROTO, {Value(data)}, ctx(4));
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->pad, 0);
  ValueList outs;
  const auto* base = data.tensor("x")->data_ptr<int64_t>();
  for (int r = 0; r < 4; ++r) {
    const auto& piece = s->per_rank[r][0].proto();
    EXPECT_EQ(ids(piece), range(2 * r, 2 * r + 2));
    EXPECT_EQ(piece.tensor("x")->data_ptr<int64_t>(), base + 2 * r * 2) << "chunk must be a view";
    outs.push_back(piece);
  }
  auto c = collect(Dispatch::DP_COMPUTE_PROTO, outs, 4, s->pad);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(ids(c->proto()), range(0, 8));
  EXPECT_EQ(c->proto().column("uid")->str(7), "row7");
}

TEST(DpComputeProto, WithoutPaddingANonDivisibleLengthIsAnError) {
  auto s = split(Dispatch::DP_COMPUTE_PROTO, {Value(rows(10))}, ctx(4));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("DP_COMPUTE_PROTO: argument 0"), std::string::npos) << s.status().to_string();
}

TEST(DpComputeProto, AutoPaddingCopiesLastRowAndUnpadsOutput) {
  proto::DataProto data = rows(10, /*auto_padding=*/true);
  auto s = split(Dispatch::DP_COMPUTE_PROTO, {Value(data)}, ctx(4));
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->pad, 2);
  EXPECT_EQ(data.size(), 10) << "the caller's DataProto must not be padded in place";
  std::vector<int64_t> seen;
  ValueList outs;
  for (int r = 0; r < 4; ++r) {
    auto piece = ids(s->per_rank[r][0].proto());
    EXPECT_EQ(piece.size(), 3u);
    seen.insert(seen.end(), piece.begin(), piece.end());
    outs.push_back(s->per_rank[r][0]);
  }
  std::vector<int64_t> expected = range(0, 10);
  expected.push_back(9);
  expected.push_back(9);
  EXPECT_EQ(seen, expected);
  auto c = collect(Dispatch::DP_COMPUTE_PROTO, outs, 4, s->pad);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(ids(c->proto()), range(0, 10));
}

TEST(DpComputeProto, GlobalAutoPaddingSwitchAndEqualLengthRule) {
  auto s = split(Dispatch::DP_COMPUTE_PROTO, {Value(rows(5)), Value(rows(5))}, ctx(2, /*auto_padding=*/true));
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->pad, 1);
  auto bad = split(Dispatch::DP_COMPUTE_PROTO, {Value(rows(5)), Value(rows(7))}, ctx(2, true));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("equal lengths"), std::string::npos);
}

TEST(DpComputeProto, RejectsNonDataArgsAndNonDataOutputs) {
  auto s = split(Dispatch::DP_COMPUTE_PROTO, {Value(3)}, ctx(2));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("must be a DataProto"), std::string::npos);
  auto c = collect(Dispatch::DP_COMPUTE_PROTO, {Value(rows(2)), Value(1)}, 2);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("rank 1"), std::string::npos);
}

TEST(DpComputeProto, FutureArgsGetTheirConsumerCoordinates) {
  FutureRef f;
  f.id = 42;
  f.producer = "actor";
  auto s = split(Dispatch::DP_COMPUTE_PROTO, {make_future(f)}, ctx(3, /*auto_padding=*/true));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->pad, -1) << "pad of a future is unknown until its length is";
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(is_future(s->per_rank[r][0]));
    const FutureRef g = *future_of(s->per_rank[r][0]);
    EXPECT_EQ(g.id, 42u);
    EXPECT_EQ(g.consumer_rank, r);
    EXPECT_EQ(g.consumer_world, 3);
    EXPECT_TRUE(g.auto_padding);
  }
}

TEST(DpComputeProtoWithFunc, ReplicatesNameChunksDataWithoutPadding) {
  auto s = split(Dispatch::DP_COMPUTE_PROTO_WITH_FUNC, {Value("score_fn"), Value(rows(6, true))}, ctx(3));
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->pad, 0);
  ValueList outs;
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(s->per_rank[r][0].json(), "score_fn");
    EXPECT_EQ(ids(s->per_rank[r][1].proto()), range(2 * r, 2 * r + 2));
    outs.push_back(s->per_rank[r][1]);
  }
  EXPECT_EQ(ids(collect(Dispatch::DP_COMPUTE_PROTO_WITH_FUNC, outs, 3)->proto()), range(0, 6));
  EXPECT_FALSE(split(Dispatch::DP_COMPUTE_PROTO_WITH_FUNC, {Value(rows(7, true))}, ctx(3)).ok());
  EXPECT_FALSE(split(Dispatch::DP_COMPUTE_PROTO_WITH_FUNC, {Value("f"), Value(rows(7))}, ctx(3)).ok())
      << "no auto-padding in WITH_FUNC";
  // With padding enabled in meta_info, verl's chunk falls back to ceil-sized pieces (3, 3, 1)
  // and nothing is padded or stripped.
  auto uneven = split(Dispatch::DP_COMPUTE_PROTO_WITH_FUNC, {Value("f"), Value(rows(7, true))}, ctx(3));
  ASSERT_TRUE(uneven.ok()) << uneven.status().to_string();
  EXPECT_EQ(uneven->pad, 0);
  EXPECT_EQ(ids(uneven->per_rank[2][1].proto()), (std::vector<int64_t>{6}));
}

TEST(DpComputeMetric, SplitsLikeProtoAndReturnsEveryRanksOutput) {
  auto s = split(Dispatch::DP_COMPUTE_METRIC, {Value(rows(3, true))}, ctx(2));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->pad, 1);
  auto c = collect(Dispatch::DP_COMPUTE_METRIC, {Value(nlohmann::json{{"loss", 1.0}}), Value(nlohmann::json{{"loss", 2.0}})}, 2, s->pad);
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(c->list().size(), 2u) << "metrics of the rank that got padding rows are kept";
  EXPECT_EQ(c->list()[1].json()["loss"], 2.0);
}

TEST(NdDispatch, TensorParallelPeersShareAChunkAndOnlyCollectRanksAnswer) {
  SplitContext c = ctx(4);
  c.mesh_info["rollout"] = MeshDispatchInfo{{0, 0, 1, 1}, {true, false, true, false}};
  auto s = split("nd:rollout", {Value(rows(6))}, c);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(ids(s->per_rank[0][0].proto()), range(0, 3));
  EXPECT_EQ(ids(s->per_rank[1][0].proto()), range(0, 3));
  EXPECT_EQ(ids(s->per_rank[2][0].proto()), range(3, 6));
  EXPECT_EQ(ids(s->per_rank[3][0].proto()), range(3, 6));
  CollectContext cc;
  cc.world_size = 4;
  cc.mesh_info = c.mesh_info;
  ValueList outs{s->per_rank[0][0], Value("ignored"), s->per_rank[2][0], Value("ignored")};
  auto out = collect_outputs(DispatchRegistry::global(), "nd:rollout", ExecuteMode::all, outs, cc);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(ids(out->proto()), range(0, 6));
}

TEST(NdDispatch, PadsToDpSizeAndRequiresRegistration) {
  SplitContext c = ctx(4, /*auto_padding=*/true);
  c.mesh_info["actor"] = MeshDispatchInfo{{0, 1, 0, 1}, {true, true, false, false}};
  auto s = split("nd:actor", {Value(rows(3))}, c);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->pad, 1);
  EXPECT_EQ(ids(s->per_rank[1][0].proto()), (std::vector<int64_t>{2, 2}));
  auto missing = split("nd:critic", {Value(rows(4))}, c);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("critic"), std::string::npos);
}

TEST(RankZero, CollectPassesTheSingleOutputThrough) {
  CollectContext cc;
  cc.world_size = 4;
  auto out = collect_outputs(DispatchRegistry::global(), Dispatch::DP_COMPUTE_PROTO, ExecuteMode::rank_zero,
                             {Value(rows(2))}, cc);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(ids(out->proto()), range(0, 2));
  EXPECT_FALSE(collect_outputs(DispatchRegistry::global(), Dispatch::ONE_TO_ALL, ExecuteMode::rank_zero,
                               {Value(1), Value(2)}, cc).ok());
}

TEST(Registry, CustomModesCanBeAddedAndUpdated) {
  DispatchRegistry reg;
  DispatchMode reverse{"REVERSE",
                       [](const Args& a, const SplitContext& c) -> Result<SplitResult> {
                         SplitResult r;
                         for (int i = 0; i < c.world_size; ++i) r.per_rank.push_back(Args{Value(c.world_size - 1 - i)});
                         return r;
                       },
                       [](const ValueList& o, const CollectContext&) -> Result<Value> { return Value(o.back()); }};
  ASSERT_TRUE(reg.register_mode(reverse).ok());
  EXPECT_EQ(reg.register_mode(reverse).code(), ErrorCode::already_exists);
  auto s = split_args(reg, "REVERSE", {}, ctx(3));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->per_rank[0][0].json(), 2);
  auto before = reg.find_shared("REVERSE");  // what a call in flight looked up
  ASSERT_TRUE(before.ok());
  reverse.collect = [](const ValueList& o, const CollectContext&) -> Result<Value> { return Value(o.front()); };
  ASSERT_TRUE(reg.update_mode(reverse).ok());
  CollectContext cc;
  EXPECT_EQ(collect_outputs(reg, "REVERSE", ExecuteMode::all, {Value(1), Value(2)}, cc)->json(), 1);
  EXPECT_EQ((*before)->collect({Value(1), Value(2)}, cc)->json(), 2) << "the mode as looked up";
  EXPECT_EQ((*reg.find_shared("REVERSE"))->collect({Value(1), Value(2)}, cc)->json(), 1);
  EXPECT_EQ((*reg.find_shared("nd:tp"))->name, "nd:tp");
  EXPECT_EQ(reg.find_shared("MISSING").status().code(), ErrorCode::not_found);
  DispatchMode unknown = reverse;
  unknown.name = "NOPE";
  EXPECT_EQ(reg.update_mode(unknown).code(), ErrorCode::not_found);
  auto missing = reg.find("MISSING");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("DP_COMPUTE_PROTO"), std::string::npos) << "lists known modes";
  EXPECT_FALSE(reg.register_mode(DispatchMode{"nd:x", reverse.split, reverse.collect}).ok());
  EXPECT_FALSE(split_args(reg, Dispatch::ONE_TO_ALL, {}, ctx(0)).ok());
}

std::vector<std::string> uids(const proto::DataProto& d) {
  std::vector<std::string> out;
  const proto::Column c = *d.column("uid");
  for (int64_t i = 0; i < c.size(); ++i) out.push_back(c.str(i));
  return out;
}

// Note [Chunks cut by the receiver] (runtime/wire.hpp): where the WorkerGroup may skip the split
// for in-process ranks, rank r's rows of each plan source are exactly the split's piece for r
// (same rows, same storage unless padded, same meta_info and columns), and the pad agrees.
TEST(RowPlan, EachRanksRowsAreTheSplitsPiece) {
  struct Case {
    std::vector<int64_t> lengths;
    bool padding_meta;  // meta_info asks for padding
    bool auto_padding;  // the group's switch
    int32_t world;
  };
  const std::vector<Case> cases = {{{8}, false, false, 4},   {{8, 4}, false, false, 4},
                                   {{10}, true, false, 4},   {{5, 5}, false, true, 2},
                                   {{0}, false, false, 3},   {{7}, false, true, 8},
                                   {{12}, false, false, 1},  {{9, 9}, true, false, 4}};
  for (const Case& c : cases) {
    Args args;
    for (int64_t n : c.lengths) args.push_back(Value(rows(n, c.padding_meta)));
    args.front().proto().meta_info()["temperature"] = 0.5;
    for (const char* mode : {Dispatch::DP_COMPUTE_PROTO, Dispatch::DP_COMPUTE_METRIC}) {
      SCOPED_TRACE(::testing::Message() << mode << " world " << c.world << " first length "
                                        << c.lengths.front());
      auto found = DispatchRegistry::global().find(mode);
      ASSERT_TRUE(found.ok());
      EXPECT_TRUE(internal::splits_rows_per_rank(*found));
      std::optional<internal::RowPlan> plan = internal::plan_rows_per_rank(args, ctx(c.world, c.auto_padding));
      ASSERT_TRUE(plan.has_value());
      auto s = split(mode, args, ctx(c.world, c.auto_padding));
      ASSERT_TRUE(s.ok()) << s.status().to_string();
      EXPECT_EQ(plan->pad, s->pad);
      ASSERT_EQ(plan->sources.size(), args.size());
      for (int32_t r = 0; r < c.world; ++r) {
        for (size_t i = 0; i < args.size(); ++i) {
          const proto::DataProto& piece = s->per_rank[r][i].proto();
          const int64_t k = plan->rows_per_rank[i];
          auto cut = plan->sources[i]->slice(r * k, (r + 1) * k);
          ASSERT_TRUE(cut.ok());
          EXPECT_EQ(ids(*cut), ids(piece)) << "rank " << r << ", argument " << i;
          EXPECT_EQ(uids(*cut), uids(piece));
          EXPECT_EQ(cut->meta_info(), piece.meta_info());
          if (s->pad == 0 && piece.size() > 0) {
            EXPECT_EQ(cut->tensor("y")->data_ptr(), piece.tensor("y")->data_ptr()) << "a view of the argument";
          }
        }
      }
    }
  }
}

// Everything the split answers otherwise keeps the split (its pieces or its error).
TEST(RowPlan, NoPlanWhereTheSplitDoesSomethingElse) {
  using internal::plan_rows_per_rank;
  EXPECT_FALSE(plan_rows_per_rank({Value(rows(10))}, ctx(4)).has_value()) << "not divisible, no padding";
  EXPECT_FALSE(plan_rows_per_rank({Value(rows(5)), Value(rows(7))}, ctx(2, true)).has_value())
      << "unequal padded lengths";
  EXPECT_FALSE(plan_rows_per_rank({Value(rows(4)), Value(3)}, ctx(2)).has_value()) << "not a DataProto";
  EXPECT_FALSE(plan_rows_per_rank({make_future(FutureRef{1, "g"})}, ctx(2)).has_value()) << "a future";
  proto::DataProto grad = rows(4);
  ASSERT_TRUE(grad.set_tensor("w", torch::ones({4}, torch::kFloat32).requires_grad_()).ok());
  EXPECT_FALSE(plan_rows_per_rank({Value(grad)}, ctx(2)).has_value()) << "a tensor requiring grad";
  EXPECT_TRUE(plan_rows_per_rank({}, ctx(2)).has_value()) << "no arguments: nothing to cut";
  for (const char* other : {Dispatch::ONE_TO_ALL, Dispatch::ALL_TO_ALL, Dispatch::DP_COMPUTE,
                            Dispatch::DP_COMPUTE_PROTO_WITH_FUNC}) {
    EXPECT_FALSE(internal::splits_rows_per_rank(*DispatchRegistry::global().find(other))) << other;
  }
  EXPECT_FALSE(internal::splits_rows_per_rank(make_nd_compute_dataproto_dispatch("tp")));
  // DP_COMPUTE_PROTO replaced by update_mode, even by a wrapper of the same split.
  DispatchMode builtin = *DispatchRegistry::global().find(Dispatch::DP_COMPUTE_PROTO);
  DispatchMode wrapped{builtin.name,
                       [inner = builtin.split](const Args& a, const SplitContext& c) { return inner(a, c); },
                       builtin.collect};
  EXPECT_FALSE(internal::splits_rows_per_rank(wrapped));
}

// Note [Replies joined in place]: only the built-in concatenating collects are recognised, with
// the padding each of them strips.
TEST(ConcatCollect, OnlyTheBuiltInConcatenations) {
  CollectContext c;
  c.world_size = 4;
  c.pad = 3;
  auto mode = [](const char* name) { return *DispatchRegistry::global().find(name); };
  EXPECT_EQ(internal::concat_collect_pad(mode(Dispatch::DP_COMPUTE_PROTO), c), std::optional<int64_t>(3));
  EXPECT_EQ(internal::concat_collect_pad(mode(Dispatch::DP_COMPUTE_PROTO_WITH_FUNC), c),
            std::optional<int64_t>(0));
  for (const char* other : {Dispatch::ONE_TO_ALL, Dispatch::ALL_TO_ALL, Dispatch::DP_COMPUTE,
                            Dispatch::DP_COMPUTE_METRIC}) {
    EXPECT_FALSE(internal::concat_collect_pad(mode(other), c).has_value()) << other;
  }
  EXPECT_FALSE(internal::concat_collect_pad(make_nd_compute_dataproto_dispatch("tp"), c).has_value());
  // DP_COMPUTE_PROTO's collect replaced by update_mode, even by a wrapper of the built-in one.
  DispatchMode builtin = mode(Dispatch::DP_COMPUTE_PROTO);
  DispatchMode wrapped{builtin.name, builtin.split,
                       [inner = builtin.collect](const ValueList& v, const CollectContext& x) {
                         return inner(v, x);
                       }};
  EXPECT_FALSE(internal::concat_collect_pad(wrapped, c).has_value());
}

}  // namespace
}  // namespace tessera::dispatch
