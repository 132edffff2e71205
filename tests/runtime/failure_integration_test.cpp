// Liveness and TLS across real processes: a hung worker on an agent (Note [Late replies]), a
// silent agent (SIGSTOP: heartbeats), and TLS verification (Note [TLS in CAF 0.17]).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include <fcntl.h>

#include "runtime/runtime.hpp"
#include "runtime/wire.hpp"
#include "tests/runtime/agent_process.hpp"
#include "tests/runtime/test_workers.hpp"

namespace tessera::runtime {
namespace {

using testing::AgentProcess;
const char* kToken = "failure-test-token-0123456789abcdef";

RuntimeConfig driver_config(const std::string& agent) {
  RuntimeConfig c;
  c.agents = {agent};
  c.token = kToken;
  c.call_timeout = Millis(30000);
  return c;
}

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "/" + name; }

TEST(ClusterLiveness, AHungRemoteWorkerTimesOutAndItsLateAnswerIsDropped) {
  std::string tf = testing::write_token_file("hung_token", kToken);
  auto agent = AgentProcess::start({"--devices", "cpu:1", "--token-file", tf});
  ASSERT_TRUE(agent.ok()) << agent.status().to_string();
  auto rt = Runtime::start(driver_config(agent->address()), testing::test_registry());
  ASSERT_TRUE(rt.ok()) << rt.status().to_string();
  auto workers = (*rt)->spawn_workers("hung", *(*rt)->resource_pool(), {{"", "echo", "{}"}});
  ASSERT_TRUE(workers.ok()) << workers.status().to_string();
  std::string fifo = temp_path("hung_remote_fifo");
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  CallCounters before = call_counters();

  CallRequest req;
  req.method = "wait_fifo";
  req.args = {json_wire(fifo), json_wire(2)};  // 256 KiB result: published, not inline
  CallOptions opts;
  opts.timeout = Millis(300);
  auto batch = (*rt)->call_wire(*workers, {req}, opts);
  Status st = batch->wait()[0].status();
  EXPECT_EQ(st.code(), ErrorCode::timeout) << st.to_string();
  for (const char* part : {"rank 0", "127.0.0.1", "'wait_fifo'"}) {
    EXPECT_NE(st.message().find(part), std::string::npos) << part << " in " << st.message();
  }
  ASSERT_TRUE((*rt)->hub().flush(Millis(10000)).ok());  // its deadline sweep has finished
  EXPECT_EQ((*rt)->hub().pending_calls(), 0u);
  batch.reset();
  EXPECT_EQ(call_counters().live_batches, before.live_batches);

  int fd = ::open(fifo.c_str(), O_WRONLY | O_CLOEXEC);  // the latch: the worker answers now
  ASSERT_GE(fd, 0);
  char byte = 1;
  ASSERT_EQ(::write(fd, &byte, 1), 1);
  ::close(fd);
  // Queued behind the late answer on the same worker, agent and connection.
  auto info = (*rt)->call(*workers, "rank_info", std::vector<std::vector<Value>>(1));
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  CallCounters after = call_counters();
  EXPECT_EQ(after.late_replies_dropped, before.late_replies_dropped + 1);
  EXPECT_EQ(after.late_payloads_released, before.late_payloads_released + 1);
  ASSERT_TRUE((*rt)->hub().flush(Millis(10000)).ok());
  EXPECT_EQ((*rt)->hub().pending_calls(), 0u);
  ::unlink(fifo.c_str());
}

TEST(ClusterLiveness, ASilentAgentFailsPendingCallsAtTheConnectionTimeout) {
  std::string tf = testing::write_token_file("silent_token", kToken);
  auto agent = AgentProcess::start({"--devices", "cpu:2", "--token-file", tf, "--heartbeat-ms",
                                    "100", "--connection-timeout-ms", "1000"});
  ASSERT_TRUE(agent.ok()) << agent.status().to_string();
  RuntimeConfig cfg = driver_config(agent->address());
  cfg.heartbeat_interval = Millis(100);
  cfg.connection_timeout = Millis(1000);
  auto rt = Runtime::start(cfg, testing::test_registry());
  ASSERT_TRUE(rt.ok()) << rt.status().to_string();
  auto workers = (*rt)->spawn_workers("muted", *(*rt)->resource_pool(), {{"", "echo", "{}"}});
  ASSERT_TRUE(workers.ok()) << workers.status().to_string();
  ASSERT_TRUE(agent->stop().ok());  // alive (no FIN, no RST) but silent
  std::vector<CallRequest> reqs(2);
  for (auto& q : reqs) q.method = "rank_info";
  auto t0 = std::chrono::steady_clock::now();
  auto results = (*rt)->call_wire(*workers, reqs)->wait();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 5.0);  // the 30 s call deadline did not decide it
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(results[r].ok());
    const std::string m = results[r].status().message();
    EXPECT_EQ(results[r].status().code(), ErrorCode::unavailable) << m;
    EXPECT_NE(m.find("rank " + std::to_string(r)), std::string::npos) << m;
    EXPECT_NE(m.find("'rank_info'"), std::string::npos) << m;
    EXPECT_NE(m.find(agent->address()), std::string::npos) << m;
  }
  auto stop = std::chrono::steady_clock::now();
  (*rt)->shutdown();  // the agent is still stopped: shutting down must not wait for it
  double stop_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - stop).count();
  EXPECT_LT(stop_s, cfg.shutdown_timeout.count() / 1000.0 + 2.0);
  agent->signal(SIGCONT);  // the destructor SIGKILLs and reaps it
}

