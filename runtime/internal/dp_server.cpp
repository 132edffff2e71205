// dp_server.cpp: data plane sessions (Note [Data plane protocol]).
#include "runtime/internal/dp_server.hpp"

#include <unistd.h>

#include <array>
#include <utility>

#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "runtime/internal/shm.hpp"

namespace tessera::runtime::internal {
namespace asio = boost::asio;
using boost::system::error_code;

std::string unix_socket_name(uint64_t owner) {
  return std::string(1, '\0') + fmt::format("tessera-dp-{:016x}", owner);
}

namespace {

// One connection. Reads a request, answers it, repeats; closes on any protocol violation.
template <class Socket>
class Session : public std::enable_shared_from_this<Session<Socket>> {
 public:
  Session(Socket socket, DataPlaneServer& server, bool is_unix)
      : socket_(std::move(socket)), timer_(socket_.get_executor()), server_(server),
        is_unix_(is_unix) {}
  ~Session() {
    if (landing_fd_ >= 0) ::close(landing_fd_);
  }

  void start() { next_request(); }

 private:
  void next_request() {
    auto self = this->shared_from_this();
    asio::async_read(socket_, asio::buffer(request_), [self](error_code ec, size_t n) {
      if (ec == asio::error::eof && n == 0) return;  // client closed between requests
      if (ec) return self->drop(fmt::format("request cut short after {} bytes ({})", n,
                                            ec.message()));
      self->handle_request();
    });
  }

  void handle_request() {
    Result<Request> request = read_request_bytes();
    if (!request.ok()) return drop(request.status().to_string());
    if (request->op == Op::release) {
      Status st = server_.serve_release(*request);
      return st.ok() ? send_header(ResponseHeader{}) : send_error(st);
    }
    Result<proto::EncodedFrame> frame = server_.serve_fetch(*request);
    if (!frame.ok()) return send_error(frame.status());
    frame_ = std::move(frame).value();
    if (is_unix_ && server_.config().shared_memory && frame_->size() >= kShmMinBytes) {
      return send_shm();
    }
    send_frame();
  }

  Result<Request> read_request_bytes() { return internal::read_request(request_.data()); }

  void send_error(const Status& st) {
    body_ = st.message().substr(0, kMaxErrorMessageBytes);
    ResponseHeader h{st.code(), Transport::inline_body, body_.size()};
    write_response(h, response_.data());
    write_buffers({asio::buffer(response_), asio::buffer(body_)}, 0);
  }

  void send_header(const ResponseHeader& h) {
    write_response(h, response_.data());
    write_buffers({asio::buffer(response_)}, 0);
  }

  void send_frame() {
    ResponseHeader h{ErrorCode::ok, Transport::inline_body, frame_->size()};
    write_response(h, response_.data());
    std::vector<asio::const_buffer> bufs{asio::buffer(response_)};
    for (const auto& seg : frame_->segments()) bufs.push_back(asio::buffer(seg.data, seg.size));
    write_buffers(std::move(bufs), frame_->size());
  }

  // Note [Landing segments]: ask for one of the receiver's segments, write the frame into it.
  void send_shm() {
    ResponseHeader h{ErrorCode::ok, Transport::landing_needed, frame_->size()};
    write_response(h, response_.data());
    auto self = this->shared_from_this();
    asio::async_write(socket_, asio::buffer(response_), [self](error_code ec, size_t) {
      if (ec) return self->drop(fmt::format("asking for a landing segment failed ({})", ec.message()));
      self->landing_got_ = 0;
      self->timer_.expires_after(self->server_.config().io_timeout);
      self->timer_.async_wait([self](error_code ec2) {
        error_code ignored;
        if (!ec2) self->socket_.close(ignored);  // no landing message in time
      });
      self->await_landing();
    });
  }

