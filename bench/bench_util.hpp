// bench_util.hpp: what the single-process benchmark programs share: the ~20M-parameter decoder
// they time, and their main(). Header-only, no gtest: benchmarks include it directly.
#pragma once

#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "workers/models/config.hpp"

namespace tessera::bench {

/// The benchmark decoder: vocab 8192, hidden 512, 6 layers, 8 heads of dim 64 (no GQA), 1024
/// positions, MLP width `intermediate_size`; qwen2 gets q/k/v biases.
inline models::ModelConfig bench_decoder_config(const std::string& model_type, int64_t intermediate_size) {
  models::ModelConfig c;
  c.model_type = model_type;
  c.vocab_size = 8192;
  c.hidden_size = 512;
  c.intermediate_size = intermediate_size;
  c.num_hidden_layers = 6;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 8;
  c.head_dim = 64;
  c.max_position_embeddings = 1024;
  c.attention_bias = model_type == "qwen2";
  return c;
}

/// A benchmark main(): torch::set_num_threads from the positive integer in env `threads_env`
/// (else 2), then Google Benchmark over the registered benchmarks. Returns main's exit code (1 on
/// an unrecognised argument).
inline int run_benchmarks(int argc, char** argv, const char* threads_env) {
  const char* threads = std::getenv(threads_env);
  torch::set_num_threads(threads != nullptr && std::atoi(threads) > 0 ? std::atoi(threads) : 2);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace tessera::bench
