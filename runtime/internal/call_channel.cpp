// call_channel.cpp: Note [Call channel].
#include "runtime/internal/call_channel.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "runtime/auth.hpp"
#include "runtime/call_hub.hpp"
#include "runtime/errors.hpp"
#include "runtime/local_lane.hpp"

namespace tessera::runtime::internal {
namespace {

// ---- socket helpers (blocking descriptors; Asio's objects are not safe for one thread reading
// while another writes, so the channel does its I/O on the raw descriptor) --------------------

Status write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      int e = errno;
      return make_error(e == EAGAIN || e == EWOULDBLOCK ? ErrorCode::timeout : ErrorCode::unavailable,
                        "write failed: {}", k == 0 ? "connection closed" : std::strerror(e));
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return Status();
}

// Error "connection closed" on a clean end before the first byte (callers say what was cut).
Status read_exact(int fd, char* p, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t k = ::recv(fd, p + got, n - got, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k == 0) {
      return make_error(ErrorCode::unavailable, got == 0 ? "connection closed"
                                                          : "connection closed mid-frame");
    }
    if (k < 0) {
      int e = errno;
      return make_error(e == EAGAIN || e == EWOULDBLOCK ? ErrorCode::timeout : ErrorCode::unavailable,
                        "read failed: {}", std::strerror(e));
    }
    got += static_cast<size_t>(k);
  }
  return Status();
}

void set_timeout(int fd, int option, Millis t) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(t.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((t.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, option, &tv, sizeof tv);
}

void set_no_delay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

template <class T>
void put_le(char* p, T v) { std::memcpy(p, &v, sizeof v); }
template <class T>
T get_le(const char* p) { T v; std::memcpy(&v, p, sizeof v); return v; }

// Reads one frame of `kind`; a bad header or body is corrupt_data naming what is wrong.
template <class T>
Status read_frame(caf::actor_system& sys, int fd, FrameKind kind, uint64_t max_body,
                  uint64_t& id, T& body) {
  char header[kChannelHeaderBytes];
  TESSERA_RETURN_IF_ERROR(read_exact(fd, header, sizeof header));
  TESSERA_ASSIGN_OR_RETURN(FrameHeader h, parse_frame_header(header, kind, max_body));
  id = h.id;
  uint64_t bytes = h.body_bytes;
  // Grown as bytes arrive: a header that lies about its size costs no more memory than the
  // bytes actually sent (plus one step).
  constexpr uint64_t kStep = uint64_t{16} << 20;
  std::vector<char> buf;
  try {
    for (uint64_t got = 0; got < bytes;) {
      uint64_t step = std::min(bytes - got, kStep);
      buf.resize(got + step);
      Status st = read_exact(fd, buf.data() + got, step);
      if (!st.ok()) {
        return make_error(ErrorCode::corrupt_data, "truncated frame: {}", st.message());
      }
      got += step;
    }
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::corrupt_data, "frame body of {} bytes: out of memory", bytes);
  }
  return decode_frame_body(sys, buf.data(), buf.size(), body);
}

// Connects to host:port within `timeout` (non-blocking connect + poll), then blocking again.
Result<int> connect_tcp(const std::string& host, uint16_t port, Millis timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) return make_error(ErrorCode::unavailable, "cannot resolve: {}", gai_strerror(rc));
  std::string last = "no address";
  int fd = -1;
  for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last = std::strerror(errno);
      continue;
    }
    int err = 0;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        socklen_t len = sizeof err;
        if (::poll(&p, 1, static_cast<int>(timeout.count())) == 1) {
          ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        } else {
          err = ETIMEDOUT;
        }
      }
    }
    if (err != 0) {
      last = std::strerror(err);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd < 0) return make_error(ErrorCode::unavailable, "cannot connect: {}", last);
  int flags = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  set_no_delay(fd);
  return fd;
}

// Binds and listens on host:port; the bound port comes back in `port`.
// Note [Local call socket]: the abstract address of `name` (a leading NUL, no file).
socklen_t local_address(const std::string& name, sockaddr_un& addr) {
  addr = sockaddr_un{};
  addr.sun_family = AF_UNIX;
  size_t n = std::min(name.size(), sizeof addr.sun_path - 1);
  std::memcpy(addr.sun_path + 1, name.data(), n);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

Result<int> listen_local(const std::string& name) {
  sockaddr_un addr;
  socklen_t len = local_address(name, addr);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::listen(fd, 64) != 0) {
    int err = errno;
    if (fd >= 0) ::close(fd);
    return make_error(ErrorCode::unavailable, "cannot listen on local socket {}: {}", name,
                      std::strerror(err));
  }
  return fd;
}

