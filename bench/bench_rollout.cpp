// bench_rollout: the KV-cache rollout engine on a ~20M-parameter decoder (hidden 512, 6 layers,
// 8 heads, intermediate 1408, vocab 8192; 19M matmul parameters + two 4.2M embedding tables).
//
//   BM_rollout_decode/64            decode throughput at batch 64 (prompt 16, response 64, sampling,
//                                   ignore_eos). Counters: decode_tok_s, flops (= 2 * matmul
//                                   parameters per decoded token, per second of decode time) and
//                                   roofline_fraction (flops / the matmul rate below, timed in
//                                   the same benchmark right after). The *_cpu counters divide by
//                                   process CPU seconds (all threads) instead of wall seconds: on
//                                   a shared, oversubscribed machine they are the steadier ratio.
//   BM_rollout_matmul_roofline/64   the matmuls of one decode step at batch 64 (every layer's
//                                   q/k/v/o/gate/up/down plus lm_head), counter flops: the
//                                   roofline. bench/run: BM_rollout_decode/64 flops over this.
//   BM_rollout_kv_cache_short       greedy, batch 32, prompt 8, response 32, through the engine;
//   BM_rollout_no_cache_short       the same tokens by recomputing the full forward each step.
//                                   Ratio of real_time: the KV-cache speed-up (goal >= 5x); the
//                                   process_cpu_s counters (all threads) give the same ratio in
//                                   CPU work, which does not depend on how well the small decode
//                                   matmuls spread over the cores or on other load.
//   BM_rollout_continuous           128 prompts, 32 slots, response <= 128, a 256-token EOS list
//   BM_rollout_static               (geometric, long-tailed lengths): continuous vs static
//                                   batching on identical outputs. Ratio of real_time.
// Threads: torch::set_num_threads(2) (TESSERA_BENCH_THREADS overrides). Each benchmark runs one
// iteration of a few seconds at most on an idle 2-core machine.
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <time.h>

#include <chrono>
#include <cstdlib>

#include "bench/bench_util.hpp"
#include "workers/models/model.hpp"
#include "workers/models/param_count.hpp"
#include "workers/rollout/kv_engine.hpp"

namespace {

using tessera::models::CausalLM;
using tessera::models::ModelConfig;
using namespace tessera::rollout;

ModelConfig bench_config() { return tessera::bench::bench_decoder_config("llama", 1408); }

double matmul_params(const ModelConfig& c) {
  return tessera::models::decoder_matmul_params(c) + static_cast<double>(c.hidden_size) * c.vocab_size;
}

std::shared_ptr<CausalLM> bench_model() {
  static std::shared_ptr<CausalLM> model = [] {
    auto m = CausalLM::create(bench_config(), tessera::models::ModelInit{at::kFloat, 1});
    if (!m.ok()) throw std::runtime_error(m.status().to_string());
    return *m;
  }();
  return model;
}

tessera::proto::DataProto prompts(int64_t batch, int64_t width, uint64_t seed, nlohmann::json eos) {
  at::Tensor ids = at::randint(3, 8192, {batch, width}, at::detail::createCPUGenerator(seed), at::kLong);
  at::Tensor mask = at::ones({batch, width}, at::kLong);
  at::Tensor pos = at::arange(width, at::kLong).unsqueeze(0).expand({batch, width}).contiguous();
  tessera::proto::TensorDict t{{"input_ids", ids}, {"attention_mask", mask}, {"position_ids", pos}};
  return *tessera::proto::DataProto::from_dict(t, {}, {{"eos_token_id", eos}, {"pad_token_id", 0}});
}

RolloutConfig bench_rollout(int64_t response_length, int64_t slots) {
  RolloutConfig c;
  c.dtype = "float32";
  c.prompt_length = 16;
  c.response_length = response_length;
  c.max_num_seqs = slots;
  return c;
}

std::unique_ptr<KVCacheEngine> engine_for(const RolloutConfig& cfg) {
  auto e = KVCacheEngine::create(bench_model(), cfg, EngineOptions{7});
  if (!e.ok()) throw std::runtime_error(e.status().to_string());
  return std::move(*e);
}

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

struct StepTime {
  double wall = 1e30, cpu = 1e30;
};

// One decode step's matmuls at batch `batch`: the best wall and process-CPU time of `reps` runs.
StepTime matmul_step_seconds(int64_t batch, int reps) {
  const ModelConfig c = bench_config();
  auto params = bench_model()->parameter_map();
  at::Tensor x = at::randn({batch, c.hidden_size}), xi = at::randn({batch, c.intermediate_size});
  torch::NoGradGuard no_grad;
  StepTime best;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    const double c0 = process_cpu_seconds();
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      for (const char* w : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                            "mlp.gate_proj", "mlp.up_proj"}) {
        benchmark::DoNotOptimize(at::linear(x, params.at(p + w + ".weight")));
      }
      benchmark::DoNotOptimize(at::linear(xi, params.at(p + "mlp.down_proj.weight")));
    }
    benchmark::DoNotOptimize(at::linear(x, params.at("lm_head.weight")));
    best.wall = std::min(best.wall, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    best.cpu = std::min(best.cpu, process_cpu_seconds() - c0);
  }
  return best;
}

