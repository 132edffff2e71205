// bench_collective: Gloo all_gather / reduce_scatter / all_reduce bandwidth between two processes
// on 64 MiB, next to memcpy bandwidth measured in the same run (bytes/s, so bench/run can print
// the fraction).
//
// The benchmark process is rank 0. It forks and re-executes itself as rank 1 (the "peer", with
// TESSERA_BENCH_COLL_PEER=<port> in its environment and stdout sent to /dev/null so the JSON on
// stdout stays clean). Google Benchmark chooses iteration counts only on rank 0, so before every
// operation rank 0 broadcasts a two-element command {op, numel}; the peer executes the same
// operation, and quits on op == kQuit. The command broadcast is 16 bytes, negligible next to a
// 64 MiB collective.
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <cstdlib>
#include <cstring>

#include "bench/bench_peer.hpp"
#include "runtime/collective/communicator.hpp"

namespace {

using tessera::collective::Communicator;
using tessera::collective::ReduceOp;

constexpr const char* kPeerEnv = "TESSERA_BENCH_COLL_PEER";
constexpr int64_t kBytes = int64_t{64} << 20;
constexpr int64_t kFloats = kBytes / 4;

enum Op : int64_t { kQuit = 0, kAllGather = 1, kReduceScatter = 2, kAllReduce = 3 };

std::shared_ptr<Communicator> g_comm;  // rank 0's communicator, shared by the benchmarks

std::shared_ptr<Communicator> connect(int rank, int port) {
  tessera::collective::CommunicatorOptions o;
  o.backend = "gloo";
  o.rank = rank;
  o.world_size = 2;
  o.master_port = port;
  o.gloo_hostname = "127.0.0.1";
  o.timeout = std::chrono::milliseconds(120000);
  auto c = tessera::collective::make_communicator(o);
  if (!c.ok()) {
    std::fprintf(stderr, "bench_collective rank %d: %s\n", rank, c.status().to_string().c_str());
    std::exit(2);
  }
  return *c;
}

// Runs one operation of kind `op` on `numel` floats (the full buffer size); both ranks call it.
tessera::Status run_op(Communicator& c, int64_t op, int64_t numel, at::Tensor& full,
                       at::Tensor& half) {
  switch (op) {
    case kAllGather: return c.all_gather(half, full);
    case kReduceScatter: return c.reduce_scatter(full, half, ReduceOp::sum);
    case kAllReduce: return c.all_reduce(full, ReduceOp::sum);
    default: return tessera::Status(tessera::ErrorCode::invalid_argument, "unknown op");
  }
}

tessera::Status command(int64_t op, int64_t numel) {
  at::Tensor cmd = at::tensor({op, numel}, at::kLong);
  return g_comm->broadcast(cmd, 0);
}

int run_peer(int port) {
  auto comm = connect(1, port);
  at::Tensor full = at::ones({kFloats});
  at::Tensor half = at::ones({kFloats / 2});
  for (;;) {
    at::Tensor cmd = at::zeros({2}, at::kLong);
    if (!comm->broadcast(cmd, 0).ok()) return 3;
    int64_t op = cmd[0].item<int64_t>();
    if (op == kQuit) return 0;
    tessera::Status st = run_op(*comm, op, cmd[1].item<int64_t>(), full, half);
    if (!st.ok()) {
      std::fprintf(stderr, "bench_collective peer: %s\n", st.to_string().c_str());
      return 4;
    }
  }
}

void BM_coll_memcpy_64MiB(benchmark::State& state) {
  std::vector<char> src(kBytes, 1), dst(kBytes, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), kBytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kBytes);
}

void bench_gloo(benchmark::State& state, Op op) {
  at::Tensor full = at::ones({kFloats});
  at::Tensor half = at::ones({kFloats / 2});
  for (auto _ : state) {
    tessera::Status st = command(op, kFloats);
    if (st.ok()) st = run_op(*g_comm, op, kFloats, full, half);
    if (!st.ok()) {
      state.SkipWithError(st.to_string().c_str());
      break;
    }
  }
  // Bytes of the full 64 MiB buffer per operation (gathered output / scattered input / reduced).
  state.SetBytesProcessed(state.iterations() * kBytes);
}

void BM_coll_gloo_all_gather_64MiB(benchmark::State& s) { bench_gloo(s, kAllGather); }
void BM_coll_gloo_reduce_scatter_64MiB(benchmark::State& s) { bench_gloo(s, kReduceScatter); }
void BM_coll_gloo_all_reduce_64MiB(benchmark::State& s) { bench_gloo(s, kAllReduce); }

BENCHMARK(BM_coll_memcpy_64MiB)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_coll_gloo_all_gather_64MiB)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_coll_gloo_reduce_scatter_64MiB)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_coll_gloo_all_reduce_64MiB)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  if (const char* port = std::getenv(kPeerEnv)) return run_peer(std::atoi(port));
  const auto launch = tessera::bench::init_and_spawn_peer(&argc, argv, kPeerEnv);
  if (!launch) return 1;
  g_comm = connect(0, launch->port);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  int rc = command(kQuit, 0).ok() ? 0 : 5;
  g_comm.reset();
  return tessera::bench::wait_peer(launch->peer, rc, 6);
}
