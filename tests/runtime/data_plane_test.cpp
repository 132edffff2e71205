// The data plane: local, shared-memory and TCP fetches, slices, lifetimes, and hostile bytes.
// Two DataPlane instances in one process stand in for two processes (each has its own owner
// id, so fetches between them take the cross-process paths).
#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <torch/torch.h>

#include "runtime/data_plane.hpp"
#include "runtime/internal/dp_protocol.hpp"

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
  boost::system::error_code ec;
  char buf[64];
  size_t total = 0;
  while (!ec) total += s.read_some(asio::buffer(buf), ec);
  return total;
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