void BM_rollout_decode(benchmark::State& state) {
  const int64_t B = state.range(0);
  auto engine = engine_for(bench_rollout(/*response_length=*/64, B));
  auto batch = prompts(B, 16, 1, 0);
  engine->generate_sequences(prompts(2, 4, 2, 0));  // warm-up: allocator, code paths
  double decode_s = 0, decode_cpu_s = 0, decode_tokens = 0;
  int64_t generated = 0;
  for (auto _ : state) {
    auto out = engine->generate_sequences(batch);
    if (!out.ok()) {
      state.SkipWithError(out.status().to_string().c_str());
      return;
    }
    const GenerationStats& s = engine->last_stats();
    decode_s += s.decode_seconds;
    decode_cpu_s += s.decode_cpu_seconds;
    decode_tokens += static_cast<double>(s.generated_tokens - s.rows);  // first tokens come from prefill
    generated += s.generated_tokens;
  }
  const double work = 2.0 * matmul_params(bench_config()) * decode_tokens;
  const double step_work = 2.0 * matmul_params(bench_config()) * static_cast<double>(B);
  const StepTime roof = matmul_step_seconds(B, 5);
  state.SetItemsProcessed(generated);
  state.counters["decode_tok_s"] = decode_tokens / decode_s;
  state.counters["flops"] = work / decode_s;
  state.counters["roofline_flops"] = step_work / roof.wall;
  state.counters["roofline_fraction"] = (work / decode_s) / (step_work / roof.wall);
  state.counters["flops_cpu"] = work / decode_cpu_s;
  state.counters["roofline_fraction_cpu"] = (work / decode_cpu_s) / (step_work / roof.cpu);
}
BENCHMARK(BM_rollout_decode)->Arg(64)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_rollout_matmul_roofline(benchmark::State& state) {
  const int64_t B = state.range(0);
  matmul_step_seconds(B, 2);  // warm-up
  double wall = 0, cpu = 0;
  for (auto _ : state) {
    StepTime s = matmul_step_seconds(B, 1);
    state.SetIterationTime(s.wall);
    wall += s.wall;
    cpu += s.cpu;
  }
  const double work = 2.0 * matmul_params(bench_config()) * B * static_cast<double>(state.iterations());
  state.counters["flops"] = work / wall;
  state.counters["flops_cpu"] = work / cpu;
}
BENCHMARK(BM_rollout_matmul_roofline)->Arg(64)->Unit(benchmark::kMillisecond)->UseManualTime();

constexpr int64_t kShortBatch = 32, kShortPrompt = 8, kShortResponse = 32;