  // The 16-byte landing message may come in pieces: read what is there, never block the thread.
  void await_landing() {
    auto self = this->shared_from_this();
    socket_.async_wait(Socket::wait_read, [self](error_code ec) {
      if (ec) return self->drop(fmt::format("no landing segment came ({})", ec.message()));
      Result<size_t> n = recv_some_with_fd(self->socket_.native_handle(),
                                           self->landing_msg_.data() + self->landing_got_,
                                           kLandingBytes - self->landing_got_, &self->landing_fd_);
      if (!n.ok()) return self->drop("reading the landing message: " + n.status().message());
      self->landing_got_ += *n;
      if (self->landing_got_ < kLandingBytes) return self->await_landing();
      self->timer_.cancel();
      self->land();
    });
  }

  void land() {
    int fd = std::exchange(landing_fd_, -1);
    uint64_t size = frame_->size();
    if (detail::get<uint32_t>(landing_msg_.data(), 0) != kLandingMagic || fd < 0 ||
        detail::get<uint64_t>(landing_msg_.data(), 8) != size) {
      if (fd >= 0) ::close(fd);
      return drop(fmt::format("bad landing message (magic, size or descriptor) for a {}-byte "
                              "frame", size));
    }
    Result<std::shared_ptr<MappingCache::Mapping>> m = server_.mappings().map(fd, size);
    if (!m.ok()) return send_error(m.status());
    frame_->flatten_into((*m)->addr);
    frame_.reset();
    server_.counters().served_shm_bytes += size;  // before the peer can see it (tests read it)
    ResponseHeader h{ErrorCode::ok, Transport::shm, size};
    write_response(h, response_.data());
    write_buffers({asio::buffer(response_)}, 0);
  }

  void write_buffers(std::vector<asio::const_buffer> bufs, uint64_t frame_bytes) {
    auto self = this->shared_from_this();
    server_.counters().served_tcp_bytes += frame_bytes;  // counted before the peer has it
    buffers_ = std::move(bufs);
    timer_.expires_after(server_.config().io_timeout);
    timer_.async_wait([self](error_code ec) {
      if (!ec) self->socket_.close();  // the client stopped reading
    });
    asio::async_write(socket_, buffers_, [self](error_code ec, size_t) {
      self->timer_.cancel();
      self->frame_.reset();
      self->buffers_.clear();
      if (ec) return self->drop(fmt::format("writing the response failed ({})", ec.message()));
      self->next_request();
    });
  }

  void drop(const std::string& why) {
    error_code ignored;
    spdlog::error("data plane: closing connection from {}: {}", peer_name(), why);
    server_.counters().bad_requests++;
    socket_.close(ignored);
  }

  std::string peer_name() {
    error_code ec;
    auto ep = socket_.remote_endpoint(ec);
    if (ec) return is_unix_ ? "a local process" : "an unknown peer";
    if constexpr (std::is_same_v<Socket, asio::ip::tcp::socket>) {
      return fmt::format("{}:{}", ep.address().to_string(), ep.port());
    } else {
      return "a local process";
    }
  }

