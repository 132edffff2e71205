// Note [Call channel] across real processes: calls to agents' workers go through each agent's
// call channel (over TCP, and over the local socket: Note [Local call socket]) and give what
// the CAF path gives; junk on the channel's port or local socket leaves the agent
// serving; an agent that offers no channel is called through CAF. (A kill -9 mid-call, a hung
// worker's late answer and a silent agent are covered, through the channel, by
// runtime_integration_test.cpp and failure_integration_test.cpp.)
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <torch/torch.h>

#include "runtime/internal/call_channel.hpp"
#include "runtime/runtime.hpp"
#include "runtime/wire.hpp"
#include "tests/runtime/agent_process.hpp"
#include "tests/runtime/test_workers.hpp"

namespace tessera::runtime {
namespace {

using testing::AgentProcess;
const char* kToken = "call-channel-test-token-0123456789";

// How the driver reaches the agents' workers.
enum class Path { caf, channel_tcp, channel_local };

RuntimeConfig config_for(const std::vector<const AgentProcess*>& agents, Path path) {
  RuntimeConfig c;
  for (const AgentProcess* a : agents) c.agents.push_back(a->address());
  c.token = kToken;
  c.call_timeout = Millis(60000);
  c.call_channel = path != Path::caf;
  // Note [Local call socket]: same-host agents get the local socket unless shortcuts are off.
  c.data_plane.shared_memory = path != Path::channel_tcp;
  return c;
}

proto::DataProto batch_of(int64_t rows, int64_t width, float offset) {
  auto x = torch::arange(rows * width, torch::kFloat32).view({rows, width}) + offset;
  return *proto::DataProto::from_dict({{"x", x}});
}

// What one driver gets from the same calls (small inline batches, large data-plane batches,
// JSON), with the calls checked against their inputs on the way.
struct Outcome {
  std::vector<at::Tensor> doubled;
  std::vector<at::Tensor> echoed;
  std::vector<nlohmann::json> infos;
};

Outcome run_calls(Runtime& rt) {
  Outcome out;
  auto workers = rt.spawn_workers("chan", *rt.resource_pool(), {{"", "echo", "{}"}});
  EXPECT_TRUE(workers.ok()) << workers.status().to_string();
  if (!workers.ok()) return out;
  size_t n = workers->size();
  std::vector<std::vector<Value>> small, large;
  for (size_t r = 0; r < n; ++r) {
    small.push_back({Value(batch_of(3, 4, static_cast<float>(r)))});
    large.push_back({Value(batch_of(2, 65536, static_cast<float>(r)))});  // 512 KiB: data plane
  }
  for (int round = 0; round < 3; ++round) {  // several calls per worker: ordering, reuse
    auto doubled = rt.call(*workers, "double_it", small);
    auto echoed = rt.call(*workers, "identity", large);
    auto infos = rt.call(*workers, "rank_info", std::vector<std::vector<Value>>(n));
    EXPECT_TRUE(doubled.ok() && echoed.ok() && infos.ok())
        << doubled.status().to_string() << echoed.status().to_string() << infos.status().to_string();
    if (!doubled.ok() || !echoed.ok() || !infos.ok()) return out;
    out = Outcome{};
    for (size_t r = 0; r < n; ++r) {
      at::Tensor x = *(*doubled)[r].proto().tensor("x");
      EXPECT_TRUE(torch::equal(x, *batch_of(3, 4, static_cast<float>(r)).tensor("x") * 2));
      at::Tensor y = *(*echoed)[r].proto().tensor("x");
      EXPECT_TRUE(torch::equal(y, *batch_of(2, 65536, static_cast<float>(r)).tensor("x")));
      EXPECT_EQ((*infos)[r].json()["rank"], static_cast<int>(r));
      out.doubled.push_back(x);
      out.echoed.push_back(y);
      nlohmann::json info = (*infos)[r].json();
      info.erase("master_port");  // a port free at spawn time: differs from run to run
      out.infos.push_back(info);
    }
  }
  return out;
}

// Two agents with 2 devices each, offering call channels.
std::vector<AgentProcess> start_agents(const std::string& token_file) {
  std::vector<AgentProcess> agents;
  for (int i = 0; i < 2; ++i) {
    auto a = AgentProcess::start({"--devices", "cpu:2", "--token-file", token_file});
    EXPECT_TRUE(a.ok()) << a.status().to_string();
    if (!a.ok()) return {};
    EXPECT_NE(a->call_port(), 0) << "the agent offers a call channel";
    agents.push_back(std::move(a).value());
  }
  return agents;
}

std::vector<const AgentProcess*> pointers(const std::vector<AgentProcess>& agents) {
  std::vector<const AgentProcess*> out;
  for (const AgentProcess& a : agents) out.push_back(&a);
  return out;
}

// Fresh agents per driver: drivers in one test process share a CAF node id, and an agent stops
// a node's workers when that node's previous driver goes away.
TEST(CallChannelCluster, CallsGoThroughTheChannelAndGiveWhatTheCafPathGives) {
  std::string tf = testing::write_token_file("channel_token", kToken);
  const Path paths[] = {Path::caf, Path::channel_tcp, Path::channel_local};
  const char* transport[] = {"", "TCP", "local socket"};
  Outcome by_path[3];
  for (size_t p = 0; p < 3; ++p) {
    std::vector<AgentProcess> agents = start_agents(tf);
    ASSERT_EQ(agents.size(), 2u);
    auto rt = Runtime::start(config_for(pointers(agents), paths[p]), testing::test_registry());
    ASSERT_TRUE(rt.ok()) << rt.status().to_string();
    for (const Node& node : (*rt)->nodes()) {
      EXPECT_EQ((*rt)->hub().channel_transport(node.agent), transport[p]) << node.address;
    }
    uint64_t before = call_counters().channel_calls;
    by_path[p] = run_calls(**rt);
    uint64_t sent = call_counters().channel_calls - before;
    // 3 rounds x 3 calls x 2 agents, one frame per agent per call; none through CAF.
    EXPECT_EQ(sent, paths[p] == Path::caf ? 0u : 18u) << transport[p];
    EXPECT_EQ((*rt)->hub().pending_calls(), 0u);
  }
  for (size_t p = 0; p < 3; ++p) ASSERT_EQ(by_path[p].doubled.size(), 4u) << p;
  for (size_t p = 1; p < 3; ++p) {
    for (size_t r = 0; r < 4; ++r) {
      EXPECT_TRUE(torch::equal(by_path[0].doubled[r], by_path[p].doubled[r]));
      EXPECT_TRUE(torch::equal(by_path[0].echoed[r], by_path[p].echoed[r]));
      EXPECT_EQ(by_path[0].infos[r], by_path[p].infos[r]);
    }
  }
}

TEST(CallChannelCluster, JunkOnTheChannelPortLeavesTheAgentServing) {
  std::string tf = testing::write_token_file("channel_junk_token", kToken);
  std::vector<AgentProcess> agents = start_agents(tf);
  ASSERT_EQ(agents.size(), 2u);
  auto rt = Runtime::start(config_for(pointers(agents), Path::channel_local), testing::test_registry());
  ASSERT_TRUE(rt.ok()) << rt.status().to_string();
  const std::vector<std::string> junk = {std::string(4096, '\xff'), "GET / HTTP/1.0\r\n\r\n", ""};
  // On the TCP port and on the local socket (Note [Local call socket]).
  std::string local = internal::channel_local_socket(agents[0].pid(), agents[0].call_port());
  for (size_t k = 0; k < 2 * junk.size(); ++k) {
    const std::string& bytes = junk[k % junk.size()];
    int fd = -1;
    if (k < junk.size()) {
      fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(agents[0].call_port());
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    } else {
      fd = testing::connect_local_socket(local);
      ASSERT_GE(fd, 0) << local;
    }
    if (!bytes.empty()) (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    ::shutdown(fd, SHUT_WR);
    char buf[64];
    while (::recv(fd, buf, sizeof buf, 0) > 0) {
    }  // the nonce, then the agent closes
    ::close(fd);
  }
  uint64_t before = call_counters().channel_calls;
  Outcome o = run_calls(**rt);
  EXPECT_EQ(o.infos.size(), 4u);
  EXPECT_EQ(call_counters().channel_calls - before, 18u);  // the channels stayed open
  for (const Node& node : (*rt)->nodes()) {
    EXPECT_EQ((*rt)->hub().channel_transport(node.agent), "local socket") << node.address;
  }
}

TEST(CallChannelOff, AnAgentWithoutAChannelIsCalledThroughCaf) {
  std::string tf = testing::write_token_file("channel_off_token", kToken);
  auto agent = AgentProcess::start({"--devices", "cpu:2", "--token-file", tf, "--call-listen",
                                    "off"});
  ASSERT_TRUE(agent.ok()) << agent.status().to_string();
  EXPECT_EQ(agent->call_port(), 0);
  auto rt = Runtime::start(config_for({&*agent}, Path::channel_local), testing::test_registry());
  ASSERT_TRUE(rt.ok()) << rt.status().to_string();
  EXPECT_FALSE((*rt)->hub().channel_open((*rt)->nodes()[0].agent));
  uint64_t before = call_counters().channel_calls;
  auto workers = (*rt)->spawn_workers("caf", *(*rt)->resource_pool(), {{"", "echo", "{}"}});
  ASSERT_TRUE(workers.ok()) << workers.status().to_string();
  auto infos = (*rt)->call(*workers, "rank_info", std::vector<std::vector<Value>>(2));
  ASSERT_TRUE(infos.ok()) << infos.status().to_string();
  EXPECT_EQ((*infos)[1].json()["rank"], 1);
  EXPECT_EQ(call_counters().channel_calls, before);
}

}  // namespace
}  // namespace tessera::runtime