void BM_rollout_kv_cache_short(benchmark::State& state) {
  RolloutConfig cfg = bench_rollout(kShortResponse, kShortBatch);
  cfg.do_sample = false;
  cfg.ignore_eos = true;
  auto engine = engine_for(cfg);
  auto batch = prompts(kShortBatch, kShortPrompt, 3, 0);
  const double c0 = process_cpu_seconds();
  for (auto _ : state) benchmark::DoNotOptimize(engine->generate_sequences(batch));
  state.counters["process_cpu_s"] = (process_cpu_seconds() - c0) / static_cast<double>(state.iterations());
  state.SetItemsProcessed(state.iterations() * kShortBatch * kShortResponse);
}
BENCHMARK(BM_rollout_kv_cache_short)->Unit(benchmark::kMillisecond)->UseRealTime();

// The baseline: greedy decoding that recomputes the whole prefix every step (no KV cache); the
// vocabulary head runs on the last position only, as the engine's does.
void BM_rollout_no_cache_short(benchmark::State& state) {
  auto model = bench_model();
  auto batch = prompts(kShortBatch, kShortPrompt, 3, 0);
  torch::NoGradGuard no_grad;
  const double c0 = process_cpu_seconds();
  for (auto _ : state) {
    at::Tensor ids = *batch.tensor("input_ids");
    for (int64_t t = 0; t < kShortResponse; ++t) {
      const int64_t T = ids.size(1);
      at::Tensor mask = at::ones({kShortBatch, T}, at::kLong);
      at::Tensor pos = at::arange(T, at::kLong).unsqueeze(0).expand({kShortBatch, T});
      at::Tensor h = model->backbone().forward(ids, mask, pos).select(1, T - 1);
      at::Tensor next = at::linear(h, model->lm_head_weight()).argmax(1, /*keepdim=*/true);
      ids = at::cat({ids, next}, 1);
    }
    benchmark::DoNotOptimize(ids);
  }
  state.counters["process_cpu_s"] = (process_cpu_seconds() - c0) / static_cast<double>(state.iterations());
  state.SetItemsProcessed(state.iterations() * kShortBatch * kShortResponse);
}
BENCHMARK(BM_rollout_no_cache_short)->Unit(benchmark::kMillisecond)->UseRealTime();

// 256 EOS ids out of 8192: each step stops a row with probability ~3%, so lengths are geometric
// (mean ~30) with a long tail up to the 128-token cap.
void run_long_tail(benchmark::State& state, BatchingMode mode) {
  RolloutConfig cfg = bench_rollout(/*response_length=*/128, /*slots=*/32);
  cfg.batching = mode;
  auto engine = engine_for(cfg);
  nlohmann::json eos = nlohmann::json::array();
  for (int64_t i = 0; i < 256; ++i) eos.push_back(100 + 31 * i);
  auto batch = prompts(128, 16, 4, eos);
  int64_t generated = 0, row_steps = 0, steps = 0;
  for (auto _ : state) {
    auto out = engine->generate_sequences(batch);
    if (!out.ok()) {
      state.SkipWithError(out.status().to_string().c_str());
      return;
    }
    generated += engine->last_stats().generated_tokens;
    row_steps += engine->last_stats().decode_row_steps;
    steps += engine->last_stats().decode_steps;
  }
  state.SetItemsProcessed(generated);
  state.counters["decode_steps"] = static_cast<double>(steps);
  state.counters["row_steps_per_token"] = static_cast<double>(row_steps) / static_cast<double>(generated);
}

void BM_rollout_continuous(benchmark::State& state) { run_long_tail(state, BatchingMode::continuous); }
void BM_rollout_static(benchmark::State& state) { run_long_tail(state, BatchingMode::static_waves); }
BENCHMARK(BM_rollout_continuous)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_rollout_static)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) { return tessera::bench::run_benchmarks(argc, argv, "TESSERA_BENCH_THREADS"); }
