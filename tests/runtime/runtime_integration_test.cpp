// Multi-process integration: a real driver (this process) and agent processes on 127.0.0.1.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include <boost/asio.hpp>
#include <torch/torch.h>

#include "runtime/runtime.hpp"
#include "runtime/wire.hpp"
#include "tests/runtime/agent_process.hpp"
#include "tests/runtime/test_workers.hpp"

namespace tessera::runtime {
namespace {

using testing::AgentProcess;
const char* kToken = "integration-test-token-0123456789";

proto::DataProto make_batch(int64_t rows, int64_t width, float offset = 0) {
  auto x = torch::arange(rows * width, torch::kFloat32).view({rows, width}) + offset;
  return *proto::DataProto::from_dict({{"x", x}});
}

RuntimeConfig cluster_config(const std::vector<std::string>& agents, const std::string& token) {
  RuntimeConfig c;
  c.agents = agents;
  c.token = token;
  c.call_timeout = Millis(60000);
  return c;
}

class Cluster : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    token_file_ = new std::string(testing::write_token_file("cluster_token", kToken));
    for (int i = 0; i < 2; ++i) {
      auto a = AgentProcess::start({"--devices", "cpu:2", "--token-file", *token_file_});
      ASSERT_TRUE(a.ok()) << a.status().to_string();
      agents_[i] = new AgentProcess(std::move(a).value());
    }
    auto rt = Runtime::start(cluster_config({agents_[0]->address(), agents_[1]->address()}, kToken),
                             testing::test_registry());
    ASSERT_TRUE(rt.ok()) << rt.status().to_string();
    rt_ = rt->release();
  }
  static void TearDownTestSuite() {
    delete rt_;
    for (auto*& a : agents_) {
      if (a == nullptr) continue;
      a->signal(SIGTERM);
      auto st = a->wait(std::chrono::seconds(10));
      EXPECT_TRUE(st.ok() && WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << "agent did not stop cleanly";
      delete a;
      a = nullptr;
    }
    delete token_file_;
  }

  std::vector<WorkerRef> spawn(const std::string& group, std::vector<RoleSpec> roles = {{"", "echo", "{}"}}) {
    auto pool = rt_->resource_pool();
    EXPECT_TRUE(pool.ok());
    auto w = rt_->spawn_workers(group, *pool, roles);
    EXPECT_TRUE(w.ok()) << w.status().to_string();
    return w.ok() ? *w : std::vector<WorkerRef>{};
  }

  static std::string* token_file_;
  static AgentProcess* agents_[2];
  static Runtime* rt_;
};

std::string* Cluster::token_file_ = nullptr;
AgentProcess* Cluster::agents_[2] = {nullptr, nullptr};
Runtime* Cluster::rt_ = nullptr;

TEST_F(Cluster, SpawnsOneWorkerPerDeviceInStableRankOrder) {
  auto workers = spawn("info");
  ASSERT_EQ(workers.size(), 4u);
  std::vector<std::vector<Value>> no_args(4);
  auto out = rt_->call(workers, "rank_info", no_args);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  std::vector<std::string> addresses = {agents_[0]->address(), agents_[1]->address()};
  std::sort(addresses.begin(), addresses.end());
  for (int r = 0; r < 4; ++r) {
    const nlohmann::json& j = (*out)[r].json();
    EXPECT_EQ(j["rank"], r);
    EXPECT_EQ(j["world_size"], 4);
    EXPECT_EQ(j["local_rank"], r % 2);
    EXPECT_EQ(j["device"], "cpu:" + std::to_string(r % 2));
    EXPECT_EQ(j["master_addr"], "127.0.0.1");
    EXPECT_EQ(j["master_port"], (*out)[0].json()["master_port"]);
    EXPECT_FALSE(workers[r].local);
  }
  EXPECT_GT((*out)[0].json()["master_port"].get<int>(), 0);
}

TEST_F(Cluster, DataProtosCrossProcessesSmallInlineLargeByDataPlane) {
  auto workers = spawn("double");
  for (int64_t width : {4, 32768}) {  // 4 rows x 16 B (inline) and 4 rows x 128 KiB (data plane)
    auto before = rt_->data_plane().stats();
    std::vector<std::vector<Value>> args;
    for (int r = 0; r < 4; ++r) args.push_back({Value(make_batch(4, width, r * 1000.0f))});
    auto out = rt_->call(workers, "double_it", args);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    for (int r = 0; r < 4; ++r) {
      EXPECT_TRUE(torch::equal(*(*out)[r].proto().tensor("x"), *make_batch(4, width, r * 1000.0f).tensor("x") * 2));
      EXPECT_EQ((*out)[r].proto().meta_info()["rank"], r);
    }
    auto after = rt_->data_plane().stats();
    uint64_t served = after.served_shm_bytes + after.served_tcp_bytes -
                      before.served_shm_bytes - before.served_tcp_bytes;
    if (width == 4) EXPECT_EQ(served, 0u);
    else EXPECT_GE(served, 4u * 4 * width * 4);  // every input chunk pulled from the driver
    EXPECT_EQ(after.payloads, 0u);               // nothing left behind
  }
}

TEST_F(Cluster, KeptResultsMovePeerToPeerNeverThroughTheDriver) {
  auto producers = spawn("producer");
  auto consumers = spawn("consumer");
  std::vector<std::vector<Value>> args;
  for (int r = 0; r < 4; ++r) args.push_back({Value(make_batch(8, 16384, r))});
  std::vector<PayloadHandle> published;
  std::vector<CallRequest> reqs(4);
  for (int r = 0; r < 4; ++r) {
    reqs[r].method = "double_it";
    reqs[r].args = *rt_->encode_args(producers[r], args[r], published);
  }
  CallOptions keep;
  keep.keep_results = true;
  auto produced = first_error(rt_->call_wire(producers, reqs, keep)->wait());
  ASSERT_TRUE(produced.ok()) << produced.status().to_string();
  rt_->release_all(published);
  auto before = rt_->data_plane().stats();
  // Consumer j sums rows [2, 6) of producer (j + 1) % 4's output.
  std::vector<CallRequest> sums(4);
  for (int j = 0; j < 4; ++j) {
    const WireValue& p = (*produced)[(j + 1) % 4];
    ASSERT_EQ(p.kind, static_cast<uint8_t>(WireKind::proto_slices));
    WireValue slice;
    slice.kind = static_cast<uint8_t>(WireKind::proto_slices);
    slice.slices.push_back(PayloadSlice{p.slices[0].handle, 2, 6});
    sums[j].method = "sum";
    sums[j].args = {slice};
  }
  auto summed = first_error(rt_->call_wire(consumers, sums)->wait());
  ASSERT_TRUE(summed.ok()) << summed.status().to_string();
  auto after = rt_->data_plane().stats();
  EXPECT_EQ(after.served_tcp_bytes + after.served_shm_bytes,
            before.served_tcp_bytes + before.served_shm_bytes);
  EXPECT_EQ(after.fetched_remote_bytes, before.fetched_remote_bytes);  // JSON replies only
  for (int j = 0; j < 4; ++j) {
    auto v = from_wire((*summed)[j], rt_->data_plane(), true);
    double expect = (make_batch(8, 16384, (j + 1) % 4).slice(2, 6)->tensor("x")->sum() * 2).item<double>();
    EXPECT_DOUBLE_EQ(v->json()["sum"].get<double>(), expect);
    EXPECT_EQ(v->json()["rows"], 4);
  }
  for (const auto& p : *produced) rt_->release_all(payload_handles(p));
}

TEST_F(Cluster, ColocatedRolesShareOneActor) {
  auto workers = spawn("fused", {{"actor", "echo", "{}"}, {"critic", "critic", "{}"}});
  ASSERT_EQ(workers.size(), 4u);
  std::vector<std::vector<Value>> args(4, {Value(make_batch(3, 2))});
  auto a = rt_->call(workers, "actor_double_it", args);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  auto c = rt_->call(workers, "critic_value", args);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ((*c)[3].json()["role"], "critic");
  auto methods = rt_->methods(workers[0]);
  ASSERT_TRUE(methods.ok());
  std::vector<std::string> names;
  for (auto& m : *methods) names.push_back(m.name);
  EXPECT_NE(std::find(names.begin(), names.end(), "critic_value"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "actor_rank_info"), names.end());
}

TEST_F(Cluster, GarbageOnTheDataPlanePortLeavesTheAgentServing) {
  namespace asio = boost::asio;
  asio::io_context io;
  for (int i = 0; i < 3; ++i) {
    asio::ip::tcp::socket s(io);
    s.connect({asio::ip::make_address("127.0.0.1"), agents_[0]->data_plane_port()});
    std::string junk = i == 0 ? std::string(4096, '\xff') : std::string("GET / HTTP/1.0\r\n\r\n");
    boost::system::error_code ec;
    asio::write(s, asio::buffer(junk), ec);
    s.shutdown(asio::ip::tcp::socket::shutdown_send, ec);
    char buf[16];
    while (!ec) s.read_some(asio::buffer(buf), ec);  // the agent closes the connection
  }
  auto workers = spawn("after_garbage");
  std::vector<std::vector<Value>> args;
  for (int r = 0; r < 4; ++r) args.push_back({Value(make_batch(2, 65536, r))});
  auto out = rt_->call(workers, "identity", args);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(torch::equal(*(*out)[1].proto().tensor("x"), *make_batch(2, 65536, 1).tensor("x")));
}

// Note [Failing fast]: one rank's failure ends the whole call at once, across agents, instead
// of leaving the caller waiting for ranks that wait for it (here: for a FIFO). Their answers,
// once they come, are dropped and released, and the workers serve the next call.
TEST_F(Cluster, ARankThatFailsEndsTheCallWithoutWaitingForTheOthers) {
  auto workers = spawn("fast_fail");
  ASSERT_EQ(workers.size(), 4u);
  const std::string fifo = ::testing::TempDir() + "/fast_fail_fifo";
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::vector<CallRequest> reqs(4);
  for (size_t r = 0; r < 3; ++r) {
    reqs[r].method = "wait_fifo";
    reqs[r].args = {json_wire(fifo), json_wire(1)};
  }
  reqs[3].method = "fail";
  const uint64_t late_before = call_counters().late_replies_dropped;
  auto results = rt_->call_wire(workers, reqs)->wait();  // would hang without failing fast
  for (size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(results[r].status().code(), ErrorCode::cancelled) << results[r].status().to_string();
    EXPECT_NE(results[r].status().message().find("rank 3"), std::string::npos);
  }
  Result<std::vector<WireValue>> all = first_error(std::move(results));
  ASSERT_FALSE(all.ok());
  const std::string m = all.status().message();
  EXPECT_NE(m.find("boom"), std::string::npos) << m;
  EXPECT_NE(m.find("rank 3"), std::string::npos) << m;
  EXPECT_NE(m.find("'fail'"), std::string::npos) << m;
  EXPECT_NE(m.find("3 rank(s) given up unanswered"), std::string::npos) << m;

  // Let the three waiting ranks answer: agent 0's reply (ranks 0 and 1) reaches a call that has
  // ended and is dropped; agent 1 already dropped rank 2's answer itself.
  int fd = ::open(fifo.c_str(), O_RDWR);  // never blocks; keeps the bytes until read
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "\x01\x01\x01", 3), 3);
  while (call_counters().late_replies_dropped == late_before) std::this_thread::yield();
  std::vector<std::vector<Value>> none(4);
  auto after = rt_->call(workers, "rank_info", none);
  EXPECT_TRUE(after.ok()) << after.status().to_string();
  ::close(fd);
  ::unlink(fifo.c_str());
}

