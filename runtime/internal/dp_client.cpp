// dp_client.cpp: fetches (Note [Data plane protocol], Note [Landing segments]).
#include "runtime/internal/dp_client.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <functional>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <fmt/format.h>

#include "proto/codec.hpp"
#include "runtime/internal/dp_protocol.hpp"
#include "runtime/internal/dp_server.hpp"
#include "runtime/internal/shm.hpp"

namespace tessera::runtime::internal {
namespace asio = boost::asio;
using boost::system::error_code;
using tcp = asio::ip::tcp;
using unix_socket = asio::local::stream_protocol::socket;

ConnectionPool::~ConnectionPool() {
  for (auto& [key, fd] : idle_) ::close(fd);
}

int ConnectionPool::take(const std::string& endpoint) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = idle_.find(endpoint);
  if (it == idle_.end()) return -1;
  int fd = it->second;
  idle_.erase(it);
  return fd;
}

void ConnectionPool::put(const std::string& endpoint, int fd) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (idle_.count(endpoint) >= 16) {
    ::close(fd);
    return;
  }
  idle_.emplace(endpoint, fd);
}

namespace {

asio::io_context& thread_io() {
  thread_local asio::io_context io;
  return io;
}

/// What one exchange produced: a status and, for a fetched frame, the bytes.
using Done = std::function<void(Status, std::shared_ptr<proto::Buffer>)>;

// One request/response exchange on one connection (TCP or Unix).
template <class Socket>
class Exchange : public std::enable_shared_from_this<Exchange<Socket>> {
 public:
  Exchange(Socket socket, std::string endpoint, std::string peer, const Request& request,
           DataPlaneClient& client, Done done)
      : socket_(std::move(socket)), endpoint_(std::move(endpoint)), peer_(std::move(peer)),
        client_(client), done_(std::move(done)) {
    write_request(request, request_.data());
  }

  void start() {
    auto self = this->shared_from_this();
    asio::async_write(socket_, asio::buffer(request_), [self](error_code ec, size_t) {
      if (ec) return self->fail("sending the request", ec);
      self->read_header();
    });
  }

  void cancel() {
    error_code ignored;
    socket_.close(ignored);
  }

 private:
  void read_header() {
    auto self = this->shared_from_this();
    if constexpr (std::is_same_v<Socket, unix_socket>) {
      socket_.async_wait(Socket::wait_read, [self](error_code ec) {
        if (ec) return self->fail("waiting for the response", ec);
        self->recv_header_with_fd();
      });
    } else {
      asio::async_read(socket_, asio::buffer(response_), [self](error_code ec, size_t) {
        if (ec) return self->fail("reading the response", ec);
        self->on_header();
      });
    }
  }

  // Unix sockets: read with recvmsg, so that a descriptor a peer attaches is received and
  // closed instead of leaking (the protocol sends none to the receiver).
  void recv_header_with_fd() {
    int fd = -1;
    Result<size_t> n = recv_some_with_fd(socket_.native_handle(), response_.data() + got_,
                                         response_.size() - got_, &fd);
    if (fd >= 0) ::close(fd);
    if (!n.ok()) return fail("reading the response", asio::error::eof);
    got_ += *n;
    if (got_ < response_.size()) return read_header();
    on_header();
  }

  void on_header() {
    Result<ResponseHeader> h = read_response(response_.data(), client_.config().max_frame_bytes);
    if (!h.ok()) return finish(h.status().with_context("data plane " + peer_), nullptr, false);
    header_ = *h;
    if (header_.status != ErrorCode::ok) return read_error_body();
    if (header_.transport == Transport::landing_needed) return send_landing();
    if (header_.transport == Transport::shm) return landed();
    if (header_.body_bytes == 0) return finish(Status(), nullptr, true);
    Result<std::shared_ptr<proto::Buffer>> buf = proto::Buffer::allocate(header_.body_bytes);
    if (!buf.ok()) return finish(buf.status(), nullptr, false);
    body_ = *buf;
    auto self = this->shared_from_this();
    asio::async_read(socket_, asio::buffer(body_->data(), body_->size()),
                     [self](error_code ec, size_t) {
                       if (ec) return self->fail("reading the frame", ec);
                       self->client_.counters().fetched_remote_bytes += self->body_->size();
                       self->finish(Status(), self->body_, true);
                     });
  }

