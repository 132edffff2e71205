// free_port.cpp: see Note [Ports outside the ephemeral range] in free_port.hpp.
#include "proto/free_port.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <utility>
#include <vector>

namespace tessera::proto {
namespace {

// The ports below 10000 are left to well-known services; the ranges kept are at least 1000 wide.
constexpr int kLowest = 10000;
constexpr int kHighest = 65535;
constexpr int kTries = 200;

// Where to pick from: the spans of [kLowest, kHighest] outside the ephemeral range (the whole of
// it when the ephemeral range leaves too little outside).
std::vector<std::pair<int, int>> candidate_spans() {
  int lo = 32768, hi = 60999;  // Linux's default when /proc cannot be read
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  if (in) in >> lo >> hi;
  std::vector<std::pair<int, int>> spans;
  if (lo - 1 - kLowest >= 1000) spans.emplace_back(kLowest, lo - 1);
  if (kHighest - (hi + 1) >= 1000) spans.emplace_back(hi + 1, kHighest);
  if (spans.empty()) spans.emplace_back(kLowest, kHighest);
  return spans;
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
  static const std::vector<std::pair<int, int>> spans = candidate_spans();
  int width = 0;
  for (const auto& [a, b] : spans) width += b - a + 1;
  std::lock_guard<std::mutex> lock(mu);
  std::uniform_int_distribution<int> pick(0, width - 1);
  for (int t = 0; t < kTries; ++t) {
    int offset = pick(rng);
    uint16_t port = 0;
    for (const auto& [a, b] : spans) {
      if (offset <= b - a) {
        port = static_cast<uint16_t>(a + offset);
        break;
      }
      offset -= b - a + 1;
    }
    if (given.count(port) != 0 || !bindable(address, port)) continue;
    given.insert(port);
    return port;
  }
  return make_error(ErrorCode::unavailable, "pick_free_port: no free TCP port on {} in {} tries", host, kTries);
}

}  // namespace tessera::proto