TEST(ClusterFailures, WrongTokenIsRefused) {
  std::string tf = testing::write_token_file("wrong_token_agent", kToken);
  auto agent = AgentProcess::start({"--devices", "cpu:1", "--token-file", tf});
  ASSERT_TRUE(agent.ok()) << agent.status().to_string();
  auto bad = Runtime::start(cluster_config({agent->address()}, "some-other-token-0123456789"),
                            testing::test_registry());
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::permission_denied);
  EXPECT_NE(bad.status().message().find(agent->address()), std::string::npos);
  auto good = Runtime::start(cluster_config({agent->address()}, kToken), testing::test_registry());
  ASSERT_TRUE(good.ok()) << good.status().to_string();  // still serving the right driver
}

TEST(ClusterFailures, AnOpenTokenFileIsRefusedAtStartUp) {
  std::string tf = testing::write_token_file("open_token", kToken, 0644);
  auto status = AgentProcess::run_to_exit({"--devices", "cpu:1", "--token-file", tf});
  ASSERT_TRUE(status.ok()) << status.status().to_string();
  EXPECT_TRUE(WIFEXITED(*status));
  EXPECT_NE(WEXITSTATUS(*status), 0);
}

TEST(ClusterFailures, KillingAnAgentMidCallFailsItsCallsWithinFiveSeconds) {
  std::string tf = testing::write_token_file("kill_token", kToken);
  auto victim = AgentProcess::start({"--devices", "cpu:2", "--token-file", tf});
  ASSERT_TRUE(victim.ok()) << victim.status().to_string();
  auto rt = Runtime::start(cluster_config({victim->address()}, kToken), testing::test_registry());
  ASSERT_TRUE(rt.ok()) << rt.status().to_string();
  auto workers = (*rt)->spawn_workers("doomed", *(*rt)->resource_pool(), {{"", "echo", "{}"}});
  ASSERT_TRUE(workers.ok()) << workers.status().to_string();
  // Both calls block on a FIFO nobody writes: they can only end through the agent's death.
  const std::string fifo = ::testing::TempDir() + "/kill_mid_call_fifo";
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::vector<CallRequest> reqs(2);
  for (auto& q : reqs) {
    q.method = "wait_fifo";
    q.args = {json_wire(fifo), json_wire(1)};
  }
  auto batch = (*rt)->call_wire(*workers, reqs);
  victim->signal(SIGKILL);
  auto t0 = std::chrono::steady_clock::now();
  auto results = batch->wait();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 5.0);
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(results[r].ok());
    const std::string m = results[r].status().message();
    EXPECT_EQ(results[r].status().code(), ErrorCode::unavailable) << m;
    EXPECT_NE(m.find("rank " + std::to_string(r)), std::string::npos) << m;
    EXPECT_NE(m.find("'wait_fifo'"), std::string::npos) << m;
    EXPECT_NE(m.find("127.0.0.1"), std::string::npos) << m;
  }
  ::unlink(fifo.c_str());
}

