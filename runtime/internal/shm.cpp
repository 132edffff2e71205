// shm.cpp: descriptor passing for same-host peers (Note [Landing segments] in shm_pool.hpp).
#include "runtime/internal/shm.hpp"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>

namespace tessera::runtime::internal {
namespace {

Status errno_error(const char* call) {
  return make_error(ErrorCode::io_error, "{} failed: {}", call, std::strerror(errno));
}

}  // namespace

Result<size_t> recv_some_with_fd(int sock, uint8_t* data, size_t size, int* fd) {
  iovec iov{data, size};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = ::recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return size_t{0};
  if (n < 0) return errno_error("recvmsg");
  if (n == 0) return make_error(ErrorCode::unavailable, "peer closed the connection");
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    if (*fd >= 0) ::close(*fd);  // only the latest descriptor is kept
    std::memcpy(fd, CMSG_DATA(c), sizeof(int));
  }
  return static_cast<size_t>(n);
}

Status send_with_fd(int sock, const uint8_t* data, size_t size, int fd, int timeout_ms) {
  iovec iov{const_cast<uint8_t*>(data), size};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  for (;;) {
    ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(size)) return Status();
    if (n >= 0) return make_error(ErrorCode::io_error, "sendmsg sent {} of {} bytes", n, size);
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return errno_error("sendmsg(SCM_RIGHTS)");
    pollfd p{sock, POLLOUT, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) {
      return make_error(ErrorCode::timeout, "sendmsg(SCM_RIGHTS): peer not reading");
    }
  }
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

const std::string& machine_id() {
  static const std::string id = [] {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string boot;
    std::getline(in, boot);
    return boot + "/" + host_name();
  }();
  return id;
}

}  // namespace tessera::runtime::internal
