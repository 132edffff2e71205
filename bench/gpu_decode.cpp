// gpu_decode: the rollout engine's decode throughput on the GPU issue's workload, beside the
// limits of the same card measured in the same run.
//
//   gpu_decode [--device cuda] [--prompts 64] [--n 8] [--prompt-len 60] [--response 256]
//              [--model qwen2.5-0.5b] [--layers 24] [--json OUT] [--attention heads] [--sampler fused]
//              [--fused-layers true]
//              [--split-decode-attention true] [--tail-rows 4] [--tail-prompt-len 3800] [--turn-tokens 64]
//
// Model: the Qwen2.5-0.5B shape (hidden 896, 24 layers, 14 heads over 2 KV heads, MLP 4864,
// vocabulary 151936, tied embeddings), random init, bf16 on a GPU (fp32 on the CPU, for a smoke
// run); `--model qwen3-moe`: layers of Qwen3-30B-A3B (hidden 2048, 32 heads over 4 KV heads of
// 128, 128 experts of 768, 8 per token; 4 layers unless --layers says otherwise), whose experts run
// as grouped GEMMs (Note [MoE experts]); a decode step of many rows reads every expert. Workload: `prompts` random prompts x n samples (interleaved, as the trainer repeats them),
// `response` tokens each (ignore_eos, sampled at temperature 1), all in flight at once. Runs the
// engine eagerly and with CUDA graphs (enforce_eager=false), each after one warm-up call, and
// reports decode tokens/s (generated tokens over the decode steps' time), the step time, and
// generate tokens/s (over the whole call, as HF's `generate` figure in bench/hf_grpo_baseline.py).
// The eager and graph runs use the heads attention kernel (engine_kwargs.tessera.decode_attention
// =heads); on a GPU the graph run is repeated with the tiled kernel (=tiled, what the default
// `kernel` picks where it runs and a KV group has more than 4 query heads), so both kernels are
// compared in one run; a
// failure of that run is reported beside the other figures rather than ending the benchmark.
//
// The tail: `tail-rows` prompts of `tail-prompt-len` tokens (n = 1), `response` tokens each, with
// CUDA graphs, decoded with each row's context cut into parts (Note [Split decode attention]) and
// whole (split_decode_attention=false): the end of a rollout with long-tailed response lengths,
// where a few long rows are all that is left.
//
// Two turns (a multi-turn rollout's): each conversation of the workload, then its sequence plus
// `turn-tokens` random tokens (a tool's answer) for a second turn of response / 2 tokens, with
// CUDA graphs, in a rollout session (Note [Prefix cache]: the second turn prefills only the new
// tokens and replays the first turn's graphs) and without one; the second turn's time, prefill
// time and tokens are reported side by side.
//
// The limits: HBM bandwidth (a 2 GiB device-to-device copy: bytes read + written per second)
// and the bf16 matmul rate (8192^3), timed right after. Per decode step the engine must read
// every weight once (the tied lm_head included) and every live row's keys and values (the
// average context of this fixed-length workload is prompt + response / 2), and compute
// 2 x matmul parameters x rows plus the attention FLOPs; the fractions are those amounts over
// the step time, divided by the measured limits.
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "workers/models/model.hpp"
#include "workers/models/param_count.hpp"
#include "workers/rollout/kv_engine.hpp"

