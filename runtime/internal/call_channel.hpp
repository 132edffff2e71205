// call_channel.hpp: calls from a driver to an agent's workers outside CAF (private to runtime/).
//
// Note [Call channel]
// A call through CAF to an agent costs BASP's hops on both sides: the sender's multiplexer is
// woken through a pipe, the receiver's multiplexer wakes on epoll and then schedules the
// receiving actor, and the reply does the same backwards (deps-verified.md §1: a bare CAF
// request round trip is ~180-360 us on these machines, above the whole call's budget). So each
// driver opens one TCP connection per agent, beside CAF, that carries calls and their answers
// and nothing else:
//   * the caller's thread writes the call frame itself (one send(), no thread hop);
//   * the agent's reader thread for that connection, blocked in recv(), wakes once, resolves
//     the target workers in the agent's table and hands the calls to them (Note [Local lanes]:
//     no system call when they are polling);
//   * the worker thread that answers last writes the reply frame (Note [Call paths]);
//   * the driver's reader thread completes the CallBatch.
// Both readers poll (yielding, as Note [Local lanes]) for RuntimeConfig::idle_poll after the
// last thing that happened on their connection (a frame read, a frame written) before they
// sleep in recv(): a sender that finds its reader awake skips the wake-up that a blocked
// reader costs it inside send() (most of a loopback round trip on a virtual machine).
// Same host (Note [Local call socket]): the agent also listens on an abstract Unix socket, and
// a driver on the same machine connects there instead of to the TCP port.
// Everything else stays on CAF: spawning, monitoring (a dead agent or worker still fails its
// calls through down_msg, Note [Call paths]), releases, heartbeats. Deadlines and late answers
// are the CallHub's, shared by both paths (Note [Late replies]).
//
// Authentication: the channel is offered only to a driver that authenticated over CAF (Note
// [Agent authentication]): the agent answers auth_atom with a per-driver session id and a fresh
// 32-byte session key (AgentInfo::call_session / call_key). On connecting, the agent sends a
// 32-byte nonce; the driver answers with its session id and HMAC(key, "tessera-call|" nonce);
// the agent checks it in constant time and answers "TCOK", or closes the connection (logged).
// The key never crosses the channel. After that, frames are not authenticated one by one: the
// channel has the integrity of plain-TCP CAF. So an agent with TLS does not offer it (a driver
// with TLS does not use it) and calls stay on the encrypted CAF connection.
//
// Frames (little endian): header 24 bytes "TCF1" | kind u8 | 0 u8 | 0 u16 | call id u64 |
// body bytes u64, then the body: a ChannelCall (kind call) or an AgentCallReply (kind reply)
// in CAF's binary format (runtime/internal/call_frame.hpp parses and writes them without a
// socket). Bad magic, an unknown kind, a body over DataPlaneConfig::max_frame_bytes or one that
// does not decode closes that connection with a logged error; the agent keeps serving everyone
// else, and the driver fails the agent's pending calls and goes back to CAF for it.
//
// Note [Local call socket]
// A loopback TCP send() runs the receiving side's TCP stack in the sender's system call: 12-14
// us for a ~1 KB call frame on these 2-vCPU machines, against ~4 us for a Unix stream socket
// (polling ping-pong of 1 KB frames between two threads: 18-19 us over TCP, 9-10 us over a Unix
// socket). A 2-agent call makes four such sends, two of them on the caller's thread. So the
// agent binds the abstract Unix socket channel_local_socket(its pid, its TCP port) beside the
// TCP port, and a driver whose machine_id() equals the agent's host_id (AgentInfo) connects
// there first. Abstract names live in the network namespace: an agent in another container has
// no such name here, the connect fails, and the driver uses TCP (so does a local socket whose
// handshake fails). The handshake, frames and everything above them are the same on both.
// RuntimeConfig::data_plane.shared_memory = false turns this off along with the data plane's
// shared memory (both are the same-host shortcut).
//
// Thread-safety: ChannelClient::send from any thread; ChannelServer's methods from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "proto/status.hpp"
#include "runtime/config.hpp"
#include "runtime/internal/call_frame.hpp"
#include "runtime/messages.hpp"

namespace tessera::runtime::internal {

/// Where a driver reaches an agent's call channel.
struct ChannelAddress {
  std::string host;
  uint16_t port = 0;
  /// Note [Local call socket]: the agent's abstract Unix socket name (without the leading NUL),
  /// tried before host:port. Empty: TCP only.
  std::string local_socket;
};

/// Note [Local call socket]: the abstract socket name of the channel of agent process `pid`
/// whose TCP port is `port`.
std::string channel_local_socket(int64_t pid, uint16_t port);
/// A blocking stream connection to the abstract Unix socket `name` (without the leading NUL);
/// errors name the socket.
Result<int> connect_local(const std::string& name);
/// A listening TCP socket on host:port (port 0: any free one, written back to `port`).
Result<int> listen_tcp(const std::string& host, uint16_t& port);

/// The driver's proof for `nonce` under a session key.
std::string channel_proof(const std::string& key, const std::string& nonce);

/// The answers of a completed fan-out, in target order (both call paths build them).
AgentCallReply agent_reply(std::vector<Result<WireValue>> results);
/// An agent call refused as a whole: each of its `n` targets gets `st`.
AgentCallReply agent_refusal(size_t n, const Status& st);

/// Note [Call paths] on an agent (both call paths): requests[i] goes to the hosted worker
/// targets[i] as a LocalCall; a null target (not hosted for this driver) fails with an error
/// naming `agent_host`. `answer` runs once, on the thread of the last outcome, with the reply.
/// REQUIRES: targets, labels and requests have the same size.
void fan_out(std::vector<caf::actor> targets, std::vector<std::string> labels,
             std::vector<CallRequest> requests, const std::string& agent_host,
             std::function<void(AgentCallReply)> answer);

/// The driver's end of one agent's channel.
class ChannelClient {
 public:
  using OnReply = std::function<void(uint64_t id, AgentCallReply& reply)>;
  /// Called once, from the reader thread, when the connection ends for any reason but close().
  using OnClose = std::function<void(const std::string& why)>;