  // Note [Landing segments]: lend the owner one of our segments for this frame.
  void send_landing() {
    if constexpr (!std::is_same_v<Socket, unix_socket>) {
      return finish(make_error(ErrorCode::corrupt_data, "data plane {}: a landing request on "
                               "TCP", peer_), nullptr, false);
    } else {
      if (landing_.buffer) {
        return finish(make_error(ErrorCode::corrupt_data, "data plane {}: a second landing "
                                 "request for one fetch", peer_), nullptr, false);
      }
      Result<Landing> landing = client_.landings().acquire(header_.body_bytes);
      if (!landing.ok()) return finish(landing.status(), nullptr, false);
      landing_ = *landing;
      std::array<uint8_t, kLandingBytes> msg{};
      detail::put(msg.data(), 0, kLandingMagic);
      detail::put(msg.data(), 8, header_.body_bytes);
      Status st = send_with_fd(socket_.native_handle(), msg.data(), msg.size(), landing_.fd,
                               static_cast<int>(client_.config().io_timeout.count()));
      if (!st.ok()) return finish(st.with_context("data plane " + peer_), nullptr, false);
      got_ = 0;
      read_header();
    }
  }

  void landed() {
    if (!landing_.buffer || landing_.buffer->size() != header_.body_bytes) {
      return finish(make_error(ErrorCode::corrupt_data, "data plane {}: a shared-memory answer "
                               "without a matching landing segment", peer_), nullptr, false);
    }
    client_.counters().fetched_remote_bytes += header_.body_bytes;
    std::shared_ptr<proto::Buffer> body = std::move(landing_.buffer);
    finish(Status(), std::move(body), true);
  }

  void read_error_body() {
    message_.resize(header_.body_bytes);
    auto self = this->shared_from_this();
    asio::async_read(socket_, asio::buffer(message_), [self](error_code ec, size_t) {
      if (ec) return self->fail("reading the error", ec);
      self->finish(Status(self->header_.status, self->message_ + " (at data plane " +
                                                    self->peer_ + ")"),
                   nullptr, true);
    });
  }

  void fail(const char* what, error_code ec) {
    ErrorCode code = ec == asio::error::operation_aborted || ec == asio::error::bad_descriptor
                         ? ErrorCode::timeout
                         : ErrorCode::unavailable;
    finish(make_error(code, "data plane {}: {} failed: {}", peer_, what, ec.message()), nullptr,
           false);
  }

  void finish(Status st, std::shared_ptr<proto::Buffer> body, bool reusable) {
    if (!st.ok() && landing_.poisoned) *landing_.poisoned = true;
    landing_ = Landing{};
    error_code ec;
    if (reusable && socket_.is_open()) {
      int fd = socket_.release(ec);
      if (!ec) client_.pool().put(endpoint_, fd);
    } else {
      socket_.close(ec);
    }
    if (done_) {
      Done done = std::move(done_);
      done_ = nullptr;
      done(std::move(st), std::move(body));
    }
  }

  Socket socket_;
  std::string endpoint_;
  std::string peer_;
  DataPlaneClient& client_;
  Done done_;
  std::array<uint8_t, kRequestBytes> request_{};
  std::array<uint8_t, kResponseBytes> response_{};
  size_t got_ = 0;
  ResponseHeader header_;
  std::shared_ptr<proto::Buffer> body_;
  Landing landing_;
  std::string message_;
};

// Connects (or reuses) a Unix socket to a same-host owner; false if that is not possible.
bool open_unix(asio::io_context& io, DataPlaneClient& client, const PayloadHandle& h,
               unix_socket& socket, std::string& endpoint, bool& pooled) {
  if (!client.config().shared_memory || h.host_id != machine_id()) return false;
  endpoint = fmt::format("unix:{:016x}", h.owner);
  error_code ec;
  int fd = pooled ? client.pool().take(endpoint) : -1;
  pooled = fd >= 0;
  if (fd >= 0) {
    socket.assign(asio::local::stream_protocol(), fd, ec);
    return !ec;
  }
  socket.connect(asio::local::stream_protocol::endpoint(unix_socket_name(h.owner)), ec);
  return !ec;
}

// Connects (or reuses) a TCP socket to the owner. Connecting blocks at most until the
// kernel answers; an unreachable host is bounded by the fetch deadline via cancel().
Status open_tcp(asio::io_context& io, DataPlaneClient& client, const PayloadHandle& h,
                tcp::socket& socket, std::string& endpoint, bool& pooled) {
  endpoint = fmt::format("tcp:{}:{}", h.host, h.port);
  error_code ec;
  int fd = pooled ? client.pool().take(endpoint) : -1;
  pooled = fd >= 0;
  if (fd >= 0) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
    socket.assign(ss.ss_family == AF_INET6 ? tcp::v6() : tcp::v4(), fd, ec);
    if (!ec) return Status();
  }
  tcp::resolver resolver(io);
  auto endpoints = resolver.resolve(h.host, std::to_string(h.port), ec);
  if (!ec) asio::connect(socket, endpoints, ec);
  if (ec) {
    return make_error(ErrorCode::unavailable, "data plane {}:{}: cannot connect: {}", h.host,
                      h.port, ec.message());
  }
  socket.set_option(tcp::no_delay(true), ec);
  return Status();
}