namespace {

using namespace tessera;

struct Args {
  std::string device = "cuda";
  std::string model = "qwen2.5-0.5b";
  int64_t prompts = 64, n = 8, prompt_len = 60, response = 256, layers = 0;  // layers 0: the model's
  std::string json;
  // The engine_kwargs.tessera keys of the runs (the tiled run sets its own attention).
  std::string attention = "heads", sampler = "fused";
  bool fused_layers = true, split = true;
  int64_t tail_rows = 4, tail_prompt_len = 3800;
  int64_t turn_tokens = 64;
};

models::ModelConfig qwen25_05b(int64_t layers) {
  models::ModelConfig c;
  c.architecture = "Qwen2ForCausalLM";
  c.model_type = "qwen2";
  c.vocab_size = 151936;
  c.hidden_size = 896;
  c.intermediate_size = 4864;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 14;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.rope_theta = 1e6;
  c.max_position_embeddings = 4096;
  c.tie_word_embeddings = true;
  c.attention_bias = true;
  return c;
}

// Qwen3-30B-A3B's shape with `layers` layers.
models::ModelConfig qwen3_30b_a3b(int64_t layers) {
  models::ModelConfig c;
  c.architecture = "Qwen3MoeForCausalLM";
  c.model_type = "qwen3_moe";
  c.vocab_size = 151936;
  c.hidden_size = 2048;
  c.intermediate_size = 6144;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 4;
  c.head_dim = 128;
  c.rope_theta = 1e6;
  c.max_position_embeddings = 40960;
  c.moe.num_experts = 128;
  c.moe.num_experts_per_tok = 8;
  c.moe.moe_intermediate_size = 768;
  c.moe.norm_topk_prob = true;
  return c;
}

void synchronize(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

double seconds(const std::function<void()>& fn, const c10::Device& device, int reps) {
  fn();  // warm-up
  synchronize(device);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) fn();
  synchronize(device);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

struct Run {
  double decode_tok_s = 0, generate_tok_s = 0, step_ms = 0, generate_s = 0;
  int64_t steps = 0, graph_steps = 0;
};

// `rows` prompts of `len` random tokens, each repeated n times in a row (the trainer's interleave).
Result<proto::DataProto> random_prompts(int64_t prompts, int64_t n, int64_t len, int64_t vocab) {
  const int64_t rows = prompts * n;
  at::Tensor ids =
      at::randint(3, vocab, {prompts, len}, at::detail::createCPUGenerator(3), at::kLong).repeat_interleave(n, 0);
  at::Tensor mask = at::ones({rows, len}, at::kLong);
  at::Tensor pos = at::arange(len, at::kLong).repeat({rows, 1});
  TESSERA_ASSIGN_OR_RETURN(auto batch, proto::DataProto::from_dict(
                                           {{"input_ids", ids}, {"attention_mask", mask}, {"position_ids", pos}}));
  batch.meta_info()["eos_token_id"] = 151643;
  batch.meta_info()["pad_token_id"] = 151643;
  return batch;
}

// A run of the engine over `prompts` (prompt_len x n rows), after a warm-up call.
Result<Run> run_engine(std::shared_ptr<models::CausalLM> model, const proto::DataProto& prompts, Args a, bool graphs,
                       c10::ScalarType dtype, const std::string& attention) {
  rollout::RolloutConfig cfg;
  cfg.decode_attention = attention;
  cfg.split_decode_attention = a.split;
  cfg.sampler = a.sampler;
  cfg.fused_layers = a.fused_layers;
  cfg.dtype = dtype == at::kBFloat16 ? "bfloat16" : "float32";
  cfg.prompt_length = a.prompt_len;
  cfg.response_length = a.response;
  cfg.ignore_eos = true;
  cfg.max_num_seqs = a.prompts * a.n;
  cfg.max_num_batched_tokens = 8192;
  cfg.n = a.n;
  cfg.enforce_eager = !graphs;
  TESSERA_ASSIGN_OR_RETURN(auto engine, rollout::KVCacheEngine::create(model, cfg, rollout::EngineOptions{1}));
  TESSERA_RETURN_IF_ERROR(engine->generate_sequences(prompts).status());  // warm-up
  TESSERA_RETURN_IF_ERROR(engine->generate_sequences(prompts).status());
  const rollout::GenerationStats& s = engine->last_stats();
  Run r;
  r.steps = s.decode_steps;
  r.graph_steps = s.graph_replays;
  r.step_ms = 1e3 * s.decode_seconds / static_cast<double>(std::max<int64_t>(1, s.decode_steps));
  r.decode_tok_s = static_cast<double>(s.generated_tokens - s.rows) / s.decode_seconds;  // first tokens: prefill
  r.generate_s = s.total_seconds;
  r.generate_tok_s = static_cast<double>(s.generated_tokens) / s.total_seconds;  // HF's generate figure
  return r;
}

struct TurnsRun {
  double turn2_s = 0, turn2_prefill_s = 0;
  int64_t turn2_prefill_tokens = 0, turn2_cached_tokens = 0, turn2_graphs_captured = 0;
};

// Two turns of the workload (see the header), in a session or not, after a warm-up pass.
Result<TurnsRun> run_turns(std::shared_ptr<models::CausalLM> model, const proto::DataProto& prompts, const Args& a,
                           c10::ScalarType dtype, bool session) {
  rollout::RolloutConfig cfg;
  cfg.decode_attention = a.attention;
  cfg.split_decode_attention = a.split;
  cfg.sampler = a.sampler;
  cfg.fused_layers = a.fused_layers;
  cfg.dtype = dtype == at::kBFloat16 ? "bfloat16" : "float32";
  cfg.prompt_length = a.prompt_len + a.response + a.turn_tokens;
  cfg.response_length = a.response;
  cfg.ignore_eos = true;
  cfg.max_num_seqs = a.prompts * a.n;
  cfg.max_num_batched_tokens = 8192;
  cfg.enforce_eager = false;
  TESSERA_ASSIGN_OR_RETURN(auto engine, rollout::KVCacheEngine::create(model, cfg, rollout::EngineOptions{1}));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor ids, prompts.tensor("input_ids"));
  rollout::TokenRequests first;
  for (int64_t r = 0; r < ids.size(0); ++r) {
    at::Tensor row = ids[r].contiguous();
    first.prompts.emplace_back(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel());
  }
  first.eos_token_ids = {151643};
  first.seed = 1;
  const at::Tensor answers = at::randint(3, 151000, {ids.size(0), a.turn_tokens}, at::detail::createCPUGenerator(5), at::kLong);
  TurnsRun out;
  for (int pass = 0; pass < 2; ++pass) {  // the first pass warms up
    rollout::EngineSession scope(*engine, session, ids.size(0));
    TESSERA_ASSIGN_OR_RETURN(std::vector<rollout::GeneratedRow> turn1, engine->generate_tokens(first));
    rollout::TokenRequests second = first;
    second.seed = 2;
    for (size_t r = 0; r < turn1.size(); ++r) {
      auto& p = second.prompts[r];
      p.insert(p.end(), turn1[r].tokens.begin(), turn1[r].tokens.end());
      const int64_t* answer = answers[static_cast<int64_t>(r)].data_ptr<int64_t>();
      p.insert(p.end(), answer, answer + a.turn_tokens);
      second.max_tokens.push_back(std::max<int64_t>(1, a.response / 2));
    }
    TESSERA_RETURN_IF_ERROR(engine->generate_tokens(second).status());
    const rollout::GenerationStats& s = engine->last_stats();
    out = {s.total_seconds, s.prefill_seconds, s.prefill_tokens, s.cached_prompt_tokens, s.graphs_captured};
  }
  return out;
}

int run(const Args& a) {
  const c10::Device device(a.device);
  const c10::ScalarType dtype = device.is_cuda() ? at::kBFloat16 : at::kFloat;
  if (a.model != "qwen2.5-0.5b" && a.model != "qwen3-moe") {
    std::fprintf(stderr, "gpu_decode: --model %s: expected qwen2.5-0.5b or qwen3-moe\n", a.model.c_str());
    return 2;
  }
  const bool moe = a.model == "qwen3-moe";
  const int64_t layers = a.layers > 0 ? a.layers : moe ? 4 : 24;
  const models::ModelConfig config = moe ? qwen3_30b_a3b(layers) : qwen25_05b(layers);
  auto created = models::CausalLM::create(config, models::ModelInit{dtype, 1});
  if (!created.ok()) {
    std::fprintf(stderr, "gpu_decode: %s\n", created.status().to_string().c_str());
    return 1;
  }
  std::shared_ptr<models::CausalLM> model = *created;
  model->to(device);
  const int64_t rows = a.prompts * a.n;
  auto prompts = random_prompts(a.prompts, a.n, a.prompt_len, config.vocab_size);
  if (!prompts.ok()) return 1;

  auto eager = run_engine(model, *prompts, a, /*graphs=*/false, dtype, a.attention);
  auto graphs = device.is_cuda() ? run_engine(model, *prompts, a, /*graphs=*/true, dtype, a.attention) : eager;
  for (const auto* r : {&eager, &graphs}) {
    if (!r->ok()) {
      std::fprintf(stderr, "gpu_decode: %s\n", r->status().to_string().c_str());
      return 1;
    }
  }
  Run tiled;  // zeros where it did not run (the CPU) or failed
  if (device.is_cuda()) {
    auto tiled_run = run_engine(model, *prompts, a, /*graphs=*/true, dtype, "tiled");
    if (tiled_run.ok()) tiled = *tiled_run;
    else std::printf("tiled attention: %s\n", tiled_run.status().to_string().c_str());
  }
  // The tail (see the header): the same graph engine with rows cut into parts and whole.
  Run tail_split, tail_whole;
  const int64_t tail_prompt = std::max<int64_t>(1, std::min(a.tail_prompt_len, config.max_position_embeddings - a.response));
  if (device.is_cuda() && a.tail_rows > 0 && a.attention == "gather") {
    std::printf("tail: not run (--attention=gather reads no paged kernel, so there are no parts to compare)\n");
  } else if (device.is_cuda() && a.tail_rows > 0) {
    Args t = a;
    t.prompts = a.tail_rows;
    t.n = 1;
    t.prompt_len = tail_prompt;
    auto tail_prompts = random_prompts(t.prompts, 1, t.prompt_len, config.vocab_size);
    if (!tail_prompts.ok()) return 1;
    for (bool split : {true, false}) {
      if (split && !a.split) continue;  // --split-decode-attention=false: the whole rows only
      t.split = split;
      auto r = run_engine(model, *tail_prompts, t, /*graphs=*/true, dtype, a.attention);
      if (r.ok()) (split ? tail_split : tail_whole) = *r;
      else std::printf("tail, split_decode_attention=%d: %s\n", split, r.status().to_string().c_str());
    }
  }

  // Two turns, with and without the session's prefix cache (see the header).
  TurnsRun turns_plain, turns_session;
  if (a.turn_tokens > 0) {  // on the CPU too: a smoke run
    for (bool session : {false, true}) {
      auto r = run_turns(model, *prompts, a, dtype, session);
      if (r.ok()) (session ? turns_session : turns_plain) = *r;
      else std::printf("two turns, session=%d: %s\n", session, r.status().to_string().c_str());
    }
  }

  // The card's limits, in the same run.
  const auto opts = at::TensorOptions(dtype).device(device);
  const int64_t elements = device.is_cuda() ? int64_t{1} << 30 : int64_t{1} << 26;  // 2 GiB each in bf16
  at::Tensor src = at::empty({elements}, opts), dst = at::empty_like(src);
  const double copy_s = seconds([&] { dst.copy_(src); }, device, 10);
  const double bandwidth = 2.0 * static_cast<double>(src.numel() * src.element_size()) / copy_s;
  src = dst = at::Tensor();
  const int64_t m = device.is_cuda() ? 8192 : 1024;
  at::Tensor x = at::randn({m, m}, opts), y = at::randn({m, m}, opts);
  const double mm_s = seconds([&] { at::matmul(x, y); }, device, 10);
  const double peak = 2.0 * static_cast<double>(m) * m * m / mm_s;

  // What one decode step must move and compute (see the header).
  const int64_t h = config.hidden_size, kv = config.num_key_value_heads * config.head_dim;
  const double matmul_params = models::decoder_matmul_params(config) + static_cast<double>(h) * config.vocab_size;
  // Weights read per step: a MoE layer's every expert some row picks (all of them, at these rows).
  models::ModelConfig read = config;
  read.moe.num_experts_per_tok = std::min<int64_t>(config.moe.num_experts, rows * config.moe.num_experts_per_tok);
  const double read_params = models::decoder_matmul_params(read) + static_cast<double>(h) * config.vocab_size;
  const double element = static_cast<double>(c10::elementSize(dtype));
  const double context = static_cast<double>(a.prompt_len) + a.response / 2.0;
  const double kv_bytes = rows * context * config.num_hidden_layers * 2.0 * kv * element;
  const double bytes = read_params * element + kv_bytes;
  const double flops = 2.0 * matmul_params * rows +
                       4.0 * rows * context * config.num_attention_heads * config.head_dim * config.num_hidden_layers;
  const double step_s = graphs->step_ms / 1e3;
  nlohmann::json out = {{"device", device.str()},
                        {"model", a.model},
                        {"layers", layers},
                        {"rows", rows},
                        {"eager_decode_tok_s", eager->decode_tok_s},
                        {"eager_step_ms", eager->step_ms},
                        {"graph_decode_tok_s", graphs->decode_tok_s},
                        {"graph_step_ms", graphs->step_ms},
                        {"graph_steps", graphs->graph_steps},
                        {"steps", graphs->steps},
                        {"generate_s", graphs->generate_s},
                        {"eager_generate_tok_s", eager->generate_tok_s},
                        {"graph_generate_tok_s", graphs->generate_tok_s},
                        {"tiled_graph_decode_tok_s", tiled.decode_tok_s},
                        {"tiled_graph_step_ms", tiled.step_ms},
                        {"tiled_graph_generate_tok_s", tiled.generate_tok_s},
                        {"tail_rows", a.tail_rows},
                        {"tail_context", tail_prompt + a.response},
                        {"tail_split_step_ms", tail_split.step_ms},
                        {"tail_whole_step_ms", tail_whole.step_ms},
                        {"hbm_bytes_per_s", bandwidth},
                        {"matmul_flops_per_s", peak},
                        {"step_bytes", bytes},
                        {"step_flops", flops},
                        {"turn2_s", turns_plain.turn2_s},
                        {"turn2_prefill_s", turns_plain.turn2_prefill_s},
                        {"turn2_prefill_tokens", turns_plain.turn2_prefill_tokens},
                        {"turn2_graphs_captured", turns_plain.turn2_graphs_captured},
                        {"session_turn2_s", turns_session.turn2_s},
                        {"session_turn2_prefill_s", turns_session.turn2_prefill_s},
                        {"session_turn2_prefill_tokens", turns_session.turn2_prefill_tokens},
                        {"session_turn2_cached_tokens", turns_session.turn2_cached_tokens},
                        {"session_turn2_graphs_captured", turns_session.turn2_graphs_captured},
                        {"bandwidth_fraction", bytes / step_s / bandwidth},
                        {"matmul_fraction", flops / step_s / peak}};
  std::printf("| decode, %ld rows on %s | eager | CUDA graphs | CUDA graphs, tiled attention |\n|---|---|---|---|\n",
              rows, device.str().c_str());
  std::printf("| decode tokens/s | %.0f | %.0f | %.0f |\n| step | %.2f ms | %.2f ms | %.2f ms |\n", eager->decode_tok_s,
              graphs->decode_tok_s, tiled.decode_tok_s, eager->step_ms, graphs->step_ms, tiled.step_ms);
  std::printf("| generate tokens/s (prefill included) | %.0f | %.0f | %.0f |\n", eager->generate_tok_s,
              graphs->generate_tok_s, tiled.generate_tok_s);
  std::printf("limits: memory %.2f TB/s, %s matmul %.1f TFLOP/s; a step moves %.2f GB (%.0f%% of the bandwidth "
              "limit at the graph step time) and computes %.0f GFLOP (%.0f%% of the matmul peak)\n",
              bandwidth / 1e12, c10::toString(dtype), peak / 1e12, bytes / 1e9, 100.0 * bytes / step_s / bandwidth, flops / 1e9,
              100.0 * flops / step_s / peak);
  if (tail_split.steps > 0 && tail_whole.steps > 0) {
    std::printf("tail: %ld rows of %ld-%ld positions, CUDA graphs: %.2f ms a step with each row cut into parts, "
                "%.2f ms whole (%.2fx)\n",
                a.tail_rows, tail_prompt, tail_prompt + a.response, tail_split.step_ms, tail_whole.step_ms,
                tail_whole.step_ms / tail_split.step_ms);
  }
  if (turns_plain.turn2_s > 0 && turns_session.turn2_s > 0) {
    std::printf("| second turn (+%ld tokens, %ld generated), %ld rows | without prefix cache | rollout session |\n"
                "|---|---|---|\n| time | %.3f s | %.3f s |\n| prefill | %.3f s, %ld tokens | %.3f s, %ld tokens "
                "(%ld from the cache) |\n| graphs captured | %ld | %ld |\n",
                a.turn_tokens, std::max<int64_t>(1, a.response / 2), rows, turns_plain.turn2_s, turns_session.turn2_s,
                turns_plain.turn2_prefill_s, turns_plain.turn2_prefill_tokens, turns_session.turn2_prefill_s,
                turns_session.turn2_prefill_tokens, turns_session.turn2_cached_tokens,
                turns_plain.turn2_graphs_captured, turns_session.turn2_graphs_captured);
  }
  if (!a.json.empty()) std::ofstream(a.json) << out.dump(2) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"Rollout decode throughput against the card's limits"};
  app.add_option("--device", a.device, "cuda | cuda:N | cpu (a smoke run)");
  app.add_option("--prompts", a.prompts, "Distinct prompts");
  app.add_option("--n", a.n, "Samples per prompt");
  app.add_option("--prompt-len", a.prompt_len, "Prompt tokens");
  app.add_option("--response", a.response, "Response tokens");
  app.add_option("--model", a.model, "qwen2.5-0.5b | qwen3-moe (layers of Qwen3-30B-A3B)");
  app.add_option("--layers", a.layers, "Decoder layers (default: 24 for qwen2.5-0.5b, 4 for qwen3-moe)");
  app.add_option("--json", a.json, "Write the figures here");
  app.add_option("--attention", a.attention, "engine_kwargs.tessera.decode_attention of the eager and graph runs");
  app.add_option("--sampler", a.sampler, "engine_kwargs.tessera.sampler: fused | torch");
  app.add_option("--fused-layers", a.fused_layers, "engine_kwargs.tessera.fused_layers: true | false");
  app.add_option("--split-decode-attention", a.split,
                 "engine_kwargs.tessera.split_decode_attention of every run but the tail's whole-row one: true | false");
  app.add_option("--tail-rows", a.tail_rows, "Rows of the tail run (0: none)");
  app.add_option("--tail-prompt-len", a.tail_prompt_len, "Prompt tokens of the tail run's rows");
  app.add_option("--turn-tokens", a.turn_tokens, "Tokens added before the second turn of the two-turn run (0: none)");
  CLI11_PARSE(app, argc, argv);
  return run(a);
}
