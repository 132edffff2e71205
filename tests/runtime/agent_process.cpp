#include "tests/runtime/agent_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <regex>

#include <gtest/gtest.h>

#include "runtime/agent_main.hpp"

extern char** environ;

namespace tessera::runtime::testing {
namespace {

pid_t spawn_self(const std::vector<std::string>& args, int& stdout_fd) {
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return -1;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipefd[1], STDOUT_FILENO);
  std::vector<std::string> all = {"/proc/self/exe", "--tessera-agent"};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(pipefd[1]);
  if (rc != 0) {
    ::close(pipefd[0]);
    return -1;
  }
  stdout_fd = pipefd[0];
  return pid;
}

// Reads one line from `fd`, waiting at most `timeout` in total.
Result<std::string> read_line(int fd, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string line;
  char c;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) {
      return make_error(ErrorCode::timeout, "agent printed no ready line (got '{}')", line);
    }
    ssize_t n = ::read(fd, &c, 1);
    if (n <= 0) return make_error(ErrorCode::unavailable, "agent exited before ready ('{}')", line);
    if (c == '\n') return line;
    line += c;
  }
}

}  // namespace

Result<AgentProcess> AgentProcess::start(const std::vector<std::string>& args) {
  AgentProcess a;
  a.pid_ = spawn_self(args, a.stdout_fd_);
  if (a.pid_ < 0) return make_error(ErrorCode::internal, "posix_spawn failed");
  a.pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, a.pid_, 0));
  TESSERA_ASSIGN_OR_RETURN(std::string line, read_line(a.stdout_fd_, std::chrono::seconds(30)));
  std::smatch m;
  if (!std::regex_search(line, m, std::regex(R"(listen=(\S+) data_plane=\S+:(\d+))"))) {
    return make_error(ErrorCode::corrupt_data, "unexpected ready line '{}'", line);
  }
  a.address_ = m[1];
  a.data_plane_port_ = static_cast<uint16_t>(std::stoi(m[2]));
  if (std::regex_search(line, m, std::regex(R"( call=(\d+) )"))) {
    a.call_port_ = static_cast<uint16_t>(std::stoi(m[1]));
  }
  return a;
}

Result<int> AgentProcess::run_to_exit(const std::vector<std::string>& args) {
  AgentProcess a;
  a.pid_ = spawn_self(args, a.stdout_fd_);
  if (a.pid_ < 0) return make_error(ErrorCode::internal, "posix_spawn failed");
  a.pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, a.pid_, 0));
  return a.wait(std::chrono::seconds(30));
}

AgentProcess::AgentProcess(AgentProcess&& o) noexcept { *this = std::move(o); }

AgentProcess& AgentProcess::operator=(AgentProcess&& o) noexcept {
  std::swap(pid_, o.pid_);
  std::swap(stdout_fd_, o.stdout_fd_);
  std::swap(pidfd_, o.pidfd_);
  std::swap(address_, o.address_);
  std::swap(data_plane_port_, o.data_plane_port_);
  std::swap(call_port_, o.call_port_);
  return *this;
}

AgentProcess::~AgentProcess() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (stdout_fd_ >= 0) ::close(stdout_fd_);
  if (pidfd_ >= 0) ::close(pidfd_);
}

void AgentProcess::signal(int sig) const {
  if (pid_ > 0) ::kill(pid_, sig);
}

Status AgentProcess::stop() {
  if (pid_ <= 0) return make_error(ErrorCode::not_found, "no agent process");
  ::kill(pid_, SIGSTOP);
  int status = 0;
  if (::waitpid(pid_, &status, WUNTRACED) != pid_ || !WIFSTOPPED(status)) {
    return make_error(ErrorCode::internal, "agent {} did not stop (status {})", pid_, status);
  }
  return Status();
}

Result<int> AgentProcess::wait(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return make_error(ErrorCode::not_found, "no agent process");
  pollfd p{pidfd_, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) {
    return make_error(ErrorCode::timeout, "agent {} still running after {} ms", pid_,
                      timeout.count());
  }
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  return status;
}

std::string write_token_file(const std::string& name, const std::string& token, int mode) {
  std::string path = ::testing::TempDir() + "/" + name;
  ::unlink(path.c_str());
  std::ofstream(path) << token << "\n";
  ::chmod(path.c_str(), static_cast<mode_t>(mode));
  return path;
}

int agent_test_main(int argc, char** argv, const WorkerTypeRegistry& registry) {
  if (argc < 2 || std::strcmp(argv[1], "--tessera-agent") != 0) return -1;
  AgentOptions o;
  o.listen = "127.0.0.1:0";
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    std::string v = argv[i + 1];
    if (k == "--listen") o.listen = v;
    else if (k == "--devices") o.devices = v;
    else if (k == "--token-file") o.token_file = v;
    else if (k == "--data-plane-listen") o.data_plane_listen = v;
    else if (k == "--call-listen") o.call_listen = v;
    else if (k == "--shutdown-timeout-ms") o.runtime.shutdown_timeout = std::chrono::milliseconds(std::stoi(v));
    else if (k == "--heartbeat-ms") o.runtime.heartbeat_interval = std::chrono::milliseconds(std::stoi(v));
    else if (k == "--connection-timeout-ms") o.runtime.connection_timeout = std::chrono::milliseconds(std::stoi(v));
    else if (k == "--tls-cert") o.tls_cert = v;
    else if (k == "--tls-key") o.tls_key = v;
    else if (k == "--tls-cafile") o.tls_cafile = v;
  }
  return run_agent(o, registry);
}

}  // namespace tessera::runtime::testing
