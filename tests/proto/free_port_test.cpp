// pick_free_port (Note [Ports outside the ephemeral range]): the ports it gives are bindable, lie
// outside the kernel's ephemeral range, and are never given twice; a bad host is one line.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <set>

#include <gtest/gtest.h>

#include "proto/free_port.hpp"

namespace tessera::proto {
namespace {

TEST(FreePort, PortsAreListenableDistinctAndOutsideTheEphemeralRange) {
  int lo = 32768, hi = 60999;
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  if (in) in >> lo >> hi;
  if (lo - 10000 < 1000 && 65535 - std::max(hi + 1, 10000) + 1 < 1000) {
    GTEST_SKIP() << "the ephemeral range " << lo << "-" << hi << " leaves no span outside it to pick from";
  }
  std::set<uint16_t> seen;
  for (int i = 0; i < 50; ++i) {
    Result<uint16_t> port = pick_free_port("127.0.0.1");
    ASSERT_TRUE(port.ok()) << port.status().to_string();
    EXPECT_TRUE(*port < lo || *port > hi) << *port << " is in the ephemeral range " << lo << "-" << hi;
    EXPECT_GE(*port, 10000);
    EXPECT_TRUE(seen.insert(*port).second) << *port << " given twice";
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(*port);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << *port;
    EXPECT_EQ(::listen(fd, 1), 0) << *port;
    ::close(fd);
  }
}

TEST(FreePort, ABadHostIsOneLine) {
  Result<uint16_t> port = pick_free_port("not-an-address");
  ASSERT_FALSE(port.ok());
  EXPECT_EQ(port.status().code(), ErrorCode::invalid_argument);
  EXPECT_NE(port.status().message().find("'not-an-address' is not an IPv4 address"), std::string::npos);
}

}  // namespace
}  // namespace tessera::proto