// Note [Call channel], polling: returns once `fd` has bytes to read (or an end or error), or
// once `last_activity` is older than `idle_poll`; consumes nothing. The caller then blocks.
void poll_readable(int fd, const std::atomic<int64_t>& last_activity,
                   std::chrono::microseconds idle_poll) {
  const int64_t window = std::chrono::duration_cast<std::chrono::nanoseconds>(idle_poll).count();
  if (window <= 0 || !polling_allowed()) return;
  char byte;
  while (steady_now_ns() - last_activity.load(std::memory_order_relaxed) < window) {
    ssize_t k = ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (k >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return;
    if (!poll_yield()) return;  // Note [Polling under contention]
  }
}

std::string peer_name(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  if (ss.ss_family == AF_UNIX) {
    ucred cred{};
    socklen_t clen = sizeof cred;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0) return "local socket";
    return fmt::format("local socket (pid {})", cred.pid);
  }
  char host[NI_MAXHOST];
  char serv[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, serv, sizeof serv,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "?";
  }
  return fmt::format("{}:{}", host, serv);
}

}  // namespace

Result<int> listen_tcp(const std::string& host, uint16_t& port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) return make_error(ErrorCode::invalid_argument, "cannot resolve: {}", gai_strerror(rc));
  int fd = ::socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, res->ai_protocol);
  int one = 1;
  if (fd >= 0) ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  bool ok = fd >= 0 && ::bind(fd, res->ai_addr, res->ai_addrlen) == 0 && ::listen(fd, 64) == 0;
  int err = errno;
  ::freeaddrinfo(res);
  if (!ok) {
    if (fd >= 0) ::close(fd);
    return make_error(ErrorCode::unavailable, "cannot listen: {}", std::strerror(err));
  }
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return fd;
}

Result<int> connect_local(const std::string& name) {
  sockaddr_un addr;
  socklen_t len = local_address(name, addr);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    int err = errno;
    if (fd >= 0) ::close(fd);
    return make_error(ErrorCode::unavailable, "cannot connect to local socket {}: {}", name,
                      std::strerror(err));
  }
  return fd;
}

std::string channel_local_socket(int64_t pid, uint16_t port) {
  return fmt::format("tessera-call-{}-{}", pid, port);
}

std::string channel_proof(const std::string& key, const std::string& nonce) {
  return hmac_sha256(key, "tessera-call|" + nonce);
}

AgentCallReply agent_reply(std::vector<Result<WireValue>> results) {
  AgentCallReply reply;
  for (auto& r : results) {
    reply.codes.push_back(static_cast<uint8_t>(r.status().code()));
    reply.messages.push_back(r.ok() ? std::string() : r.status().message());
    reply.results.push_back(r.ok() ? std::move(r).value() : WireValue{});
  }
  return reply;
}

AgentCallReply agent_refusal(size_t n, const Status& st) {
  AgentCallReply reply;
  reply.codes.assign(n, static_cast<uint8_t>(st.code()));
  reply.messages.assign(n, st.message());
  reply.results.resize(n);
  return reply;
}

// The batch is owned by its own completion callback until then (its slots hold it weakly).
void fan_out(std::vector<caf::actor> targets, std::vector<std::string> labels,
             std::vector<CallRequest> requests, const std::string& agent_host,
             std::function<void(AgentCallReply)> answer) {
  auto batch = std::make_shared<CallBatch>(CallLabels(std::move(labels)),
                                           std::chrono::steady_clock::time_point::max());
  std::optional<size_t> missing;
  for (size_t i = 0; i < targets.size(); ++i) {
    if (targets[i]) {
      send_local_call(targets[i], std::move(requests[i]), true, batch, i);
    } else {
      // The driver prefixes its own label (rank, host, method) to this.
      batch->set(i, make_error(ErrorCode::unavailable, "the worker is not hosted by the agent on "
                               "{} for this driver (it terminated, or never ran there)",
                               agent_host), /*fail_fast=*/false);
      if (!missing) missing = i;
    }
  }
  if (missing) batch->cancel_unanswered(*missing);  // Note [Failing fast]
  batch->on_complete([answer = std::move(answer), batch] { answer(agent_reply(batch->wait())); });
}

// ---- driver side -----------------------------------------------------------------------------