std::function<void()> start_exchange(asio::io_context& io, DataPlaneClient& client,
                                     const PayloadHandle& h, const Request& request, Done done,
                                     bool allow_pool = true);

// Wraps `done` so that an `unavailable` failure on a pooled connection (the peer restarted or
// dropped it) is retried once on a fresh connection; `cancel` follows the retry.
Done retry_once(asio::io_context& io, DataPlaneClient& client, const PayloadHandle& h,
                const Request& request, Done done, std::shared_ptr<std::function<void()>> cancel) {
  return [&io, &client, h, request, done, cancel](Status st, std::shared_ptr<proto::Buffer> body) {
    if (st.code() != ErrorCode::unavailable) return done(std::move(st), std::move(body));
    *cancel = start_exchange(io, client, h, request, done, false);
  };
}

template <class Socket>
std::function<void()> launch(Socket socket, const std::string& endpoint, const std::string& peer,
                             asio::io_context& io, DataPlaneClient& client,
                             const PayloadHandle& h, const Request& request, Done done,
                             bool pooled) {
  auto cancel = std::make_shared<std::function<void()>>();
  if (pooled) done = retry_once(io, client, h, request, std::move(done), cancel);
  auto ex = std::make_shared<Exchange<Socket>>(std::move(socket), endpoint, peer, request, client,
                                               std::move(done));
  *cancel = [ex] { ex->cancel(); };
  ex->start();
  return [cancel] { (*cancel)(); };
}

// Starts one exchange for `request` against the owner of `h` (Unix socket when the owner is on
// this machine, else TCP); returns its cancel function.
std::function<void()> start_exchange(asio::io_context& io, DataPlaneClient& client,
                                     const PayloadHandle& h, const Request& request, Done done,
                                     bool allow_pool) {
  std::string peer = fmt::format("{}:{}", h.host, h.port);
  std::string endpoint;
  bool pooled = allow_pool;
  unix_socket us(io);
  if (open_unix(io, client, h, us, endpoint, pooled)) {
    return launch(std::move(us), endpoint, peer, io, client, h, request, std::move(done), pooled);
  }
  pooled = allow_pool;
  tcp::socket ts(io);
  Status st = open_tcp(io, client, h, ts, endpoint, pooled);
  if (!st.ok()) {
    done(st, nullptr);
    return [] {};
  }
  return launch(std::move(ts), endpoint, peer, io, client, h, request, std::move(done), pooled);
}

// Runs the thread's io_context until every exchange finished or the deadline passed; on
// timeout cancels the rest and lets them finish with errors.
void run_with_deadline(asio::io_context& io, std::vector<std::function<void()>>& cancels,
                       const size_t& pending, Millis timeout) {
  io.restart();
  io.run_for(timeout);
  if (pending == 0) return;
  for (auto& c : cancels) c();
  io.restart();
  io.run();
}

}  // namespace

std::vector<Result<proto::DataProto>> DataPlaneClient::fetch_all(
    const std::vector<PayloadSlice>& slices, bool consume) {
  asio::io_context& io = thread_io();
  std::vector<Result<proto::DataProto>> results(
      slices.size(), Result<proto::DataProto>(Status(ErrorCode::internal, "fetch not run")));
  std::vector<std::function<void()>> cancels;
  size_t pending = slices.size();
  for (size_t i = 0; i < slices.size(); ++i) {
    const PayloadSlice& s = slices[i];
    Request r{Op::fetch, static_cast<uint8_t>(consume ? kFlagConsume : 0), s.handle.owner,
              s.handle.id, s.handle.key, s.row_begin, s.row_end};
    counters_.remote_fetches++;
    cancels.push_back(start_exchange(io, *this, s.handle, r,
        [&results, &pending, i](Status st, std::shared_ptr<proto::Buffer> body) {
          --pending;
          if (!st.ok()) results[i] = st;
          else if (!body) results[i] = Status(ErrorCode::corrupt_data, "empty frame");
          else results[i] = proto::decode(std::move(body));
        }));
  }
  run_with_deadline(io, cancels, pending, config_.io_timeout);
  return results;
}

Status DataPlaneClient::release(const PayloadHandle& handle) {
  asio::io_context& io = thread_io();
  Request r{Op::release, 0, handle.owner, handle.id, handle.key, 0, -1};
  Status result(ErrorCode::internal, "release not run");
  size_t pending = 1;
  std::vector<std::function<void()>> cancels;
  cancels.push_back(start_exchange(io, *this, handle, r,
      [&](Status st, std::shared_ptr<proto::Buffer>) {
        --pending;
        result = st;
      }));
  run_with_deadline(io, cancels, pending, config_.io_timeout);
  return result;
}

}  // namespace tessera::runtime::internal
