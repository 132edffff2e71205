// NCCL backend against the in-process backend (CUDA builds only; label gpu). World 1 needs one
// GPU; world 2 (threads as ranks, one device each) needs two. Without devices the tests skip.
#include <torch/torch.h>

#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <functional>

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

bool two_devices() {
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess && devices >= 2;
}

// Runs `body(rank, device, communicator)` on two ranks, one CUDA device and NCCL communicator each.
void on_two_gpus(const char* name, const std::function<void(int, const c10::Device&, Communicator&)>& body) {
  const int world = 2;
  int port = testing::free_port();
  std::string key = testing::fresh_key(name);
  testing::run_ranks(world, [&](int rank) {
    const c10::Device device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(rank));
    c10::cuda::CUDAGuard guard(device);
    auto o = testing::world_options("nccl", rank, world, port, key);
    o.cuda_device = rank;
    auto c = make_communicator(o);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    body(rank, device, **c);
  });
}

// A square matrix of `rank + 1` pushed through `steps` matmuls with 1.0001 * I on the current
// stream: a producer that is still running when the host moves on (hundreds of ms at 2048).
at::Tensor slow_product(int rank, const c10::Device& device, int64_t n, int steps) {
  at::Tensor w = at::eye(n, at::TensorOptions(at::kFloat).device(device)) * 1.0001;
  at::Tensor x = at::full({n, n}, static_cast<float>(rank + 1), at::TensorOptions(at::kFloat).device(device));
  for (int i = 0; i < steps; ++i) x = at::matmul(x, w);
  return x;
}

// Note [NCCL on device tensors]: a collective on a tensor that a long kernel is still writing must
// wait for that kernel (the communicator's stream waits on the caller's), and the kernel that reads
// the result must wait for the collective (the caller's stream waits on the communicator's). No
// host synchronisation in between: a missing event wait reads a half-written or stale buffer.
TEST(Nccl, InPlaceDeviceTensorsAreOrderedAfterTheirProducer) {
  if (!two_devices()) GTEST_SKIP() << "needs two CUDA devices";
  std::vector<at::Tensor> results(2);
  on_two_gpus("nccl_in_place", [&](int rank, const c10::Device& device, Communicator& c) {
    at::Tensor flat = slow_product(rank, device, 2048, 200).view(-1);
    ASSERT_TRUE(c.all_reduce(flat, ReduceOp::sum).ok());
    results[rank] = (flat * 2).to(at::kCPU);  // read on the caller's stream right after the call
  });
  const at::Tensor expected = at::full({2048 * 2048}, 3.0f) * std::pow(1.0001f, 200.0f) * 2;
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(results[r].defined());
    EXPECT_TRUE(at::allclose(results[r], expected, 1e-4, 1e-4)) << "rank " << r;
  }
}

// Note [Deferred collectives] on NCCL: a started all-gather is queued after its input's producer
// and runs beside the caller's later kernels; after wait() the caller's stream reads the result.
TEST(Nccl, StartedAllGatherIsOrderedByWait) {
  if (!two_devices()) GTEST_SKIP() << "needs two CUDA devices";
  std::vector<at::Tensor> results(2);
  on_two_gpus("nccl_started", [&](int rank, const c10::Device& device, Communicator& c) {
    at::Tensor x = slow_product(rank, device, 1024, 100);
    at::Tensor out = at::empty({2 * 1024 * 1024}, x.options());
    auto started = c.start_all_gather(x.view(-1), out);
    ASSERT_TRUE(started.ok()) << started.status().to_string();
    at::Tensor busy = slow_product(rank, device, 1024, 100);  // compute beside the collective
    ASSERT_TRUE(started->wait().ok());
    results[rank] = (out * 2).to(at::kCPU);
  });
  const float scale = std::pow(1.0001f, 100.0f) * 2;
  const at::Tensor expected = at::cat({at::full({1024 * 1024}, 1.0f * scale), at::full({1024 * 1024}, 2.0f * scale)});
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(results[r].defined());
    EXPECT_TRUE(at::allclose(results[r], expected, 1e-4, 1e-4)) << "rank " << r;
  }
}

}  // namespace
}  // namespace tessera::collective
