// Multi-process Gloo: the test re-executes its own binary (/proc/self/exe) as two child
// processes, each running only GlooChild.* with its rank in the environment. The children
// rendezvous through a TCPStore on 127.0.0.1 and check every collective against values computed
// with plain loops. Each child arms alarm() so a wedged child cannot hang the parent.
#include <sys/wait.h>
#include <unistd.h>

#include <torch/torch.h>

#include <cstdlib>

#include "runtime/collective/communicator.hpp"
#include "runtime/collective/device_mesh.hpp"
#include "tests/runtime/collective/collective_test_util.hpp"

namespace tessera::collective {
namespace {

constexpr const char* kRankEnv = "TESSERA_COLL_CHILD_RANK";
constexpr const char* kPortEnv = "TESSERA_COLL_CHILD_PORT";
constexpr int kWorld = 2;

pid_t spawn_child(int rank, int port) {
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::setenv(kRankEnv, std::to_string(rank).c_str(), 1);
  ::setenv(kPortEnv, std::to_string(port).c_str(), 1);
  const char* argv[] = {"/proc/self/exe", "--gtest_filter=GlooChild.*", nullptr};
  ::execv("/proc/self/exe", const_cast<char* const*>(argv));
  ::_exit(127);
}

TEST(GlooMultiProcess, TwoProcessesAgreeOnEveryCollective) {
  int port = testing::free_port();
  pid_t pids[kWorld];
  for (int r = 0; r < kWorld; ++r) pids[r] = spawn_child(r, port);
  for (int r = 0; r < kWorld; ++r) {
    int status = 0;
    ASSERT_EQ(::waitpid(pids[r], &status, 0), pids[r]);
    ASSERT_TRUE(WIFEXITED(status)) << "child rank " << r << " died with signal "
                                   << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    EXPECT_EQ(WEXITSTATUS(status), 0) << "child rank " << r << " failed; its output is above";
  }
}

// Runs only inside a child (the parent sees no rank in its environment and skips it).
TEST(GlooChild, Run) {
  const char* rank_text = std::getenv(kRankEnv);
  if (rank_text == nullptr) GTEST_SKIP() << "child mode only";
  ::alarm(120);
  int rank = std::atoi(rank_text);
  auto opts = testing::world_options("gloo", rank, kWorld, std::atoi(std::getenv(kPortEnv)), "");
  auto made = make_communicator(opts);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  Communicator& c = **made;
  EXPECT_EQ(c.rank(), rank);

  constexpr int64_t n = 1 << 16;
  std::vector<double> mine = testing::rank_values(rank, kWorld * n);
  std::vector<double> other = testing::rank_values(1 - rank, kWorld * n);

  at::Tensor rs = at::empty({n});
  ASSERT_TRUE(c.reduce_scatter(testing::to_tensor(mine), rs, ReduceOp::sum).ok());
  std::vector<double> got = testing::to_vector(rs);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], mine[rank * n + i] + other[rank * n + i]) << i;

  at::Tensor ag = at::empty({kWorld * n});
  at::Tensor chunk = testing::to_tensor(std::vector<double>(mine.begin(), mine.begin() + n));
  ASSERT_TRUE(c.all_gather(chunk, ag).ok());
  got = testing::to_vector(ag);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(got[rank * n + i], mine[i]);
    ASSERT_EQ(got[(1 - rank) * n + i], other[i]);
  }

  at::Tensor ar = testing::to_tensor(mine);
  ASSERT_TRUE(c.all_reduce(ar, ReduceOp::max).ok());
  got = testing::to_vector(ar);
  for (int64_t i = 0; i < kWorld * n; i += 97) ASSERT_EQ(got[i], std::max(mine[i], other[i]));

  at::Tensor b = testing::to_tensor(mine, at::kBFloat16);
  ASSERT_TRUE(c.broadcast(b, 1).ok());
  EXPECT_TRUE(at::equal(b, testing::to_tensor(rank == 1 ? mine : other, at::kBFloat16)));

  at::Tensor msg = at::arange(10, at::kLong) * (rank + 1);
  at::Tensor in = at::empty({10}, at::kLong);
  if (rank == 0) {
    ASSERT_TRUE(c.send(msg, 1).ok());
    ASSERT_TRUE(c.recv(in, 1).ok());
  } else {
    ASSERT_TRUE(c.recv(in, 0).ok());
    ASSERT_TRUE(c.send(msg, 0).ok());
  }
  EXPECT_TRUE(at::equal(in, at::arange(10, at::kLong) * (2 - rank)));

  auto mesh = DeviceMesh::for_fsdp(*made, -1);
  ASSERT_TRUE(mesh.ok()) << mesh.status().to_string();
  at::Tensor one = at::ones({3});
  ASSERT_TRUE(mesh->group(0)->all_reduce(one, ReduceOp::avg).ok());
  EXPECT_EQ(one[0].item<float>(), 1.0f);
  ASSERT_TRUE(c.barrier().ok());
}

}  // namespace
}  // namespace tessera::collective
