// Note [Call channel], in process: a real ChannelServer hosting real detached workers (an
// embedded Runtime's), driven by ChannelClients and by raw sockets that misbehave. Waiting is
// on futures the channel's own threads fulfil; nothing sleeps.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <future>

#include <caf/binary_serializer.hpp>

#include "runtime/internal/call_channel.hpp"
#include "runtime/runtime.hpp"
#include "runtime/wire.hpp"
#include "tests/runtime/test_workers.hpp"

namespace tessera::runtime {
namespace {

using internal::ChannelCall;
using internal::ChannelClient;
using internal::ChannelServer;

constexpr uint64_t kMaxFrame = 1 << 20;

// A raw TCP connection to 127.0.0.1:port (the test misbehaves on it).
int raw_connect(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  return fd;
}

// A raw connection to the abstract Unix socket `name` (Note [Local call socket]).
int raw_connect_local(const std::string& name) {
  int fd = testing::connect_local_socket(name);
  EXPECT_GE(fd, 0) << name;
  return fd;
}

void raw_write(int fd, const std::string& bytes) {
  ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(bytes.size()));
}

// Reads until the peer closes; returns what came.
std::string read_until_closed(int fd) {
  std::string out;
  char buf[256];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

std::string le64(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), 8); }

// What a client saw: its replies by call id, and how it ended.
struct Seen {
  std::mutex mutex;
  std::map<uint64_t, std::promise<AgentCallReply>> replies;
  std::promise<std::string> closed;
  std::future<AgentCallReply> expect(uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex);
    return replies[id].get_future();
  }
};

class CallChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RuntimeConfig cfg;
    cfg.embedded_devices = "cpu:2";
    auto rt = Runtime::start(cfg, testing::test_registry());
    ASSERT_TRUE(rt.ok()) << rt.status().to_string();
    rt_ = std::move(rt).value();
    auto workers = rt_->spawn_workers("chan", *rt_->resource_pool(), {{"", "echo", "{}"}});
    ASSERT_TRUE(workers.ok()) << workers.status().to_string();
    workers_ = *workers;
    auto server = ChannelServer::start(rt_->system(), "127.0.0.1", 0, "test-host", kMaxFrame,
                                        std::chrono::microseconds(200));
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    server_ = std::move(server).value();
    // Rank 0 belongs to driver node "A", rank 1 to node "B".
    server_->add_worker({workers_[0].actor, workers_[0].context, "A"});
    server_->add_worker({workers_[1].actor, workers_[1].context, "B"});
    auto session = server_->open_session("A");
    ASSERT_TRUE(session.ok());
    session_ = *session;
  }
  void TearDown() override {
    if (server_) server_->stop();
    workers_.clear();  // actor handles: the actor system waits for every detached thread
    rt_.reset();
  }

  // `local_socket`: Note [Local call socket], tried first when not empty. `port`: another
  // agent's than the fixture's server.
  Result<std::unique_ptr<ChannelClient>> connect(Seen& seen, const std::string& key,
                                                 const std::string& local_socket = "",
                                                 uint16_t port = 0) {
    return ChannelClient::connect(
        rt_->system(), "test-agent",
        {"127.0.0.1", port != 0 ? port : server_->port(), local_socket},
        session_.first, key, Millis(10000), kMaxFrame,
        std::chrono::microseconds(200),
        [&seen](uint64_t id, AgentCallReply& reply) {
          std::lock_guard<std::mutex> lock(seen.mutex);
          seen.replies[id].set_value(std::move(reply));
        },
        [&seen](const std::string& why) { seen.closed.set_value(why); });
  }

  // A raw connection (TCP, or the local socket) that completed the handshake with the
  // session's key.
  int raw_session(bool local = false) {
    int fd = local ? raw_connect_local(server_->local_socket()) : raw_connect(server_->port());
    std::string nonce(internal::kChannelNonceBytes, '\0');
    EXPECT_EQ(::recv(fd, nonce.data(), nonce.size(), MSG_WAITALL),
              static_cast<ssize_t>(nonce.size()));
    raw_write(fd, le64(session_.first) + internal::channel_proof(session_.second, nonce));
    char ok[4];
    EXPECT_EQ(::recv(fd, ok, sizeof ok, MSG_WAITALL), 4);
    return fd;
  }

  // Sends `call` as call `id` and waits for its answer; the send's error if it was not sent.
  static Result<AgentCallReply> round_trip(ChannelClient& client, Seen& seen, uint64_t id,
                                           const ChannelCall& call) {
    auto answer = seen.expect(id);
    TESSERA_RETURN_IF_ERROR(client.send(id, call));
    return answer.get();
  }

  static ChannelCall rank_info_call(caf::actor_id worker) {
    ChannelCall call;
    call.workers = {worker};
    call.requests.resize(1);
    call.requests[0].method = "rank_info";
    return call;
  }

  std::unique_ptr<Runtime> rt_;
  std::vector<WorkerRef> workers_;
  std::unique_ptr<ChannelServer> server_;
  std::pair<uint64_t, std::string> session_;
};

