// Shared helpers for the driver tests: temp dirs, files and the golden Qwen3 tokenizer.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "workers/tokenizer/tokenizer.hpp"

namespace tessera::driver::testing {

/// What a shell command prints on stdout (stderr too when the command redirects it), and its
/// exit status (pclose's).
struct CommandOutput {
  std::string text;
  int status = -1;
};

inline CommandOutput run_command(const std::string& cmd) {
  CommandOutput out;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return out;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe) != nullptr) out.text += buf;
  out.status = ::pclose(pipe);
  return out;
}

/// $TESSERA_PYTHON (the venv deploy/dev.sh installs), or empty when unset.
inline std::string tessera_python() {
  const char* py = std::getenv("TESSERA_PYTHON");
  return py != nullptr ? py : "";
}

/// Sets (or, with nullopt, unsets) an environment variable for one scope, restoring what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::optional<std::string>& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    value ? ::setenv(name, value->c_str(), 1) : ::unsetenv(name);
  }
  ~ScopedEnv() { old_ ? ::setenv(name_, old_->c_str(), 1) : ::unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

/// A fresh directory under the system temp dir, removed by the destructor.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            ("tessera_driver_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  /// Writes `text` to path()/name and returns the path.
  std::filesystem::path write(const std::string& name, const std::string& text) const {
    auto p = path_ / name;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }

 private:
  std::filesystem::path path_;
};

/// $TESSERA_SHARED_DIR/golden/qwen3-tokenizer, loaded once.
inline const tokenizer::Tokenizer& qwen3_tokenizer() {
  static const tokenizer::Tokenizer tok = [] {
    const char* shared = std::getenv("TESSERA_SHARED_DIR");
    std::filesystem::path dir = std::filesystem::path(shared ? shared : "/work/shared") / "golden" / "qwen3-tokenizer";
    auto t = tokenizer::Tokenizer::from_dir(dir);
    if (!t.ok()) {
      ADD_FAILURE() << t.status().to_string();
      std::abort();
    }
    return std::move(t).value();
  }();
  return tok;
}

}  // namespace tessera::driver::testing
