// atomic_file.hpp (tessera::proto): files that appear whole or not at all.
//
// A writer streams into `<path>.tmp-<pid>-<n>` beside it, fsyncs, renames over `path` and fsyncs
// the directory on commit(). If it is destroyed without commit() the temp file is removed, so a crash
// or an error never leaves a half-written file under the final name.
// Thread-safety: one writer per thread; distinct writers may target distinct paths concurrently.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>

#include "proto/status.hpp"

namespace tessera::proto {

/// Streams bytes into a temp file and renames it over the target on commit().
class AtomicFileWriter {
 public:
  AtomicFileWriter() = default;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  /// Creates the temp file beside `path`.
  Status open(const std::string& path);
  /// Appends `n` bytes. REQUIRES: open() succeeded.
  Status write(const void* data, size_t n);
  /// fsync + rename onto the target path.
  Status commit();

 private:
  std::string path_;
  std::string temp_;
  std::FILE* file_ = nullptr;
};

/// Writes `data` to `path` atomically.
Status write_file_atomic(const std::string& path, std::string_view data);

/// A fresh unique path `<target>.tmp-<pid>-<n>` (not created) for staging a directory.
std::string unique_temp_path(const std::string& target);

}  // namespace tessera::proto
