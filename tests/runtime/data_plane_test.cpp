// The data plane: local, shared-memory and TCP fetches, slices, lifetimes, and hostile bytes.
// Two DataPlane instances in one process stand in for two processes (each has its own owner
// id, so fetches between them take the cross-process paths).
#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <torch/torch.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "runtime/data_plane.hpp"
#include "runtime/internal/dp_protocol.hpp"
#include "runtime/internal/dp_server.hpp"
#include "runtime/internal/shm.hpp"

namespace tessera::runtime {
namespace {

namespace asio = boost::asio;

proto::DataProto make_batch(int64_t rows, int64_t width) {
  auto x = torch::arange(rows * width, torch::kFloat32).view({rows, width});
  auto ids = torch::arange(rows, torch::kInt64);
  return *proto::DataProto::from_dict({{"x", x}, {"ids", ids}}, {},
                                      nlohmann::json{{"temperature", 0.5}});
}

std::unique_ptr<DataPlane> start(bool shm, Millis timeout = Millis(10000)) {
  DataPlaneConfig c;
  c.shared_memory = shm;
  c.io_timeout = timeout;
  auto dp = DataPlane::start(c);
  EXPECT_TRUE(dp.ok()) << dp.status().to_string();
  return std::move(dp).value();
}

void expect_same(const proto::DataProto& a, const proto::DataProto& b) {
  ASSERT_EQ(a.size(), b.size());
  EXPECT_TRUE(torch::equal(*a.tensor("x"), *b.tensor("x")));
  EXPECT_TRUE(torch::equal(*a.tensor("ids"), *b.tensor("ids")));
  EXPECT_EQ(a.meta_info(), b.meta_info());
}

TEST(DataPlane, LocalFetchIsTheSameMemory) {
  auto dp = start(true);
  proto::DataProto in = make_batch(8, 4);
  PayloadHandle h = dp->publish(in, 1);
  auto out = dp->fetch(DataPlane::whole(h), true);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(out->tensor("x")->data_ptr(), in.tensor("x")->data_ptr());
  EXPECT_EQ(dp->stats().local_fetches, 1u);
  EXPECT_EQ(dp->fetch(DataPlane::whole(h), true).status().code(), ErrorCode::not_found);
}

TEST(DataPlane, SameHostFetchGoesThroughSharedMemory) {
  auto owner = start(true);
  auto reader = start(true);
  proto::DataProto in = make_batch(4096, 64);  // 1 MiB: above the memfd threshold
  PayloadHandle h = owner->publish(in, 1);
  auto out = reader->fetch(DataPlane::whole(h), true);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  expect_same(*out, in);
  EXPECT_GT(owner->stats().served_shm_bytes, in.size() * 64 * 4);
  EXPECT_EQ(owner->stats().served_tcp_bytes, 0u);
  EXPECT_EQ(owner->stats().payloads, 0u);  // consumed: freed
}

TEST(DataPlane, LandingSegmentsAreReusedOnlyOnceTheirTensorsAreGone) {
  auto owner = start(true);
  auto reader = start(true);
  proto::DataProto a = make_batch(4096, 64);
  proto::DataProto b = make_batch(4096, 64);
  (void)b.set_tensor("x", *b.tensor("x") + 1);
  PayloadHandle ha = owner->publish(a, 0);
  PayloadHandle hb = owner->publish(b, 0);
  auto first = reader->fetch(DataPlane::whole(ha), false);
  auto second = reader->fetch(DataPlane::whole(hb), false);  // first still held: a new segment
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_NE(first->tensor("x")->data_ptr(), second->tensor("x")->data_ptr());
  expect_same(*first, a);
  expect_same(*second, b);
  uintptr_t first_address = reinterpret_cast<uintptr_t>(first->tensor("x")->data_ptr());
  first = Status(ErrorCode::internal, "dropped");  // its segment goes back to the pool
  auto third = reader->fetch(DataPlane::whole(hb), false);
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(third->tensor("x")->data_ptr()), first_address);
  expect_same(*third, b);
  expect_same(*second, b);  // untouched by the reuse
  EXPECT_EQ(owner->stats().served_tcp_bytes, 0u);
}

// Reads from `socket` until the peer closes it; the bytes read.
template <class Socket>
size_t read_until_closed(Socket& socket) {
  boost::system::error_code ec;
  char buf[256];
  size_t total = 0;
  while (!ec) total += socket.read_some(asio::buffer(buf), ec);
  return total;
}

// A raw same-host client: sends a fetch for `h` on the owner's Unix socket and reads the
// owner's answer (a landing request for a large frame).
struct RawUnixFetch {
  asio::io_context io;
  asio::local::stream_protocol::socket s{io};
  internal::ResponseHeader header;