  /// Connects to `address` (its local socket first, if any; then host:port), authenticates
  /// with `session`/`key` within `timeout`, and starts the reader thread. `agent` names the
  /// agent in logs and errors (its cluster.agents entry). Errors name the channel's TCP
  /// address and the step that failed.
  static Result<std::unique_ptr<ChannelClient>> connect(caf::actor_system& system,
                                                        const std::string& agent,
                                                        const ChannelAddress& address,
                                                        uint64_t session, const std::string& key,
                                                        Millis timeout, uint64_t max_frame_bytes,
                                                        std::chrono::microseconds idle_poll,
                                                        OnReply on_reply, OnClose on_close);
  ~ChannelClient();  ///< close().
  ChannelClient(const ChannelClient&) = delete;
  ChannelClient& operator=(const ChannelClient&) = delete;

  /// Writes one call frame. Error (unavailable) if the channel is closed or the write failed
  /// (the channel is then closed: the stream can no longer be trusted).
  Status send(uint64_t id, const ChannelCall& call);
  /// False once the connection ended.
  bool open() const { return open_.load(std::memory_order_acquire); }
  /// Ends the connection and joins the reader (on_close is not called). Idempotent.
  void close();
  /// The agent's name given to connect().
  const std::string& agent() const { return agent_; }
  /// True when connected through the agent's local socket (Note [Local call socket]).
  bool local() const { return local_; }

 private:
  ChannelClient() = default;
  void read_loop();

  caf::actor_system* system_ = nullptr;
  std::string agent_;
  int fd_ = -1;
  bool local_ = false;
  uint64_t max_frame_bytes_ = 0;
  std::chrono::microseconds idle_poll_{0};
  std::atomic<int64_t> last_activity_{0};  // steady clock, ns: last send or reply
  OnReply on_reply_;
  OnClose on_close_;
  std::mutex write_mutex_;
  std::atomic<bool> open_{false};
  std::atomic<bool> closing_{false};
  // close() may run on several threads at once (the hub on an agent's death, the owner's
  // destructor, a reply callback on the reader): one of them joins or detaches reader_.
  std::mutex close_mutex_;
  std::atomic<std::thread::id> reader_id_{};  // set by the reader thread as it starts
  std::thread reader_;
};

/// The agent's channel listener (Note [Call channel]).
class ChannelServer {
 public:
  /// A worker the agent hosts: how to call it and for whom.
  struct Hosted {
    caf::actor actor;
    WorkerContext context;
    std::string owner;  ///< Node id of the driver that spawned it.
  };

  /// Binds host:port (port 0: any free one) and channel_local_socket(getpid(), the port) (Note
  /// [Local call socket]; if that name is taken, a warning and TCP only) and starts accepting.
  /// Errors name the address.
  static Result<std::unique_ptr<ChannelServer>> start(caf::actor_system& system,
                                                      const std::string& host, uint16_t port,
                                                      const std::string& agent_host,
                                                      uint64_t max_frame_bytes,
                                                      std::chrono::microseconds idle_poll);
  ~ChannelServer();  ///< stop().

  uint16_t port() const { return port_; }
  /// The local socket's name, empty when it could not be bound.
  const std::string& local_socket() const { return local_name_; }
  /// Opens a session for the driver on `node` (replacing its previous one and closing that
  /// session's connections); returns (session id, key).
  Result<std::pair<uint64_t, std::string>> open_session(const std::string& node);
  /// Ends `node`'s session and closes its connections.
  void end_session(const std::string& node);
  /// The hosted-worker table (kept by the agent actor).
  void add_worker(Hosted worker);
  void remove_worker(caf::actor_id id);
  /// Stops accepting, closes every connection, joins every thread and drops the table.
  void stop();
  /// Connections refused or closed for a bad handshake or frame (tests).
  uint64_t bad_connections() const { return bad_connections_.load(); }

 private:
  struct Connection;
  struct Session {
    uint64_t id = 0;
    std::string key;
    std::string node;
  };
  ChannelServer() = default;
  void accept_loop(int listen_fd);
  void serve(std::shared_ptr<Connection> conn);
  Status handshake(Connection& conn);
  void dispatch(const std::shared_ptr<Connection>& conn, uint64_t id, ChannelCall& call);
  void reap_finished();  // REQUIRES: mutex_ held

  caf::actor_system* system_ = nullptr;
  std::string agent_host_;
  uint64_t max_frame_bytes_ = 0;
  std::chrono::microseconds idle_poll_{0};
  int listen_fd_ = -1;
  int local_fd_ = -1;  // the local socket's listener
  std::string local_name_;
  uint16_t port_ = 0;
  std::thread acceptor_;
  std::thread local_acceptor_;
  std::mutex mutex_;
  bool stopped_ = false;
  std::unordered_map<uint64_t, Session> sessions_;  // by id
  std::unordered_map<caf::actor_id, Hosted> workers_;
  std::vector<std::shared_ptr<Connection>> connections_;
  std::atomic<uint64_t> bad_connections_{0};
};

}  // namespace tessera::runtime::internal