// ---- TLS -----------------------------------------------------------------------------------

// Throwaway CAs and certificates made with the openssl CLI under the test temp dir.
class ClusterTls : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (std::system("command -v openssl >/dev/null 2>&1") != 0) return;
    dir_ = new std::string(temp_path("tls"));
    std::string d = *dir_;
    std::string script =
        "set -e; rm -rf " + d + "; mkdir -p " + d + "; cd " + d + "; " +
        "key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out $1.key; }; "
        "ca() { key $1; openssl req -x509 -new -key $1.key -out $1.pem -days 2 -subj /CN=$1; }; "
        "leaf() { key $1; openssl req -new -key $1.key -out $1.csr -subj /CN=127.0.0.1; "
        "  openssl x509 -req -in $1.csr -CA $2.pem -CAkey $2.key -CAcreateserial -out $1.pem "
        "  -days 2; }; "
        "ca ca_a; ca ca_b; leaf agent ca_a; leaf driver ca_a; leaf stranger ca_b; "
        "chmod 600 *.key";
    ok_ = std::system(("(" + script + ") >" + d + ".log 2>&1").c_str()) == 0;
  }
  static void TearDownTestSuite() { delete dir_; }

  void SetUp() override {
    if (dir_ == nullptr) GTEST_SKIP() << "no openssl command-line tool";
    ASSERT_TRUE(ok_) << "generating test certificates failed; see " << *dir_ << ".log";
  }
  static std::string file(const std::string& name) { return *dir_ + "/" + name; }

  // An agent serving TLS with agent.pem, trusting drivers signed by ca_a.
  static Result<AgentProcess> start_agent(const std::string& token_file) {
    return AgentProcess::start({"--devices", "cpu:1", "--token-file", token_file, "--tls-cert",
                                file("agent.pem"), "--tls-key", file("agent.key"), "--tls-cafile",
                                file("ca_a.pem")});
  }
  static RuntimeConfig tls_driver(const std::string& agent, const std::string& who,
                                  const std::string& ca) {
    RuntimeConfig c = driver_config(agent);
    c.tls_cert = file(who + ".pem");
    c.tls_key = file(who + ".key");
    c.tls_cafile = file(ca + ".pem");
    return c;
  }

  static std::string* dir_;
  static bool ok_;
};

std::string* ClusterTls::dir_ = nullptr;
bool ClusterTls::ok_ = false;

TEST_F(ClusterTls, ADriverAndAnAgentSignedByTheTrustedCaCallOverTls) {
  auto agent = start_agent(testing::write_token_file("tls_token", kToken));
  ASSERT_TRUE(agent.ok()) << agent.status().to_string();
  EXPECT_EQ(agent->call_port(), 0);  // Note [Call channel]: unencrypted, so not offered
  auto rt = Runtime::start(tls_driver(agent->address(), "driver", "ca_a"),
                           testing::test_registry());
  ASSERT_TRUE(rt.ok()) << rt.status().to_string();
  EXPECT_FALSE((*rt)->hub().channel_open((*rt)->nodes()[0].agent));  // calls stay on TLS
  auto workers = (*rt)->spawn_workers("tls", *(*rt)->resource_pool(), {{"", "echo", "{}"}});
  ASSERT_TRUE(workers.ok()) << workers.status().to_string();
  std::vector<std::vector<Value>> args(1);
  args[0] = {Value(nlohmann::json(2)), Value(nlohmann::json(3))};
  auto out = (*rt)->call(*workers, "add", args);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ((*out)[0].json().get<double>(), 5.0);
}

