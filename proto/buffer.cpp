#include "proto/buffer.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace tessera::proto {

Buffer::~Buffer() {
  if (release_) release_();
}

Result<std::shared_ptr<Buffer>> Buffer::allocate(size_t size) {
  // aligned_alloc needs a size that is a multiple of the alignment (and > 0 to be portable).
  size_t rounded = (size + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
  if (rounded < size) {
    return make_error(ErrorCode::out_of_range, "Buffer::allocate: {} bytes overflows", size);
  }
  if (rounded == 0) rounded = kBufferAlignment;
  void* p = std::aligned_alloc(kBufferAlignment, rounded);
  if (p == nullptr) {
    return make_error(ErrorCode::out_of_range, "Buffer::allocate: cannot allocate {} bytes", size);
  }
  return std::shared_ptr<Buffer>(new Buffer(static_cast<uint8_t*>(p), size, [p] { std::free(p); }));
}

Result<std::shared_ptr<Buffer>> Buffer::copy_of(const void* data, size_t size) {
  TESSERA_ASSIGN_OR_RETURN(auto buf, allocate(size));
  if (size > 0) std::memcpy(buf->data(), data, size);
  return buf;
}

std::shared_ptr<Buffer> Buffer::wrap(void* data, size_t size, std::function<void()> release) {
  return std::shared_ptr<Buffer>(new Buffer(static_cast<uint8_t*>(data), size, std::move(release)));
}

Result<std::shared_ptr<Buffer>> Buffer::map_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return make_error(errno == ENOENT ? ErrorCode::not_found : ErrorCode::io_error,
                      "cannot open '{}': {}", path, std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return make_error(ErrorCode::io_error, "cannot stat '{}': {}", path, std::strerror(err));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {  // mmap rejects empty mappings; an empty buffer decodes to a clear error.
    ::close(fd);
    return allocate(0);
  }
  // Private + writable: decoded tensors may be written to without touching the file.
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    return make_error(ErrorCode::io_error, "cannot mmap '{}': {}", path, std::strerror(err));
  }
  return wrap(p, size, [p, size] { ::munmap(p, size); });
}

}  // namespace tessera::proto
