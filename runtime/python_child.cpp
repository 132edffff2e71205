// python_child.cpp: see python_child.hpp.
#include "runtime/python_child.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <fmt/format.h>

extern char** environ;

namespace tessera::runtime {

Result<PythonChild> spawn_python(const std::string& python, const std::string& script,
                                 const std::vector<std::string>& args, const std::string& what) {
  ::signal(SIGPIPE, SIG_IGN);
  int to_child[2], from_child[2];
  if (::pipe2(to_child, O_CLOEXEC) != 0) return make_error(ErrorCode::io_error, "{}: pipe: {}", what, std::strerror(errno));
  if (::pipe2(from_child, O_CLOEXEC) != 0) {
    ::close(to_child[0]), ::close(to_child[1]);
    return make_error(ErrorCode::io_error, "{}: pipe: {}", what, std::strerror(errno));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, to_child[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, from_child[1], STDOUT_FILENO);
  std::vector<std::string> all = {python, "-u", "-c", std::string(kProtocolPipes) + kJsonAnswers + script};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, python.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(to_child[0]);
  ::close(from_child[1]);
  if (rc != 0) {
    ::close(to_child[1]), ::close(from_child[0]);
    return make_error(ErrorCode::unavailable, "{}: cannot start '{}': {}", what, python, std::strerror(rc));
  }
  ::fcntl(to_child[1], F_SETFL, ::fcntl(to_child[1], F_GETFL) | O_NONBLOCK);
  PythonChild child;
  child.pid = pid, child.in = to_child[1], child.out = from_child[0];
  return child;
}

void kill_child(PythonChild& child) {
  if (child.in >= 0) ::close(child.in);
  if (child.out >= 0) ::close(child.out);
  if (child.pid > 0) {
    ::kill(child.pid, SIGKILL);
    ::waitpid(child.pid, nullptr, 0);
  }
  child = PythonChild{};
}

std::optional<int> finish_child(PythonChild& child, std::chrono::milliseconds grace) {
  if (child.in >= 0) {
    ::close(child.in);
    child.in = -1;
  }
  std::optional<int> exit_status;
  if (child.pid > 0) {
    const auto deadline = Clock::now() + grace;
    for (auto pause = std::chrono::milliseconds(1);; pause = std::min(pause * 2, std::chrono::milliseconds(100))) {
      int status = 0;
      const pid_t done = ::waitpid(child.pid, &status, WNOHANG);
      if (done == child.pid) {
        if (WIFEXITED(status)) exit_status = WEXITSTATUS(status);
        child.pid = -1;
        break;
      }
      if (done < 0 || Clock::now() >= deadline) break;
      // Polling a child's exit: waitpid has no timeout, and a SIGCHLD handler would be process-wide.
      std::this_thread::sleep_for(pause);
    }
  }
  kill_child(child);
  return exit_status;
}

Result<std::string> read_line(PythonChild& child, Clock::time_point deadline) {
  size_t scanned = 0;  // bytes of the buffer known to hold no newline (a long line is scanned once)
  for (;;) {
    if (auto nl = child.buffer.find('\n', scanned); nl != std::string::npos) {
      std::string line = child.buffer.substr(0, nl);
      child.buffer.erase(0, nl + 1);
      return line;
    }
    scanned = child.buffer.size();
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return Status(ErrorCode::timeout, "timed out");
    pollfd pfd{child.out, POLLIN, 0};
    const int n = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (n < 0 && errno != EINTR) return Status(ErrorCode::io_error, std::strerror(errno));
    if (n <= 0) continue;
    char chunk[65536];
    const ssize_t got = ::read(child.out, chunk, sizeof chunk);
    if (got == 0) return Status(ErrorCode::unavailable, "the process exited");
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Status(ErrorCode::io_error, std::strerror(errno));
    }
    child.buffer.append(chunk, static_cast<size_t>(got));
  }
}

Status write_all(PythonChild& child, const std::string& data, Clock::time_point deadline) {
  if (child.in < 0) return Status(ErrorCode::unavailable, "the process is not running");
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(child.in, data.data() + done, data.size() - done);
    if (n >= 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return Status(ErrorCode::unavailable, errno == EPIPE ? "the process exited" : std::strerror(errno));
    }
    // The pipe is full: wait until the child reads (or the deadline).
    const auto left = deadline == Clock::time_point::max()
                          ? int64_t{1000}
                          : std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return Status(ErrorCode::timeout, "it has not read its input in time");
    pollfd pfd{child.in, POLLOUT, 0};
    if (::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 1000))) < 0 && errno != EINTR) {
      return Status(ErrorCode::io_error, std::strerror(errno));
    }
  }
  return Status();
}

std::string python_from_env(const char* env_var) {
  const char* env = std::getenv(env_var);
  return env != nullptr && *env != '\0' ? env : "python3";
}

std::string first_line(std::string s) {
  if (auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  return s;
}

}  // namespace tessera::runtime