  explicit RawUnixFetch(const PayloadHandle& h) {
    s.connect(asio::local::stream_protocol::endpoint(internal::unix_socket_name(h.owner)));
    std::array<uint8_t, internal::kRequestBytes> req{};
    internal::Request r;
    r.owner = h.owner;
    r.id = h.id;
    r.key = h.key;
    internal::write_request(r, req.data());
    asio::write(s, asio::buffer(req));
    header = read_header();
  }
  internal::ResponseHeader read_header() {
    std::array<uint8_t, internal::kResponseBytes> resp{};
    asio::read(s, asio::buffer(resp));
    return *internal::read_response(resp.data(), uint64_t{1} << 40);
  }
  // The error text after an error header (read fully, so the connection closes cleanly).
  std::string read_error(const internal::ResponseHeader& h) {
    std::string text(h.body_bytes, '\0');
    asio::read(s, asio::buffer(text));
    return text;
  }
  // Lends `fd` as the landing segment for a frame of `bytes`.
  void send_landing(int fd, uint64_t bytes) {
    std::array<uint8_t, internal::kLandingBytes> msg{};
    internal::detail::put(msg.data(), 0, internal::kLandingMagic);
    internal::detail::put(msg.data(), 8, bytes);
    ASSERT_TRUE(internal::send_with_fd(s.native_handle(), msg.data(), msg.size(), fd, 1000).ok());
  }
  // Reads until the owner closes the connection; the bytes read.
  size_t drain() { return read_until_closed(s); }
};

TEST(DataPlane, AnUnsealedOrShortLandingSegmentIsRefusedAndServingGoesOn) {
  auto owner = start(true);
  auto reader = start(true);
  proto::DataProto in = make_batch(4096, 64);
  PayloadHandle h = owner->publish(in, 0);
  {  // a memfd the peer could shrink under the owner's writes (SIGBUS): refused
    RawUnixFetch raw(h);
    ASSERT_EQ(raw.header.transport, internal::Transport::landing_needed);
    int fd = ::memfd_create("hostile", MFD_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(raw.header.body_bytes)), 0);
    raw.send_landing(fd, raw.header.body_bytes);
    ::close(fd);
    internal::ResponseHeader answer = raw.read_header();
    EXPECT_EQ(answer.status, ErrorCode::permission_denied);
    EXPECT_NE(raw.read_error(answer).find("sealed"), std::string::npos);
  }
  {  // sealed but smaller than the frame: refused
    RawUnixFetch raw(h);
    int fd = ::memfd_create("short", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    ASSERT_EQ(::ftruncate(fd, 4096), 0);
    ASSERT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    raw.send_landing(fd, raw.header.body_bytes);
    ::close(fd);
    internal::ResponseHeader answer = raw.read_header();
    EXPECT_EQ(answer.status, ErrorCode::invalid_argument);
    EXPECT_NE(raw.read_error(answer).find("fewer than"), std::string::npos);
  }
  uint64_t bad_before = owner->stats().bad_requests;
  {  // half a landing message, then the peer goes away: that connection is dropped
    RawUnixFetch raw(h);
    asio::write(raw.s, asio::buffer(std::string(7, 'L')));
    raw.s.shutdown(asio::local::stream_protocol::socket::shutdown_send);
    EXPECT_EQ(raw.drain(), 0u);
  }
  EXPECT_EQ(owner->stats().bad_requests, bad_before + 1);
  auto out = reader->fetch(DataPlane::whole(h), false);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  expect_same(*out, in);
}

TEST(DataPlane, TcpFetchOfASliceMovesOnlyThoseRows) {
  auto owner = start(false);
  auto reader = start(false);
  proto::DataProto in = make_batch(1000, 256);
  PayloadHandle h = owner->publish(in, 0);
  auto out = reader->fetch(PayloadSlice{h, 100, 200}, false);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  expect_same(*out, *in.slice(100, 200));
  uint64_t tensor_bytes = 100 * (256 * 4 + 8);
  EXPECT_GE(owner->stats().served_tcp_bytes, tensor_bytes);
  EXPECT_LT(owner->stats().served_tcp_bytes, tensor_bytes + 4096);  // + header only
  EXPECT_EQ(owner->stats().payloads, 1u);  // kept until released
  EXPECT_TRUE(reader->release(h).ok());
  EXPECT_EQ(owner->stats().payloads, 0u);
  EXPECT_EQ(reader->release(h).code(), ErrorCode::not_found);
}

TEST(DataPlane, ConsumersCountDownThenThePayloadIsFreed) {
  auto owner = start(true);
  auto reader = start(true);
  PayloadHandle h = owner->publish(make_batch(10, 2), 3);
  std::vector<PayloadSlice> three(3, DataPlane::whole(h));
  auto got = reader->fetch_all(three, true);
  for (auto& g : got) EXPECT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(owner->stats().payloads, 0u);
  auto late = reader->fetch(DataPlane::whole(h), true);
  EXPECT_EQ(late.status().code(), ErrorCode::not_found);
  EXPECT_NE(late.status().message().find(std::to_string(h.id)), std::string::npos);
}

TEST(DataPlane, BadRowRangesAndForgedKeysAreRefused) {
  auto owner = start(false);
  auto reader = start(false);
  PayloadHandle h = owner->publish(make_batch(10, 2), 0);
  EXPECT_EQ(reader->fetch(PayloadSlice{h, 5, 11}, false).status().code(), ErrorCode::out_of_range);
  PayloadHandle forged = h;
  forged.key ^= 1;
  EXPECT_EQ(reader->fetch(DataPlane::whole(forged), false).status().code(), ErrorCode::not_found);
  EXPECT_TRUE(reader->fetch(PayloadSlice{h, 9, 10}, false).ok());  // connection still usable
}

// Writes `bytes` to the owner's port, then reads until the server closes the connection.
size_t send_raw(uint16_t port, const std::string& bytes) {
  asio::io_context io;
  asio::ip::tcp::socket s(io);
  s.connect({asio::ip::make_address("127.0.0.1"), port});
  asio::write(s, asio::buffer(bytes));
  s.shutdown(asio::ip::tcp::socket::shutdown_send);  // what a peer that dies mid-request does
  return read_until_closed(s);
}

TEST(DataPlane, GarbageClosesThatConnectionAndServingGoesOn) {
  auto owner = start(false);
  auto reader = start(false);
  PayloadHandle h = owner->publish(make_batch(16, 2), 0);
  EXPECT_EQ(send_raw(owner->port(), std::string(48, 'z')), 0u);    // bad magic: closed
  EXPECT_EQ(send_raw(owner->port(), std::string("TDP1abc")), 0u);  // truncated request
  std::string bad_op(48, '\0');
  uint32_t magic = internal::kRequestMagic;
  std::memcpy(bad_op.data(), &magic, 4);
  bad_op[4] = 9;
  EXPECT_EQ(send_raw(owner->port(), bad_op), 0u);
  EXPECT_EQ(owner->stats().bad_requests, 3u);
  auto out = reader->fetch(DataPlane::whole(h), false);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(out->size(), 16);
}

TEST(DataPlane, AGarbageResponseIsAnErrorNotACrash) {
  asio::io_context io;
  asio::ip::tcp::acceptor acc(io, {asio::ip::make_address("127.0.0.1"), 0});
  std::thread fake([&] {
    asio::ip::tcp::socket s(io);
    acc.accept(s);
    char req[48];
    asio::read(s, asio::buffer(req));
    std::string junk(32, 'j');
    asio::write(s, asio::buffer(junk));
  });
  auto reader = start(false);
  PayloadHandle h;
  h.host = "127.0.0.1";
  h.port = acc.local_endpoint().port();
  h.owner = 42;
  h.rows = 1;
  auto out = reader->fetch(DataPlane::whole(h), false);
  fake.join();
  EXPECT_EQ(out.status().code(), ErrorCode::corrupt_data);
  EXPECT_NE(out.status().message().find("magic"), std::string::npos);
}

TEST(DataPlane, AnOwnerThatNeverAnswersTimesOut) {
  asio::io_context io;
  asio::ip::tcp::acceptor acc(io, {asio::ip::make_address("127.0.0.1"), 0});
  asio::ip::tcp::socket held(io);
  std::thread fake([&] { acc.accept(held); });
  auto reader = start(false, Millis(200));
  PayloadHandle h;
  h.host = "127.0.0.1";
  h.port = acc.local_endpoint().port();
  h.owner = 42;
  h.rows = 1;
  auto out = reader->fetch(DataPlane::whole(h), false);
  fake.join();
  EXPECT_EQ(out.status().code(), ErrorCode::timeout);
}

TEST(DataPlane, AGoneOwnerIsUnavailable) {
  uint16_t port;
  {
    auto owner = start(false);
    port = owner->port();
  }
  auto reader = start(false);
  PayloadHandle h;
  h.host = "127.0.0.1";
  h.port = port;
  h.owner = 7;
  h.rows = 1;
  EXPECT_EQ(reader->fetch(DataPlane::whole(h), false).status().code(), ErrorCode::unavailable);
}

}  // namespace
}  // namespace tessera::runtime