namespace {

// The driver's half of the handshake on a connected descriptor (closed on failure).
Status client_handshake(int fd, uint64_t session, const std::string& key, Millis timeout) {
  set_timeout(fd, SO_RCVTIMEO, timeout);
  set_timeout(fd, SO_SNDTIMEO, timeout);  // stays: a write never blocks past it
  std::string nonce(kChannelNonceBytes, '\0');
  Status st = read_exact(fd, nonce.data(), nonce.size());
  char hello[kChannelHelloBytes];
  if (st.ok()) {
    put_le(hello, session);
    std::string proof = channel_proof(key, nonce);
    std::memcpy(hello + 8, proof.data(), 32);
    st = write_all(fd, hello, sizeof hello);
  }
  char ok[4];
  if (st.ok()) st = read_exact(fd, ok, sizeof ok);
  if (st.ok() && get_le<uint32_t>(ok) != kChannelOkMagic) {
    st = make_error(ErrorCode::permission_denied, "the agent refused the session");
  }
  if (!st.ok()) {
    ::close(fd);
    return st;
  }
  set_timeout(fd, SO_RCVTIMEO, Millis(0));  // the reader waits as long as the channel lives
  return Status();
}

}  // namespace

Result<std::unique_ptr<ChannelClient>> ChannelClient::connect(
    caf::actor_system& system, const std::string& agent, const ChannelAddress& address,
    uint64_t session, const std::string& key, Millis timeout, uint64_t max_frame_bytes,
    std::chrono::microseconds idle_poll, OnReply on_reply, OnClose on_close) {
  std::unique_ptr<ChannelClient> c(new ChannelClient());
  c->system_ = &system;
  c->agent_ = agent;
  std::string tcp = fmt::format("{}:{}", address.host, address.port);
  c->max_frame_bytes_ = max_frame_bytes;
  c->idle_poll_ = idle_poll;
  c->on_reply_ = std::move(on_reply);
  c->on_close_ = std::move(on_close);
  // Note [Local call socket]: no local socket (another network namespace) or one that fails
  // the handshake (not that agent) leaves TCP.
  if (!address.local_socket.empty()) {
    Result<int> fd = connect_local(address.local_socket);
    Status st = fd.ok() ? client_handshake(*fd, session, key, timeout) : fd.status();
    if (st.ok()) {
      c->fd_ = *fd;
      c->local_ = true;
    } else {
      spdlog::debug("call channel of agent {}: {}; using TCP {}", agent, st.message(), tcp);
    }
  }
  if (c->fd_ < 0) {
    Result<int> fd = connect_tcp(address.host, address.port, timeout);
    if (!fd.ok()) return fd.status().with_context("call channel " + tcp);
    Status st = client_handshake(*fd, session, key, timeout);
    if (!st.ok()) return st.with_context("call channel " + tcp + ": handshake");
    c->fd_ = *fd;
  }
  c->open_ = true;
  c->reader_ = std::thread([raw = c.get()] { raw->read_loop(); });
  return c;
}

ChannelClient::~ChannelClient() { close(); }