TEST(ClusterFailures, SigtermStopsAnAgentWithLiveWorkersCleanly) {
  std::string tf = testing::write_token_file("term_token", kToken);
  auto agent = AgentProcess::start({"--devices", "cpu:2", "--token-file", tf});
  ASSERT_TRUE(agent.ok());
  auto rt = Runtime::start(cluster_config({agent->address()}, kToken), testing::test_registry());
  ASSERT_TRUE(rt.ok());
  auto workers = (*rt)->spawn_workers("g", *(*rt)->resource_pool(), {{"", "echo", "{}"}});
  ASSERT_TRUE(workers.ok());
  agent->signal(SIGTERM);
  auto st = agent->wait(std::chrono::seconds(10));
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  EXPECT_TRUE(WIFEXITED(*st));
  EXPECT_EQ(WEXITSTATUS(*st), 0);
  std::vector<std::vector<Value>> none(2);
  auto after = (*rt)->call(*workers, "rank_info", none);
  EXPECT_EQ(after.status().code(), ErrorCode::unavailable);  // the driver saw them go
}

}  // namespace
}  // namespace tessera::runtime

int main(int argc, char** argv) {
  int agent = tessera::runtime::testing::agent_test_main(argc, argv,
                                                         tessera::runtime::testing::test_registry());
  if (agent >= 0) return agent;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
