// WorkerGroup on the embedded runtime (4 CPU "devices" in this process): every dispatch mode
// with and without padding, RANK_ZERO, n-d dispatch, colocated roles, futures between groups.
// Expected outputs are derived from the inputs by the rules of verl's modes (§1.1), row by row.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "dispatch/worker_group.hpp"
#include "runtime/runtime.hpp"
#include "tests/dispatch/test_util.hpp"
#include "tests/dispatch/worker_group_test_workers.hpp"

namespace tessera::dispatch {
namespace {

using namespace testing;  // NOLINT: the dispatch test helpers (test_util.hpp, worker_group_test_workers.hpp)

class WorkerGroupTest : public testing::DpGroupSuite<WorkerGroupTest> {
 protected:
  static void SetUpTestSuite() {
    runtime::RuntimeConfig cfg;
    cfg.embedded_devices = "cpu:4";
    start_suite(cfg);
  }
  static void TearDownTestSuite() { stop_suite(); }
};

TEST_F(WorkerGroupTest, DpComputeProtoChunksAndConcatenates) {
  auto out = wg().call("tag", {Value(rows(8))});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(ids(out->proto()), iota(8));
  EXPECT_EQ(rank_column(out->proto()), (std::vector<int64_t>{0, 0, 1, 1, 2, 2, 3, 3}));
  EXPECT_TRUE(torch::equal(*out->proto().tensor("y"), *rows(8).tensor("y") * 2));
}

// In process, every rank's chunk is a view of the caller's tensors, cut by the caller or by the
// rank itself (Note [Chunks cut by the receiver]); both give the same call, and the ranks'
// untouched views re-join into one view of the caller's tensors in the collect.
TEST_F(WorkerGroupTest, InProcessRanksGetViewsOfTheCallersTensorsWhoeverCutsThem) {
  proto::DataProto in = rows(8);
  in.meta_info()["temperature"] = 0.25;
  std::vector<Value> outputs;
  for (bool receivers : {true, false}) {
    SCOPED_TRACE(receivers ? "cut by the ranks" : "cut by the caller");
    WorkerGroupOptions options;
    options.cut_rows_on_receivers = receivers;
    auto group = WorkerGroup::spawn(*rt_, receivers ? "dp_cut" : "dp_split", *rt_->resource_pool(),
                                    {{"", "dp_worker", "{}"}}, options);
    ASSERT_TRUE(group.ok()) << group.status().to_string();
    auto out = (*group)->call("tag", {Value(in), Value(rows(4))});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_EQ(out->proto().tensor("x")->data_ptr(), in.tensor("x")->data_ptr());
    EXPECT_EQ(ids(out->proto()), iota(8));
    EXPECT_EQ(rank_column(out->proto()), (std::vector<int64_t>{0, 0, 1, 1, 2, 2, 3, 3}));
    EXPECT_TRUE(torch::equal(*out->proto().tensor("y"), *in.tensor("y") * 2));
    EXPECT_EQ(out->proto().meta_info().value("temperature", 0.0), 0.25);
    // With padding, the padded rows are stripped and the real ones come back in order.
    auto padded = (*group)->call("tag", {Value(rows(6, /*auto_padding=*/true))});
    ASSERT_TRUE(padded.ok()) << padded.status().to_string();
    EXPECT_EQ(ids(padded->proto()), iota(6));
    EXPECT_EQ(rank_column(padded->proto()), owners(6, 4));
    // A length the world does not divide, unpadded: the split's error either way.
    auto uneven = (*group)->call("tag", {Value(rows(10))});
    ASSERT_FALSE(uneven.ok());
    EXPECT_NE(uneven.status().message().find("DP_COMPUTE_PROTO: argument 0"), std::string::npos)
        << uneven.status().to_string();
  }
}

// Note [Replies joined in place]: in process, the ranks' outputs are concatenated where they lie;
// a rank that returns something else than a DataProto still gets the collect's own error.
TEST_F(WorkerGroupTest, DpComputeProtoNamesTheRankThatReturnedNoDataProto) {
  auto out = wg().call("tag_but_rank_1", {Value(rows(8))});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), ErrorCode::invalid_argument);
  EXPECT_NE(out.status().message().find("DP_COMPUTE_PROTO: rank 1 returned json, expected a DataProto"),
            std::string::npos)
      << out.status().to_string();
  auto fine = wg().call("tag", {Value(rows(8))});
  ASSERT_TRUE(fine.ok()) << fine.status().to_string();
  EXPECT_EQ(rank_column(fine->proto()), (std::vector<int64_t>{0, 0, 1, 1, 2, 2, 3, 3}));
}

TEST_F(WorkerGroupTest, DpComputeProtoPadsAndUnpads) {
  auto out = wg().call("tag", {Value(rows(10, /*auto_padding=*/true))});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(ids(out->proto()), iota(10));
  EXPECT_EQ(rank_column(out->proto()), owners(10, 4));
  auto unpadded = wg().call("tag", {Value(rows(10))});
  ASSERT_FALSE(unpadded.ok());
  EXPECT_NE(unpadded.status().message().find("dp.tag"), std::string::npos);
}

TEST_F(WorkerGroupTest, OneToAllAndAllToAll) {
  auto out = wg().call("info", {Value(rows(6)), Value(nlohmann::json(7))});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(out->list().size(), 4u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(out->list()[r].json()["rank"], r);
    EXPECT_EQ(out->list()[r].json()["rows"], 6);
    EXPECT_EQ(out->list()[r].json()["nargs"], 2);
  }
  auto all = wg().call("info_all", {Value(nlohmann::json::array({"a", "b", "c", "d"}))});
  ASSERT_TRUE(all.ok()) << all.status().to_string();
  EXPECT_EQ(all->list()[2].json()["arg"], "c");  // every arg a length-N list: scattered
  auto same = wg().call("info_all", {Value(nlohmann::json("x"))});
  EXPECT_EQ(same->list()[3].json()["arg"], "x");
}