TEST_F(CallChannelTest, ACallReachesTheHostedWorkerAndItsAnswerComesBack) {
  Seen seen;
  auto client = connect(seen, session_.second);
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  ChannelCall call = rank_info_call(workers_[0].actor.id());
  call.requests.push_back(call.requests[0]);  // the same worker twice, in one frame
  call.workers.push_back(call.workers[0]);
  Result<AgentCallReply> reply = round_trip(**client, seen, 7, call);
  ASSERT_TRUE(reply.ok()) << reply.status().to_string();
  ASSERT_EQ(reply->codes.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    ASSERT_EQ(reply->codes[k], 0) << reply->messages[k];
    Result<Value> v = from_wire(reply->results[k], rt_->data_plane(), true);
    ASSERT_TRUE(v.ok()) << v.status().to_string();
    EXPECT_EQ(v->json()["rank"], workers_[0].context.rank);
    EXPECT_EQ(v->json()["group"], "chan");
  }
  EXPECT_EQ(server_->bad_connections(), 0u);
}

TEST_F(CallChannelTest, AWorkerOfAnotherDriverOrUnknownIsNotCalled) {
  Seen seen;
  auto client = connect(seen, session_.second);
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  ChannelCall call = rank_info_call(workers_[1].actor.id());  // node B's worker
  call.workers.push_back(987654321);                          // no such actor
  call.requests.push_back(call.requests[0]);
  Result<AgentCallReply> reply = round_trip(**client, seen, 1, call);
  ASSERT_TRUE(reply.ok()) << reply.status().to_string();
  ASSERT_EQ(reply->codes.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_EQ(reply->codes[k], static_cast<uint8_t>(ErrorCode::unavailable));
    EXPECT_NE(reply->messages[k].find("not hosted by the agent on test-host"), std::string::npos)
        << reply->messages[k];
  }
  // A call whose columns disagree is refused as a whole.
  ChannelCall lopsided = rank_info_call(workers_[0].actor.id());
  lopsided.workers.push_back(workers_[0].actor.id());
  Result<AgentCallReply> r2 = round_trip(**client, seen, 2, lopsided);
  ASSERT_TRUE(r2.ok()) << r2.status().to_string();
  ASSERT_EQ(r2->codes.size(), 1u);
  EXPECT_EQ(r2->codes[0], static_cast<uint8_t>(ErrorCode::invalid_argument));
}

TEST_F(CallChannelTest, AWrongKeyOrSessionIsRefusedAndTheServerKeepsServing) {
  Seen bad;
  auto refused = connect(bad, std::string(32, 'k'));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), ErrorCode::unavailable) << refused.status().to_string();
  EXPECT_NE(refused.status().message().find("handshake"), std::string::npos);
  EXPECT_NE(refused.status().message().find(std::to_string(server_->port())), std::string::npos);
  // Junk instead of a hello: an unknown session.
  int fd = raw_connect(server_->port());
  raw_write(fd, std::string(4096, '\xff'));
  read_until_closed(fd);
  ::close(fd);
  EXPECT_EQ(server_->bad_connections(), 2u);
  Seen seen;
  auto client = connect(seen, session_.second);
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  Result<AgentCallReply> reply =
      round_trip(**client, seen, 3, rank_info_call(workers_[0].actor.id()));
  ASSERT_TRUE(reply.ok()) << reply.status().to_string();
  EXPECT_EQ(reply->codes.at(0), 0);
}

TEST_F(CallChannelTest, GarbageFramesCloseOnlyThatConnection) {
  Seen seen;
  auto client = connect(seen, session_.second);
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  const std::string header_tail(20, '\0');
  const std::vector<std::string> garbage = {
      std::string("XXXX") + header_tail,                                  // bad magic
      std::string("TCF1\x02") + std::string(19, '\0'),                    // a reply, to the agent
      std::string("TCF1\x01\0\0\0", 8) + le64(1) + le64(kMaxFrame + 1),   // body over the limit
      std::string("TCF1\x01\0\0\0", 8) + le64(1) + le64(16) + std::string(16, '\x7f'),  // undecodable
      std::string("TCF1\x01\0\0\0", 8) + le64(1) + le64(64) + "short",    // truncated
      // A vector claiming 2^56 elements (varint), in a small body.
      std::string("TCF1\x01\0\0\0", 8) + le64(1) + le64(8) +
          std::string("\x80\x80\x80\x80\x80\x80\x80\x01", 8),
  };
  uint64_t bad = 0;
  for (bool local : {false, true}) {
    for (size_t i = 0; i < garbage.size(); ++i) {
      int fd = raw_session(local);
      raw_write(fd, garbage[i]);
      if (i == 4) ::shutdown(fd, SHUT_WR);  // cut short
      EXPECT_EQ(read_until_closed(fd), "") << "garbage " << i << " local " << local;
      ::close(fd);
      EXPECT_EQ(server_->bad_connections(), ++bad) << "garbage " << i << " local " << local;
    }
  }
  // The well-behaved connection was never touched.
  Result<AgentCallReply> reply =
      round_trip(**client, seen, 4, rank_info_call(workers_[0].actor.id()));
  ASSERT_TRUE(reply.ok()) << reply.status().to_string();
  EXPECT_EQ(reply->codes.at(0), 0);
  EXPECT_TRUE((*client)->open());
}

