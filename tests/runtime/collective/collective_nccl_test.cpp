// NCCL backend against the in-process backend (CUDA builds only; label gpu). World 1 needs one
// GPU; world 2 (threads as ranks, one device each) needs two. Without devices the tests skip.
#include <torch/torch.h>

#include "runtime/collective/communicator.hpp"
#include "tests/runtime/collective/collective_test_util.hpp"

namespace tessera::collective {
namespace {

// Runs the same ops on `backend` and returns every rank's outputs.
std::vector<std::vector<at::Tensor>> run_ops(const std::string& backend, int world, bool* skipped) {
  std::vector<std::vector<at::Tensor>> out(world);
  int port = testing::free_port();
  std::string key = testing::fresh_key("nccl_vs_inproc");
  std::atomic<bool> skip{false};
  testing::run_ranks(world, [&](int rank) {
    auto o = testing::world_options(backend, rank, world, port, key);
    o.cuda_device = rank;
    auto c = make_communicator(o);
    if (!c.ok()) {
      if (backend == "nccl") skip = true;
      ASSERT_TRUE(backend == "nccl") << c.status().to_string();
      return;
    }
    at::Tensor base = at::randn({world * 256}, at::Generator(at::detail::createCPUGenerator(3 + rank)));
    at::Tensor rs = at::empty({256});
    ASSERT_TRUE((*c)->reduce_scatter(base, rs, ReduceOp::sum).ok());
    at::Tensor ag = at::empty({world * world * 256});
    ASSERT_TRUE((*c)->all_gather(base, ag).ok());
    at::Tensor ar = base.to(at::kBFloat16);
    ASSERT_TRUE((*c)->all_reduce(ar, ReduceOp::max).ok());
    at::Tensor bc = base.clone();
    ASSERT_TRUE((*c)->broadcast(bc, 0).ok());
    ASSERT_TRUE((*c)->barrier().ok());
    out[rank] = {rs, ag, ar, bc};
  });
  *skipped = skip;
  return out;
}

TEST(Nccl, MatchesInprocWhereDevicesExist) {
  for (int world : {1, 2}) {
    bool skipped = false;
    auto nccl = run_ops("nccl", world, &skipped);
    if (skipped) {
      if (world == 1) GTEST_SKIP() << "no CUDA device";
      continue;  // fewer than two devices: world 2 cannot run
    }
    bool unused = false;
    auto inproc = run_ops("inproc", world, &unused);
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(at::allclose(nccl[r][0], inproc[r][0], 1e-6, 1e-6)) << "reduce_scatter " << r;
      EXPECT_TRUE(at::equal(nccl[r][1], inproc[r][1])) << "all_gather " << r;
      EXPECT_TRUE(at::equal(nccl[r][2], inproc[r][2])) << "all_reduce max " << r;
      EXPECT_TRUE(at::equal(nccl[r][3], inproc[r][3])) << "broadcast " << r;
    }
  }
}

}  // namespace
}  // namespace tessera::collective