TEST_F(WorkerGroupTest, DpComputeGivesRankIElementI) {
  auto out = wg().call("scale", {Value(nlohmann::json::array({1, 2, 3, 4}))});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  std::vector<int64_t> got;
  for (const Value& v : out->list()) got.push_back(v.json());
  EXPECT_EQ(got, (std::vector<int64_t>{10, 21, 32, 43}));
  EXPECT_FALSE(wg().call("scale", {Value(nlohmann::json::array({1, 2}))}).ok());
}

TEST_F(WorkerGroupTest, DpComputeProtoWithFuncReplicatesTheName) {
  auto out = wg().call("with_func", {Value(nlohmann::json("negate")), Value(rows(8))});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(torch::equal(*out->proto().tensor("y"), -*rows(8).tensor("y")));
}

TEST_F(WorkerGroupTest, DpComputeMetricKeepsEveryRanksOutput) {
  for (int64_t n : {8, 10}) {
    auto out = wg().call("metric", {Value(rows(n, true))});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    ASSERT_EQ(out->list().size(), 4u);
    int64_t per = n == 8 ? 2 : 3;
    for (int r = 0; r < 4; ++r) EXPECT_EQ(out->list()[r].json()["rows"], per);
  }
}

TEST_F(WorkerGroupTest, RankZeroRunsOnlyRankZero) {
  auto out = wg().call("leader", {});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(out->json()["rank"], 0);
}

TEST_F(WorkerGroupTest, NdDispatchSendsTpPeersTheSameChunkAndCollectsLeaders) {
  auto out = wg().call("nd_tag", {Value(rows(8))});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(ids(out->proto()), iota(8));
  EXPECT_EQ(rank_column(out->proto()), (std::vector<int64_t>{0, 0, 0, 0, 2, 2, 2, 2}));
}

TEST_F(WorkerGroupTest, AFutureFeedsAnotherGroupChunkByChunk) {
  auto pool2 = rt_->resource_pool({2});
  auto consumer = WorkerGroup::spawn(*rt_, "consumer", *pool2, {{"", "dp_worker", "{}"}});
  ASSERT_TRUE(consumer.ok()) << consumer.status().to_string();
  auto fut = wg().call("tag_async", {Value(rows(10, true))});  // non-blocking by its spec
  ASSERT_TRUE(fut.ok()) << fut.status().to_string();
  ASSERT_TRUE(is_future(*fut));
  auto out = (*consumer)->call("tag", {*fut});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(ids(out->proto()), iota(10));
  EXPECT_EQ(rank_column(out->proto()), owners(10, 2));
  EXPECT_TRUE(torch::equal(*out->proto().tensor("y"), *rows(10).tensor("y") * 4));
  auto again = (*consumer)->call("tag", {*fut});
  EXPECT_EQ(again.status().code(), ErrorCode::not_found);  // single-use
  EXPECT_EQ(rt_->data_plane().stats().payloads, 0u);       // every payload was released
}

TEST_F(WorkerGroupTest, AFutureWithPaddingForTheConsumer) {
  auto fut = wg().call_async("tag", {Value(rows(8))});  // a future only fetched at the end
  ASSERT_TRUE(fut.ok());
  auto pool3 = rt_->resource_pool({3});
  WorkerGroupOptions padding;
  padding.auto_padding = true;
  auto consumer = WorkerGroup::spawn(*rt_, "c3", *pool3, {{"", "dp_worker", "{}"}}, padding);
  ASSERT_TRUE(consumer.ok());
  auto fut4 = wg().call_async("tag", {Value(rows(7, true))});
  auto out = (*consumer)->call("tag", {make_future(*fut4)});  // 7 rows over 3: padded to 9
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(ids(out->proto()), iota(7));
  EXPECT_EQ(rank_column(out->proto()), owners(7, 3));
  auto got = WorkerGroup::get(*fut);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(ids(got->proto()), iota(8));
  EXPECT_EQ(WorkerGroup::release(*fut).code(), ErrorCode::not_found);
}

TEST_F(WorkerGroupTest, ColocatedRolesGetTheirOwnViews) {
  auto fused = WorkerGroup::spawn(*rt_, "fused", *rt_->resource_pool(),
                                  {{"actor", "dp_worker", "{}"}, {"critic", "dp_worker", "{}"}});
  ASSERT_TRUE(fused.ok()) << fused.status().to_string();
  auto actor = (*fused)->role("actor");
  auto critic = (*fused)->role("critic");
  ASSERT_TRUE(actor.ok() && critic.ok());
  auto a = (*actor)->call("tag", {Value(rows(4))});
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_EQ(rank_column(a->proto()), (std::vector<int64_t>{0, 1, 2, 3}));
  auto c = (*critic)->call("nd_tag", {Value(rows(4))});
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ((*fused)->workers()[1].actor, (*actor)->workers()[1].actor);
  EXPECT_FALSE((*fused)->role("reward").ok());
}

TEST_F(WorkerGroupTest, UnknownMethodsListTheKnownOnes) {
  auto out = wg().call("nope", {});
  EXPECT_EQ(out.status().code(), ErrorCode::not_found);
  EXPECT_NE(out.status().message().find("tag_async"), std::string::npos);
}

}  // namespace
}  // namespace tessera::dispatch