// Note [Local call socket]: the agent's abstract socket is named after its pid and TCP port,
// and a driver given that name calls through it.
TEST_F(CallChannelTest, ASameHostDriverCallsThroughTheLocalSocket) {
  EXPECT_EQ(server_->local_socket(), internal::channel_local_socket(::getpid(), server_->port()));
  Seen seen;
  auto client = connect(seen, session_.second, server_->local_socket());
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  EXPECT_TRUE((*client)->local());
  Result<AgentCallReply> reply =
      round_trip(**client, seen, 8, rank_info_call(workers_[0].actor.id()));
  ASSERT_TRUE(reply.ok()) << reply.status().to_string();
  ASSERT_EQ(reply->codes.at(0), 0) << reply->messages.at(0);
  Result<Value> v = from_wire(reply->results[0], rt_->data_plane(), true);
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_EQ(v->json()["rank"], workers_[0].context.rank);
  // Without a name (another machine) the same session goes over TCP.
  Seen tcp_seen;
  auto tcp = connect(tcp_seen, session_.second);
  ASSERT_TRUE(tcp.ok()) << tcp.status().to_string();
  EXPECT_FALSE((*tcp)->local());
  EXPECT_EQ(server_->bad_connections(), 0u);
}

// A name nobody listens on (the agent is in another network namespace), or a local socket that
// is another agent's (its handshake refuses the session): the driver uses TCP.
TEST_F(CallChannelTest, ALocalSocketThatIsNotTheAgentsFallsBackToTcp) {
  Seen seen;
  auto absent = connect(seen, session_.second, "tessera-call-no-such-agent");
  ASSERT_TRUE(absent.ok()) << absent.status().to_string();
  EXPECT_FALSE((*absent)->local());
  Result<AgentCallReply> reply =
      round_trip(**absent, seen, 9, rank_info_call(workers_[0].actor.id()));
  ASSERT_TRUE(reply.ok()) << reply.status().to_string();
  EXPECT_EQ(reply->codes.at(0), 0);

  auto other = ChannelServer::start(rt_->system(), "127.0.0.1", 0, "other-host", kMaxFrame,
                                     std::chrono::microseconds(200));
  ASSERT_TRUE(other.ok()) << other.status().to_string();
  Seen seen2;
  auto wrong = connect(seen2, session_.second, (*other)->local_socket());
  ASSERT_TRUE(wrong.ok()) << wrong.status().to_string();
  EXPECT_FALSE((*wrong)->local());
  EXPECT_EQ((*other)->bad_connections(), 1u);  // refused there, logged
  reply = round_trip(**wrong, seen2, 10, rank_info_call(workers_[0].actor.id()));
  ASSERT_TRUE(reply.ok()) << reply.status().to_string();
  EXPECT_EQ(reply->codes.at(0), 0);
  (*other)->stop();
}

// A wrong key is refused on the local socket too, and then on TCP: the error names the TCP
// address, both refusals are counted, and the server keeps serving.
TEST_F(CallChannelTest, AWrongKeyIsRefusedOnTheLocalSocketAndOnTcp) {
  Seen bad;
  auto refused = connect(bad, std::string(32, 'k'), server_->local_socket());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find(std::to_string(server_->port())), std::string::npos)
      << refused.status().to_string();
  EXPECT_EQ(server_->bad_connections(), 2u);
  Seen seen;
  auto client = connect(seen, session_.second, server_->local_socket());
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  EXPECT_TRUE((*client)->local());
}

TEST_F(CallChannelTest, EndingTheSessionClosesItsConnectionsAndRefusesNewOnes) {
  Seen seen;
  auto client = connect(seen, session_.second);
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  server_->end_session("A");  // the driver's hub went away
  std::string why = seen.closed.get_future().get();
  EXPECT_NE(why.find("closed"), std::string::npos) << why;
  EXPECT_FALSE((*client)->open());
  Status st = (*client)->send(5, rank_info_call(workers_[0].actor.id()));
  EXPECT_EQ(st.code(), ErrorCode::unavailable);
  Seen again;
  EXPECT_FALSE(connect(again, session_.second).ok());
}