  Socket socket_;
  asio::steady_timer timer_;
  DataPlaneServer& server_;
  bool is_unix_;
  std::array<uint8_t, kRequestBytes> request_{};
  std::array<uint8_t, kResponseBytes> response_{};
  std::string body_;
  std::optional<proto::EncodedFrame> frame_;
  std::vector<asio::const_buffer> buffers_;
  std::array<uint8_t, kLandingBytes> landing_msg_{};
  size_t landing_got_ = 0;
  int landing_fd_ = -1;
};

}  // namespace

DataPlaneServer::DataPlaneServer(const DataPlaneConfig& config, uint64_t owner,
                                 PayloadStore& store, DataPlane::Counters& counters)
    : config_(config), owner_(owner), store_(store), counters_(counters),
      mappings_(config.peer_mapping_bytes), tcp_acceptor_(io_),
      unix_acceptor_(io_) {}

Result<std::unique_ptr<DataPlaneServer>> DataPlaneServer::start(const DataPlaneConfig& config,
                                                                uint64_t owner,
                                                                PayloadStore& store,
                                                                DataPlane::Counters& counters) {
  std::unique_ptr<DataPlaneServer> s(new DataPlaneServer(config, owner, store, counters));
  error_code ec;
  auto address = asio::ip::make_address(config.bind_host, ec);
  if (ec) {
    return make_error(ErrorCode::invalid_argument, "data plane: bad bind address '{}': {}",
                      config.bind_host, ec.message());
  }
  asio::ip::tcp::endpoint ep(address, config.port);
  s->tcp_acceptor_.open(ep.protocol(), ec);
  if (!ec) s->tcp_acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) s->tcp_acceptor_.bind(ep, ec);
  if (!ec) s->tcp_acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return make_error(ErrorCode::io_error, "data plane: cannot listen on {}:{}: {}",
                      config.bind_host, config.port, ec.message());
  }
  s->port_ = s->tcp_acceptor_.local_endpoint().port();
  asio::local::stream_protocol::endpoint uep(unix_socket_name(owner));
  s->unix_acceptor_.open(uep.protocol(), ec);
  if (!ec) s->unix_acceptor_.bind(uep, ec);
  if (!ec) s->unix_acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) spdlog::warn("data plane: no Unix socket ({}); same-host peers use TCP", ec.message());
  s->accept_tcp();
  if (s->unix_acceptor_.is_open()) s->accept_unix();
  for (int i = 0; i < std::max(1, config.io_threads); ++i) {
    s->threads_.emplace_back([srv = s.get()] { srv->io_.run(); });
  }
  return s;
}

DataPlaneServer::~DataPlaneServer() {
  io_.stop();
  for (auto& t : threads_) t.join();
}

void DataPlaneServer::accept_tcp() {
  // Each connection gets its own strand, so a session's timer and I/O handlers never overlap.
  tcp_acceptor_.async_accept(asio::make_strand(io_), [this](error_code ec, asio::ip::tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (!ec) {
      error_code ignored;
      socket.set_option(asio::ip::tcp::no_delay(true), ignored);
      std::make_shared<Session<asio::ip::tcp::socket>>(std::move(socket), *this, false)->start();
    }
    accept_tcp();
  });
}

void DataPlaneServer::accept_unix() {
  unix_acceptor_.async_accept(asio::make_strand(io_), [this](error_code ec, asio::local::stream_protocol::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (!ec) {
      std::make_shared<Session<asio::local::stream_protocol::socket>>(std::move(socket), *this,
                                                                      true)
          ->start();
    }
    accept_unix();
  });
}

Result<proto::EncodedFrame> DataPlaneServer::serve_fetch(const Request& r) {
  if (r.owner != owner_) {
    return make_error(ErrorCode::not_found,
                      "payload {}: the handle names data plane {:016x}, this is {:016x} "
                      "(was the owner restarted?)", r.id, r.owner, owner_);
  }
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto data,
                           store_.get(r.id, r.key, (r.flags & kFlagConsume) != 0));
  int64_t rows = data.size();
  int64_t end = r.row_end < 0 ? rows : r.row_end;
  if (end > rows) {
    return make_error(ErrorCode::out_of_range, "payload {}: rows [{}, {}) requested, it has {}",
                      r.id, r.row_begin, end, rows);
  }
  if (r.row_begin != 0 || end != rows) {
    TESSERA_ASSIGN_OR_RETURN(data, data.slice(r.row_begin, end));
  }
  return proto::encode(data);
}

Status DataPlaneServer::serve_release(const Request& r) {
  if (r.owner != owner_) {
    return make_error(ErrorCode::not_found, "payload {}: not owned by data plane {:016x}", r.id,
                      owner_);
  }
  return store_.release(r.id, r.key);
}

}  // namespace tessera::runtime::internal