// Two threads must never join (or join and detach) reader_ at once: the second would wait on
// the exited thread's freed descriptor forever (seen when the hub closed a dead agent's channel
// while the runtime's destructor closed it too). close_mutex_ orders them; the reader itself
// only try-locks it, since whoever holds it may be joining the reader.
void ChannelClient::close() {
  closing_ = true;
  open_ = false;
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
  std::unique_lock<std::mutex> closing(close_mutex_, std::defer_lock);
  if (reader_id_.load() == std::this_thread::get_id()) {
    // Closed from a reply callback: the loop ends on its own. If another thread holds the
    // lock, it is joining this thread and finishes the close.
    if (!closing.try_lock()) return;
    if (reader_.joinable()) reader_.detach();
  } else {
    closing.lock();
    if (reader_.joinable()) reader_.join();
  }
  std::lock_guard<std::mutex> lock(write_mutex_);
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

Status ChannelClient::send(uint64_t id, const ChannelCall& call) {
  TESSERA_ASSIGN_OR_RETURN(std::vector<char> frame,
                           encode_frame(*system_, id, call));
  std::lock_guard<std::mutex> lock(write_mutex_);
  if (!open()) return make_error(ErrorCode::unavailable, "the call channel is closed");
  last_activity_.store(steady_now_ns(), std::memory_order_relaxed);  // the reader stays awake for it
  Status st = write_all(fd_, frame.data(), frame.size());
  if (!st.ok()) {
    // A partial write leaves the stream unusable: end it (the reader then reports the close).
    open_ = false;
    ::shutdown(fd_, SHUT_RDWR);
  }
  return st;
}

void ChannelClient::read_loop() {
  reader_id_.store(std::this_thread::get_id());
  Status st;
  while (true) {
    uint64_t id = 0;
    AgentCallReply reply;
    poll_readable(fd_, last_activity_, idle_poll_);
    st = read_frame(*system_, fd_, FrameKind::reply, max_frame_bytes_, id, reply);
    if (!st.ok()) break;
    last_activity_.store(steady_now_ns(), std::memory_order_relaxed);
    on_reply_(id, reply);
  }
  open_ = false;
  if (closing_) return;
  ::shutdown(fd_, SHUT_RDWR);
  if (st.code() == ErrorCode::corrupt_data) {
    spdlog::error("call channel of agent {}: {}; closing it", agent_, st.message());
  }
  on_close_(st.message());
}

// ---- agent side ------------------------------------------------------------------------------

struct ChannelServer::Connection {
  int fd = -1;
  std::string peer;
  std::string node;  // the driver's node, once authenticated
  std::mutex write_mutex;
  std::thread thread;
  std::atomic<bool> done{false};
  std::atomic<int64_t> last_activity{0};  // steady clock, ns: last frame read or written
  ~Connection() {
    if (fd >= 0) ::close(fd);
  }
  Status write(const std::vector<char>& frame) {
    std::lock_guard<std::mutex> lock(write_mutex);
    last_activity.store(steady_now_ns(), std::memory_order_relaxed);
    return write_all(fd, frame.data(), frame.size());
  }
};

Result<std::unique_ptr<ChannelServer>> ChannelServer::start(caf::actor_system& system,
                                                            const std::string& host,
                                                            uint16_t port,
                                                            const std::string& agent_host,
                                                            uint64_t max_frame_bytes,
                                                            std::chrono::microseconds idle_poll) {
  std::unique_ptr<ChannelServer> s(new ChannelServer());
  s->system_ = &system;
  s->agent_host_ = agent_host;
  s->max_frame_bytes_ = max_frame_bytes;
  s->idle_poll_ = idle_poll;
  s->port_ = port;
  Result<int> fd = listen_tcp(host, s->port_);
  if (!fd.ok()) return fd.status().with_context(fmt::format("call channel on {}:{}", host, port));
  s->listen_fd_ = *fd;
  std::string local = channel_local_socket(::getpid(), s->port_);
  Result<int> local_fd = listen_local(local);
  if (local_fd.ok()) {
    s->local_fd_ = *local_fd;
    s->local_name_ = local;
    s->local_acceptor_ = std::thread([raw = s.get()] { raw->accept_loop(raw->local_fd_); });
  } else {
    spdlog::warn("call channel: {}; same-host drivers use TCP", local_fd.status().message());
  }
  s->acceptor_ = std::thread([raw = s.get()] { raw->accept_loop(raw->listen_fd_); });
  return s;
}

ChannelServer::~ChannelServer() { stop(); }

void ChannelServer::stop() {
  std::vector<std::shared_ptr<Connection>> connections;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopped_) return;
    stopped_ = true;
    for (int fd : {listen_fd_, local_fd_}) {
      if (fd >= 0) ::shutdown(fd, SHUT_RDWR);  // wakes accept()
    }
    connections.swap(connections_);
    for (auto& c : connections) ::shutdown(c->fd, SHUT_RDWR);
  }
  for (std::thread* t : {&acceptor_, &local_acceptor_}) {
    if (t->joinable()) t->join();
  }
  for (int* fd : {&listen_fd_, &local_fd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
  for (auto& c : connections) {
    if (c->thread.joinable()) c->thread.join();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  workers_.clear();
  sessions_.clear();
}

Result<std::pair<uint64_t, std::string>> ChannelServer::open_session(const std::string& node) {
  TESSERA_ASSIGN_OR_RETURN(std::string key, random_bytes(32));
  TESSERA_ASSIGN_OR_RETURN(std::string id_bytes, random_bytes(8));
  uint64_t id = get_le<uint64_t>(id_bytes.data());
  std::lock_guard<std::mutex> lock(mutex_);
  sessions_[id] = Session{id, key, node};
  return std::make_pair(id, key);
}

void ChannelServer::end_session(const std::string& node) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    it = it->second.node == node ? sessions_.erase(it) : std::next(it);
  }
  for (auto& c : connections_) {
    if (c->node == node) ::shutdown(c->fd, SHUT_RDWR);
  }
}

void ChannelServer::add_worker(Hosted worker) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopped_) return;
  caf::actor_id id = worker.actor.id();
  workers_[id] = std::move(worker);
}

void ChannelServer::remove_worker(caf::actor_id id) {
  std::lock_guard<std::mutex> lock(mutex_);
  workers_.erase(id);
}

