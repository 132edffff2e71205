// bench_models: forward throughput of a ~20M-parameter decoder on CPU, beside the fp32 matmul
// roofline measured in the same run. Both report FLOP/s as the counter "flops", so bench/run can
// print model FLOP/s as a fraction of matmul FLOP/s.
//
// Model: hidden 512, 6 layers, 8 heads, intermediate 1536, vocab 8192, batch 8 x 256 tokens.
// FLOPs per forward = 2 * (matmul parameters) * tokens + attention (4 * B * T^2 * hidden per layer,
// the full T x T scores and probs x V). Threads: torch::set_num_threads(OMP_NUM_THREADS or 2).
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <cstdlib>

#include "bench/bench_util.hpp"
#include "workers/models/model.hpp"

namespace {

using tessera::models::CausalLM;
using tessera::models::ModelConfig;

constexpr int64_t kBatch = 8, kSeq = 256;

ModelConfig bench_config() { return tessera::bench::bench_decoder_config("qwen2", 1536); }

double forward_flops(const ModelConfig& c, int64_t batch, int64_t seq) {
  const double tokens = static_cast<double>(batch * seq);
  const double h = c.hidden_size, i = c.intermediate_size, kv = c.num_key_value_heads * c.head_dim;
  const double per_layer = h * h * 2 + h * kv * 2 + 3 * h * i;  // q, o, k, v, gate/up/down
  const double matmul_params = c.num_hidden_layers * per_layer + h * c.vocab_size;
  const double attention = c.num_hidden_layers * 4.0 * batch * seq * seq * h;
  return 2.0 * matmul_params * tokens + attention;
}

void BM_models_forward(benchmark::State& state) {
  const int64_t B = state.range(0), T = state.range(1);
  auto model = CausalLM::create(bench_config(), tessera::models::ModelInit{at::kFloat, 1});
  if (!model.ok()) {
    state.SkipWithError(model.status().to_string().c_str());
    return;
  }
  at::Tensor ids = at::randint(0, 8192, {B, T}, at::kLong);
  at::Tensor mask = at::ones({B, T}, at::kLong);
  at::Tensor pos = at::arange(T, at::kLong).unsqueeze(0).expand({B, T}).contiguous();
  torch::NoGradGuard no_grad;
  for (auto _ : state) benchmark::DoNotOptimize((*model)->forward(ids, mask, pos));
  int64_t params = 0;
  for (const auto& p : (*model)->parameters()) params += p.numel();
  state.SetItemsProcessed(state.iterations() * B * T);  // tokens/s
  state.counters["flops"] = benchmark::Counter(forward_flops(bench_config(), B, T) * state.iterations(),
                                               benchmark::Counter::kIsRate);
  state.counters["params_M"] = static_cast<double>(params) / 1e6;
}
BENCHMARK(BM_models_forward)->Args({kBatch, kSeq})->Unit(benchmark::kMillisecond)->UseRealTime();

// The roofline: one fp32 matmul the shape of the MLP's up-projection on the same tokens.
void BM_models_matmul_fp32(benchmark::State& state) {
  const int64_t M = state.range(0), K = state.range(1), N = state.range(2);
  at::Tensor a = at::randn({M, K}), b = at::randn({K, N});
  for (auto _ : state) benchmark::DoNotOptimize(at::matmul(a, b));
  state.counters["flops"] = benchmark::Counter(2.0 * M * K * N * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_models_matmul_fp32)->Args({kBatch * kSeq, 512, 1536})->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) { return tessera::bench::run_benchmarks(argc, argv, "OMP_NUM_THREADS"); }
