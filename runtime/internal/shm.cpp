// shm.cpp: Note [Shared-memory transport].
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

Result<int> frame_to_memfd(const proto::EncodedFrame& frame) {
  int fd = ::memfd_create("tessera-payload", MFD_CLOEXEC);
  if (fd < 0) return errno_error("memfd_create");
  size_t size = frame.size();
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    Status st = errno_error("ftruncate(memfd)");
    ::close(fd);
    return st;
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    Status st = errno_error("mmap(memfd)");
    ::close(fd);
    return st;
  }
  frame.flatten_into(static_cast<uint8_t*>(p));
  ::munmap(p, size);
  return fd;
}

Result<std::shared_ptr<proto::Buffer>> map_memfd(int fd, uint64_t size) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < size || size == 0) {
    ::close(fd);
    return make_error(ErrorCode::corrupt_data, "shared-memory frame: descriptor holds fewer "
                      "than the announced {} bytes", size);
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return errno_error("mmap(received memfd)");
  return proto::Buffer::wrap(p, size, [p, size] { ::munmap(p, size); });
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
