#include "proto/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace tessera::proto {

std::string unique_temp_path(const std::string& target) {
  static std::atomic<uint64_t> counter{0};
  return fmt::format("{}.tmp-{}-{}", target, ::getpid(), counter.fetch_add(1));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (file_ != nullptr) {
    std::fclose(file_);
    std::remove(temp_.c_str());
  }
}

Status AtomicFileWriter::open(const std::string& path) {
  path_ = path;
  temp_ = unique_temp_path(path);
  file_ = std::fopen(temp_.c_str(), "wb");
  if (file_ == nullptr) {
    return make_error(ErrorCode::io_error, "{}: cannot create temp file: {}", temp_, std::strerror(errno));
  }
  return Status();
}

Status AtomicFileWriter::write(const void* data, size_t n) {
  if (n == 0) return Status();
  if (std::fwrite(data, 1, n, file_) != n) {
    return make_error(ErrorCode::io_error, "{}: write failed: {}", temp_, std::strerror(errno));
  }
  return Status();
}

Status AtomicFileWriter::commit() {
  bool ok = std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0;
  ok = (std::fclose(file_) == 0) && ok;
  file_ = nullptr;
  if (!ok || std::rename(temp_.c_str(), path_.c_str()) != 0) {
    int err = errno;
    std::remove(temp_.c_str());
    return make_error(ErrorCode::io_error, "{}: cannot commit: {}", path_, std::strerror(err));
  }
  // The rename is durable once the directory entry is: fsync the directory too.
  const std::string dir = std::filesystem::path(path_).parent_path().string();
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return make_error(ErrorCode::io_error, "{}: cannot open its directory: {}", path_, std::strerror(errno));
  const bool synced = ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!synced) return make_error(ErrorCode::io_error, "{}: cannot sync its directory: {}", path_, std::strerror(err));
  return Status();
}

Status write_file_atomic(const std::string& path, std::string_view data) {
  AtomicFileWriter w;
  TESSERA_RETURN_IF_ERROR(w.open(path));
  TESSERA_RETURN_IF_ERROR(w.write(data.data(), data.size()));
  return w.commit();
}

}  // namespace tessera::proto
