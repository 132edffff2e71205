// free_port.cpp: see Note [Ports outside the ephemeral range] in free_port.hpp.
#include "proto/free_port.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <utility>

namespace tessera::proto {
namespace {

// The ports below 10000 are left to well-known services; the ranges kept are at least 1000 wide.
constexpr int kLowest = 10000;
constexpr int kHighest = 65535;
constexpr int kTries = 200;

// Where to pick from: the ports from kLowest up to the start of the ephemeral range, or, where
// that leaves fewer than 1000, from its end up to kHighest; where neither does (an ephemeral range
// tuned to cover nearly everything), all of [kLowest, kHighest], where the race of bind(0) is
// back for the ports the kernel may hand out.
std::pair<int, int> candidate_span() {
  int lo = 32768, hi = 60999;  // Linux's default, also when /proc cannot be read
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int read_lo = 0, read_hi = 0;
  if (in >> read_lo >> read_hi && 1 <= read_lo && read_lo <= read_hi && read_hi <= kHighest) {
    lo = read_lo;
    hi = read_hi;
  }
  if (lo - kLowest >= 1000) return {kLowest, lo - 1};
  if (kHighest - std::max(hi + 1, kLowest) + 1 >= 1000) return {std::max(hi + 1, kLowest), kHighest};
  return {kLowest, kHighest};
}

bool bindable(const in_addr& address, uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr = address;
  a.sin_port = htons(port);
  const bool ok = ::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

Result<uint16_t> pick_free_port(const std::string& host) {
  in_addr address{};
  if (::inet_pton(AF_INET, host.c_str(), &address) != 1) {
    return make_error(ErrorCode::invalid_argument, "pick_free_port: '{}' is not an IPv4 address", host);
  }
  static std::mutex mu;
  static std::set<uint16_t> given;
  static std::mt19937 rng{std::random_device{}()};
  static const std::pair<int, int> span = candidate_span();
  std::lock_guard<std::mutex> lock(mu);
  std::uniform_int_distribution<int> pick(span.first, span.second);
  for (int t = 0; t < kTries; ++t) {
    const auto port = static_cast<uint16_t>(pick(rng));
    if (given.count(port) != 0 || !bindable(address, port)) continue;
    given.insert(port);
    return port;
  }
  return make_error(ErrorCode::unavailable, "pick_free_port: no free TCP port on {} in {} tries", host, kTries);
}

}  // namespace tessera::proto