TEST_F(CallChannelTest, AWorkerThatTerminatesFailsItsCallInsteadOfHanging) {
  Seen seen;
  auto client = connect(seen, session_.second);
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  caf::actor_id id = workers_[0].actor.id();
  caf::scoped_actor self{rt_->system()};
  self->monitor(workers_[0].actor);
  caf::anon_send_exit(workers_[0].actor, caf::exit_reason::kill);
  self->receive([](const caf::down_msg&) {});
  // The worker is still in the agent's table.
  Result<AgentCallReply> reply = round_trip(**client, seen, 6, rank_info_call(id));
  ASSERT_TRUE(reply.ok()) << reply.status().to_string();
  ASSERT_EQ(reply->codes.size(), 1u);
  EXPECT_EQ(reply->codes[0], static_cast<uint8_t>(ErrorCode::unavailable));
  EXPECT_NE(reply->messages[0].find("terminated"), std::string::npos) << reply->messages[0];
}

// A stand-in agent on 127.0.0.1 that completes the driver's handshake (without checking its
// proof), then writes whatever the test gives it.
class FakeAgent {
 public:
  FakeAgent() {
    Result<int> fd = internal::listen_tcp("127.0.0.1", port_);
    EXPECT_TRUE(fd.ok()) << fd.status().to_string();
    listen_fd_ = fd.ok() ? *fd : -1;
    accepted_ = std::async(std::launch::async, [this] {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      std::string nonce(internal::kChannelNonceBytes, 'n');
      raw_write(fd, nonce);
      char hello[internal::kChannelHelloBytes];
      EXPECT_EQ(::recv(fd, hello, sizeof hello, MSG_WAITALL), static_cast<ssize_t>(sizeof hello));
      uint32_t ok = internal::kChannelOkMagic;
      raw_write(fd, std::string(reinterpret_cast<const char*>(&ok), 4));
      return fd;
    });
  }
  ~FakeAgent() {
    if (fd_ >= 0) ::close(fd_);
    if (listen_fd_ >= 0) ::close(listen_fd_);
  }
  uint16_t port() const { return port_; }
  // The driver's end is connected: the agent's descriptor.
  int fd() {
    if (fd_ < 0) fd_ = accepted_.get();
    return fd_;
  }

 private:
  int listen_fd_ = -1;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::future<int> accepted_;
};

// An answer frame as an agent writes it (Note [Call channel]: header, then the CAF body).
std::string reply_frame(caf::actor_system& sys, uint64_t id, AgentCallReply reply) {
  std::vector<char> body;
  caf::binary_serializer sink(sys, body);
  EXPECT_FALSE(sink(reply));
  std::string frame(internal::kChannelHeaderBytes, '\0');
  uint32_t magic = internal::kChannelFrameMagic;
  std::memcpy(frame.data(), &magic, 4);
  frame[4] = static_cast<char>(internal::FrameKind::reply);
  std::memcpy(frame.data() + 8, &id, 8);
  uint64_t bytes = body.size();
  std::memcpy(frame.data() + 16, &bytes, 8);
  return frame + std::string(body.begin(), body.end());
}

// The driver's side of Note [Call channel]: an answer frame that is garbage ends the channel
// once (on_close naming what was wrong: the driver then fails the agent's pending calls and
// goes back to CAF), after the good answers before it were delivered.
TEST_F(CallChannelTest, AGarbageAnswerEndsTheDriversChannelOnce) {
  FakeAgent agent;
  Seen seen;
  auto client = connect(seen, "any key", "", agent.port());
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  auto first = seen.expect(1);
  std::vector<Result<WireValue>> outcome;
  outcome.emplace_back(WireValue{});
  raw_write(agent.fd(), reply_frame(rt_->system(), 1, internal::agent_reply(std::move(outcome))));
  AgentCallReply reply = first.get();
  ASSERT_EQ(reply.codes.size(), 1u);
  EXPECT_EQ(reply.codes[0], 0);
  raw_write(agent.fd(), std::string(internal::kChannelHeaderBytes, 'x'));
  std::string why = seen.closed.get_future().get();  // a second on_close would throw here
  EXPECT_NE(why.find("bad frame magic"), std::string::npos) << why;
  EXPECT_FALSE((*client)->open());
  EXPECT_FALSE((*client)->send(2, rank_info_call(workers_[0].actor.id())).ok());
  EXPECT_EQ(read_until_closed(agent.fd()), "");  // the driver closed its end
}

}  // namespace
}  // namespace tessera::runtime
