// WorkerGroup across processes: this driver plus two agent processes (this binary re-executed
// with --tessera-agent) on 127.0.0.1, two CPU devices each (world size 4).
#include <gtest/gtest.h>
#include <signal.h>

#include <torch/torch.h>

#include "dispatch/worker_group.hpp"
#include "runtime/runtime.hpp"
#include "tests/dispatch/test_util.hpp"
#include "tests/dispatch/worker_group_test_workers.hpp"
#include "tests/runtime/agent_process.hpp"

namespace tessera::dispatch {
namespace {

using runtime::testing::AgentProcess;
using namespace testing;  // NOLINT: the dispatch test helpers (test_util.hpp, worker_group_test_workers.hpp)

const char* kToken = "worker-group-integration-token-42";

// n rows like testing::rows plus a wide float tensor, so payloads leave the inline path.
proto::DataProto wide_rows(int64_t n, bool auto_padding) {
  proto::DataProto d = rows(n, auto_padding);
  (void)d.set_tensor("wide", torch::arange(n * 8192, torch::kFloat32).view({n, 8192}));
  return d;
}

class WorkerGroupCluster : public testing::DpGroupSuite<WorkerGroupCluster> {
 protected:
  static void SetUpTestSuite() {
    std::string tf = runtime::testing::write_token_file("wg_token", kToken);
    for (auto*& a : agents_) {
      auto started = AgentProcess::start({"--devices", "cpu:2", "--token-file", tf});
      ASSERT_TRUE(started.ok()) << started.status().to_string();
      a = new AgentProcess(std::move(started).value());
    }
    runtime::RuntimeConfig cfg;
    cfg.agents = {agents_[0]->address(), agents_[1]->address()};
    cfg.token = kToken;
    start_suite(cfg);
  }
  static void TearDownTestSuite() {
    stop_suite();
    for (auto*& a : agents_) {
      if (a != nullptr) a->signal(SIGTERM);
      if (a != nullptr) {
        EXPECT_TRUE(a->wait(std::chrono::seconds(10)).ok());
      }
      delete a;
      a = nullptr;
    }
  }
  static AgentProcess* agents_[2];
};
AgentProcess* WorkerGroupCluster::agents_[2] = {nullptr, nullptr};

TEST_F(WorkerGroupCluster, DpComputeProtoWithAndWithoutPadding) {
  for (bool wide : {false, true}) {
    for (int64_t n : {8, 10}) {
      proto::DataProto in = wide ? wide_rows(n, n == 10) : rows(n, n == 10);
      auto out = wg().call("tag", {Value(in)});
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      EXPECT_EQ(ids(out->proto()), iota(n));
      EXPECT_EQ(rank_column(out->proto()), owners(n, 4));
      EXPECT_TRUE(torch::equal(*out->proto().tensor("y"), *in.tensor("y") * 2));
      if (wide) {
        EXPECT_TRUE(torch::equal(*out->proto().tensor("wide"), *in.tensor("wide")));
      }
    }
  }
  EXPECT_FALSE(wg().call("tag", {Value(rows(10))}).ok());  // 10 rows, 4 ranks, no padding
}

TEST_F(WorkerGroupCluster, TheOtherModes) {
  auto info = wg().call("info", {Value(rows(6))});
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->list()[3].json()["rows"], 6);
  auto scale = wg().call("scale", {Value(nlohmann::json::array({1, 2, 3, 4}))});
  ASSERT_TRUE(scale.ok());
  EXPECT_EQ(scale->list()[3].json(), 43);
  auto func = wg().call("with_func", {Value(nlohmann::json("double")), Value(wide_rows(8, false))});
  ASSERT_TRUE(func.ok()) << func.status().to_string();
  EXPECT_TRUE(torch::equal(*func->proto().tensor("y"), *rows(8).tensor("y") * 2));
  auto metric = wg().call("metric", {Value(rows(10, true))});
  ASSERT_TRUE(metric.ok());
  EXPECT_EQ(metric->list()[3].json()["rows"], 3);
  auto leader = wg().call("leader", {});
  ASSERT_TRUE(leader.ok());
  EXPECT_EQ(leader->json()["rank"], 0);
  auto nd = wg().call("nd_tag", {Value(wide_rows(8, false))});
  ASSERT_TRUE(nd.ok()) << nd.status().to_string();
  EXPECT_EQ(rank_column(nd->proto()), (std::vector<int64_t>{0, 0, 0, 0, 2, 2, 2, 2}));
}

TEST_F(WorkerGroupCluster, AFuturesBytesMovePeerToPeerNotThroughTheDriver) {
  auto pool = rt_->resource_pool({1, 1});
  auto consumer = WorkerGroup::spawn(*rt_, "consumer", *pool, {{"", "dp_worker", "{}"}});
  ASSERT_TRUE(consumer.ok()) << consumer.status().to_string();
  auto fut = wg().call("tag_async", {Value(wide_rows(10, true))});
  ASSERT_TRUE(fut.ok()) << fut.status().to_string();
  ASSERT_TRUE(WorkerGroup::wait(*future_of(*fut)).ok());  // producers pulled their inputs
  auto before = rt_->data_plane().stats();
  auto metric = (*consumer)->call("metric", {*fut});  // JSON answers: only control bytes return
  ASSERT_TRUE(metric.ok()) << metric.status().to_string();
  auto after = rt_->data_plane().stats();
  EXPECT_EQ(after.served_tcp_bytes + after.served_shm_bytes,
            before.served_tcp_bytes + before.served_shm_bytes);
  EXPECT_EQ(after.fetched_remote_bytes, before.fetched_remote_bytes);
  EXPECT_EQ(metric->list()[0].json()["rows"], 5);
  EXPECT_EQ(metric->list()[1].json()["rows"], 5);
  // A DataProto result from a future: the right rows, in order, each processed twice.
  auto fut2 = wg().call("tag_async", {Value(wide_rows(10, true))});
  auto out = (*consumer)->call("tag", {*fut2});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(ids(out->proto()), iota(10));
  EXPECT_EQ(rank_column(out->proto()), owners(10, 2));
  EXPECT_TRUE(torch::equal(*out->proto().tensor("y"), *rows(10).tensor("y") * 4));
  EXPECT_TRUE(torch::equal(*out->proto().tensor("wide"), *wide_rows(10, true).tensor("wide")));
  EXPECT_EQ(rt_->data_plane().stats().payloads, 0u);
}

TEST_F(WorkerGroupCluster, ColocatedRolesAcrossAgents) {
  auto fused = WorkerGroup::spawn(*rt_, "fused", *rt_->resource_pool(),
                                  {{"actor", "dp_worker", "{}"}, {"critic", "dp_worker", "{}"}});
  ASSERT_TRUE(fused.ok()) << fused.status().to_string();
  auto out = (*(*fused)->role("critic"))->call("tag", {Value(rows(8))});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(rank_column(out->proto()), owners(8, 4));
}

}  // namespace
}  // namespace tessera::dispatch

int main(int argc, char** argv) {
  int agent = tessera::runtime::testing::agent_test_main(argc, argv,
                                                         tessera::dispatch::testing::dp_registry());
  if (agent >= 0) return agent;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