void ChannelServer::reap_finished() {
  for (auto it = connections_.begin(); it != connections_.end();) {
    if (!(*it)->done) {
      ++it;
      continue;
    }
    if ((*it)->thread.joinable()) (*it)->thread.join();
    it = connections_.erase(it);
  }
}

void ChannelServer::accept_loop(int listen_fd) {
  while (true) {
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopped_) {
      if (fd >= 0) ::close(fd);
      return;
    }
    if (fd < 0) {
      if (errno != EINTR && errno != ECONNABORTED) {
        spdlog::error("call channel: accept failed: {}", std::strerror(errno));
      }
      continue;
    }
    reap_finished();
    if (listen_fd == listen_fd_) set_no_delay(fd);
    auto conn = std::make_shared<Connection>();
    conn->fd = fd;
    conn->peer = peer_name(fd);
    connections_.push_back(conn);
    conn->thread = std::thread([this, conn] { serve(conn); });
  }
}

Status ChannelServer::handshake(Connection& conn) {
  set_timeout(conn.fd, SO_RCVTIMEO, Millis(10000));  // a silent peer does not keep a thread
  set_timeout(conn.fd, SO_SNDTIMEO, Millis(10000));
  TESSERA_ASSIGN_OR_RETURN(std::string nonce, random_bytes(kChannelNonceBytes));
  TESSERA_RETURN_IF_ERROR(write_all(conn.fd, nonce.data(), nonce.size()));
  char hello[kChannelHelloBytes];
  TESSERA_RETURN_IF_ERROR(read_exact(conn.fd, hello, sizeof hello));
  uint64_t session = get_le<uint64_t>(hello);
  std::string proof(hello + 8, 32);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto s = sessions_.find(session);
    if (s == sessions_.end() || !constant_time_equal(proof, channel_proof(s->second.key, nonce))) {
      return make_error(ErrorCode::permission_denied, "no session with that id and key");
    }
    conn.node = s->second.node;
  }
  char ok[4];
  put_le(ok, kChannelOkMagic);
  TESSERA_RETURN_IF_ERROR(write_all(conn.fd, ok, sizeof ok));
  set_timeout(conn.fd, SO_RCVTIMEO, Millis(0));
  return Status();
}

void ChannelServer::serve(std::shared_ptr<Connection> conn) {
  Status st = handshake(*conn);
  if (!st.ok()) {
    bad_connections_++;
    spdlog::warn("call channel: refused {}: {}", conn->peer, st.message());
  }
  while (st.ok()) {
    uint64_t id = 0;
    ChannelCall call;
    poll_readable(conn->fd, conn->last_activity, idle_poll_);
    st = read_frame(*system_, conn->fd, FrameKind::call, max_frame_bytes_, id, call);
    if (st.ok()) {
      conn->last_activity.store(steady_now_ns(), std::memory_order_relaxed);
      dispatch(conn, id, call);
    } else if (st.code() == ErrorCode::corrupt_data) {
      bad_connections_++;
      spdlog::error("call channel: {}: {}; closing that connection", conn->peer, st.message());
    }
  }
  ::shutdown(conn->fd, SHUT_RDWR);  // answers still running find it closed
  conn->done = true;
}

// Note [Call paths] on the agent: the calls of one frame become LocalCalls (fan_out); the
// thread of the last answer writes the reply frame.
void ChannelServer::dispatch(const std::shared_ptr<Connection>& conn, uint64_t id,
                             ChannelCall& call) {
  size_t n = call.requests.size();
  caf::actor_system& sys = *system_;
  auto answer = [&sys, conn, id](AgentCallReply reply) {
    Result<std::vector<char>> frame = encode_frame(sys, id, reply);
    Status st = frame.ok() ? conn->write(*frame) : frame.status();
    if (!st.ok()) spdlog::warn("call channel: {}: answer to call {} lost: {}", conn->peer, id, st.message());
  };
  if (call.workers.size() != n) {
    return answer(agent_refusal(n, make_error(ErrorCode::invalid_argument, "agent on {}: call "
                                              "with {} workers and {} requests", agent_host_,
                                              call.workers.size(), n)));
  }
  std::vector<caf::actor> targets(n);
  std::vector<std::string> labels(n);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < n; ++i) {
      auto w = workers_.find(call.workers[i]);
      if (w == workers_.end() || w->second.owner != conn->node) {
        labels[i] = "a worker not hosted here";
        continue;
      }
      targets[i] = w->second.actor;
      labels[i] = call_label(w->second.context, call.requests[i].method);
    }
  }
  fan_out(std::move(targets), std::move(labels), std::move(call.requests), agent_host_,
          std::move(answer));
}

}  // namespace tessera::runtime::internal