// Refused at connect time, with one line naming the agent; the agent keeps serving.
void expect_refused(const Result<std::unique_ptr<Runtime>>& rt, const AgentProcess& agent) {
  ASSERT_FALSE(rt.ok());
  const std::string m = rt.status().message();
  EXPECT_NE(m.find(agent.address()), std::string::npos) << m;
  EXPECT_NE(m.find("TLS"), std::string::npos) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
}

TEST_F(ClusterTls, ADriverTrustingAnotherCaRefusesTheAgent) {
  auto agent = start_agent(testing::write_token_file("tls_token2", kToken));
  ASSERT_TRUE(agent.ok()) << agent.status().to_string();
  // Its own certificate is one the agent accepts; only its trust differs.
  expect_refused(Runtime::start(tls_driver(agent->address(), "driver", "ca_b"),
                                testing::test_registry()), *agent);
  auto good = Runtime::start(tls_driver(agent->address(), "driver", "ca_a"),
                             testing::test_registry());
  EXPECT_TRUE(good.ok()) << good.status().to_string();
}

TEST_F(ClusterTls, AnAgentRefusesADriverWhoseCertificateItsCaDidNotSign) {
  auto agent = start_agent(testing::write_token_file("tls_token3", kToken));
  ASSERT_TRUE(agent.ok()) << agent.status().to_string();
  expect_refused(Runtime::start(tls_driver(agent->address(), "stranger", "ca_a"),
                                testing::test_registry()), *agent);
  auto good = Runtime::start(tls_driver(agent->address(), "driver", "ca_a"),
                             testing::test_registry());
  EXPECT_TRUE(good.ok()) << good.status().to_string();
}

TEST_F(ClusterTls, ACaFileAloneIsAConfigErrorNotAPlainConnection) {
  RuntimeConfig c = driver_config("127.0.0.1:1");
  c.tls_cafile = file("ca_a.pem");
  auto rt = Runtime::start(c, testing::test_registry());
  ASSERT_FALSE(rt.ok());
  EXPECT_EQ(rt.status().code(), ErrorCode::invalid_argument);
  EXPECT_NE(rt.status().message().find("tls_cert"), std::string::npos) << rt.status().message();
}

TEST_F(ClusterTls, AnUnreadableOrNonPemFileIsRefusedAtStartUp) {
  std::string tf = testing::write_token_file("tls_token4", kToken);
  auto status = AgentProcess::run_to_exit({"--devices", "cpu:1", "--token-file", tf, "--tls-cert",
                                           file("missing.pem"), "--tls-key", file("agent.key"),
                                           "--tls-cafile", file("ca_a.pem")});
  ASSERT_TRUE(status.ok()) << status.status().to_string();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) != 0);  // refused, never "ready"
  // An explicit call channel with TLS would be an unencrypted side door: refused.
  auto channel = AgentProcess::run_to_exit({"--devices", "cpu:1", "--token-file", tf,
                                            "--tls-cert", file("agent.pem"), "--tls-key",
                                            file("agent.key"), "--tls-cafile", file("ca_a.pem"),
                                            "--call-listen", "127.0.0.1:0"});
  ASSERT_TRUE(channel.ok()) << channel.status().to_string();
  EXPECT_TRUE(WIFEXITED(*channel) && WEXITSTATUS(*channel) != 0);
  RuntimeConfig c = tls_driver("127.0.0.1:1", "driver", "ca_a");
  c.tls_cafile = file("ca_a.srl");  // exists, but is not PEM
  auto rt = Runtime::start(c, testing::test_registry());
  ASSERT_FALSE(rt.ok());
  EXPECT_NE(rt.status().message().find("ca_a.srl"), std::string::npos) << rt.status().message();
  EXPECT_NE(rt.status().message().find("not a PEM file"), std::string::npos)
      << rt.status().message();
}

}  // namespace
}  // namespace tessera::runtime
