// data_proto_io.cpp: save/load of a DataProto in the wire format.
//
// save() writes the EncodedFrame's segments with writev into "<path>.tmp.<pid>.<n>", fsyncs it
// and renames it over <path>, so a reader sees the old file or the new one, never a torn one.
// load() maps the file (copy-on-write) and decodes it zero-copy: the tensors alias the mapping.
#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>

#include "proto/codec.hpp"
#include "proto/data_proto.hpp"

namespace tessera::proto {
namespace {

Status io_error(const std::string& op, const std::string& path, int err) {
  return make_error(ErrorCode::io_error, "{} '{}': {}", op, path, std::strerror(err));
}

/// Writes every segment, in order, coping with partial writes and IOV_MAX.
Status write_segments(int fd, const std::vector<FrameSegment>& segments, const std::string& path) {
  std::vector<iovec> iov;
  iov.reserve(segments.size());
  for (const auto& s : segments) {
    if (s.size > 0) iov.push_back({const_cast<uint8_t*>(s.data), s.size});
  }
  size_t first = 0;
  while (first < iov.size()) {
    const int count = static_cast<int>(std::min<size_t>(iov.size() - first, IOV_MAX));
    ssize_t n = ::writev(fd, iov.data() + first, count);
    if (n < 0) {
      if (errno == EINTR) continue;
      return io_error("cannot write", path, errno);
    }
    auto left = static_cast<size_t>(n);
    while (first < iov.size() && left >= iov[first].iov_len) left -= iov[first++].iov_len;
    if (left > 0) {
      iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
  return Status();
}

std::string temp_name(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  return path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
}

}  // namespace

Status DataProto::save(const std::string& path) const {
  auto frame = encode(*this);
  if (!frame.ok()) return frame.status().with_context("save '" + path + "'");
  const std::string tmp = temp_name(path);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io_error("cannot create", tmp, errno);
  Status st = write_segments(fd, frame->segments(), tmp);
  if (st.ok() && ::fsync(fd) != 0) st = io_error("cannot fsync", tmp, errno);
  if (::close(fd) != 0 && st.ok()) st = io_error("cannot close", tmp, errno);
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) st = io_error("cannot rename onto", path, errno);
  if (!st.ok()) ::unlink(tmp.c_str());
  return st;
}

Result<DataProto> DataProto::load(const std::string& path) {
  auto buffer = Buffer::map_file(path);
  if (!buffer.ok()) return buffer.status().with_context("load");
  auto data = decode(std::move(buffer).value());
  if (!data.ok()) return data.status().with_context("load '" + path + "'");
  return data;
}

}  // namespace tessera::proto
