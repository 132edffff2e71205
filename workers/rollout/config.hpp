// config.hpp: verl's rollout config (`actor_rollout_ref.rollout.*`, reference/verl-fsdp.md §6.1)
// as a plain struct, parsed from the JSON form of that YAML subtree.
//
// Contract of parse_rollout_config():
//  - Every key verl v0.5.0 (and later releases) defines is accepted. Keys that drive Tessera's
//    KV-cache engine (sampling, lengths, slots, dtype, log-probs, ...) or that other Tessera
//    components read later (log_prob_* for the actor's recompute, layered_summon and
//    update_weights_bucket_megabytes for the sharding manager) are stored in RolloutConfig.
//  - Keys that only configure vLLM/SGLang (load_format,
//    engine_kwargs.vllm, ...) have no effect here. They are accepted and REPORTED: returned in
//    ParsedRolloutConfig::ignored_keys (full dotted names) and logged in one info line.
//  - A feature verl offers that Tessera does not implement is an `unimplemented` error when its
//    key asks for it (multi_turn.completion_callback, over_sample_rate>0, ...); its default
//    value is accepted and reported as ignored.
//  - An unknown key, or a value of the wrong JSON type, is an error naming the full key.
//  - null means "keep the default" for every key (OmegaConf's convention).
//
// Tessera's own engine knobs live under `engine_kwargs.tessera` (verl keeps engine-specific
// arguments under engine_kwargs.<engine>): `batching: continuous|static`, `placement:
// colocated|split`, `split_devices_per_node` (workers/rollout/split_weights.hpp), `kv_block_size`
// (tokens per block of the paged KV cache, paged_kv.hpp), `decode_attention: kernel|heads|tiled|gather`,
// `split_decode_attention`, `max_kv_blocks`, `sampler: fused|torch` (sampling.hpp), `fused_layers`,
// `tool_timeout_s` (multi-turn tool calls).
//
// RolloutConfig's own default tensor_model_parallel_size is 1 (a standalone engine is the whole
// model); the trainer's defaults (examples/config/ppo_trainer.yaml) carry verl's 2. A TP size > 1
// needs the rollout worker's TP group (sharding_manager.hpp, Note [Rollout TP resharding]).
//
// Thread-safety: plain values; the functions are re-entrant.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>
#include <nlohmann/json.hpp>

#include "proto/status.hpp"

namespace tessera::rollout {

/// Sampling knobs shared by the training rollout and validation (`val_kwargs`).
struct SamplingConfig {
  double temperature = 1.0;
  int64_t top_k = -1;   ///< -1 or 0 disables top-k.
  double top_p = 1.0;   ///< 1 disables nucleus filtering.
  int64_t n = 1;        ///< Samples per prompt; the TRAINER repeats prompts, the engine ignores it.
  bool do_sample = true;
};

/// How the engine fills its slots (engine_kwargs.tessera.batching).
enum class BatchingMode : uint8_t {
  continuous,  ///< A finished row's slot is refilled from the pending prompts at once.
  static_waves,  ///< "static": slots are refilled only when the whole wave has finished.
};

/// "continuous" / "static".
const char* to_string(BatchingMode mode);

/// multi_turn.*: verl's multi-turn rollout with tools (multi_turn.hpp). verl's SGLang rollout
/// reads the same keys.
struct MultiTurnConfig {
  bool enable = false;
  std::optional<int64_t> max_assistant_turns;  ///< null: max_model_len / 3, as verl.
  std::optional<int64_t> max_user_turns;       ///< null: max_model_len / 3, as verl.
  std::optional<std::string> tool_config_path;  ///< verl's tool YAML (`tools: [{class_name, config, tool_schema}]`).
  /// verl's interaction YAML (`interaction: [{name, class_name, config}]`): simulated users.
  std::optional<std::string> interaction_config_path;
  int64_t max_parallel_calls = 1;               ///< Tool calls executed per assistant turn.
  int64_t max_tool_response_length = 256;       ///< Characters of a tool's answer kept.
  std::string tool_response_truncate_side = "middle";  ///< left | right | middle.
  std::string format = "hermes";                ///< The tool-call format parsed: hermes (<tool_call>{json}</tool_call>).
  /// Seconds one batch of tool calls may take (engine_kwargs.tessera.tool_timeout_s).
  double tool_timeout_s = 300;
};

/// actor_rollout_ref.rollout.* with verl's names and v0.5.0 defaults (see the header comment).
struct RolloutConfig {
  std::string name = "vllm";  ///< Any of vllm|sglang|hf|tessera: all run Tessera's engine.
  std::string mode = "sync";  ///< sync, or async: verl's agent loops (multi_turn.hpp)
  /// agent.agent_loop_config_path: the user's agent loops (verl's YAML of {name, _target_, ...}),
  /// run by verl's own Python classes (agent_loops.hpp). mode=async only.
  std::optional<std::string> agent_loop_config_path;
  double temperature = 1.0;
  int64_t top_k = -1;
  double top_p = 1.0;
  int64_t n = 1;
  int64_t prompt_length = 512;
  int64_t response_length = 512;
  bool do_sample = true;
  bool ignore_eos = false;
  bool calculate_log_probs = false;
  SamplingConfig val_kwargs{/*temperature=*/0.0, /*top_k=*/-1, /*top_p=*/1.0, /*n=*/1, /*do_sample=*/false};
  std::string dtype = "bfloat16";  ///< Parameter/KV dtype the engine expects; "auto" = the weights'.
  int64_t tensor_model_parallel_size = 1;
  bool free_cache_engine = true;   ///< Stored; the KV cache never outlives generate_sequences.
  int64_t max_num_seqs = 1024;     ///< Concurrent sequences (KV-cache slots).
  int64_t max_num_batched_tokens = 8192;  ///< Prompt tokens (padded) prefilled per forward.
  std::optional<int64_t> max_model_len;   ///< If set, must cover prompt + response length.
  std::optional<uint64_t> seed;           ///< Base of the per-rank sampling seed, if given.
  // Read by other components (the actor's log-prob recompute, the sharding manager).
  std::optional<int64_t> log_prob_micro_batch_size;
  std::optional<int64_t> log_prob_micro_batch_size_per_gpu;
  bool log_prob_use_dynamic_bsz = false;
  int64_t log_prob_max_token_len_per_gpu = 16384;
  bool layered_summon = false;
  /// verl's vLLM switch, here: samples of one prompt admitted together share its prefill
  /// (Note [Shared prompt prefill] in internal/generation_loop.cpp).
  bool enable_prefix_caching = true;
  /// false: decode steps on a CUDA device replay CUDA graphs (Note [Decode graphs] in
  /// internal/decode_runner.hpp). verl v0.5's default, true, decodes eagerly.
  /// On a GPU: the fraction of the device's memory that everything allocated at a generation
  /// call's start plus the KV cache may use; the cache gets the rest of it, at most what every
  /// sequence at its longest needs (Note [Preemption] in internal/generation_loop.cpp).
  double gpu_memory_utilization = 0.5;
  bool enforce_eager = true;
  /// A prefill over max_num_batched_tokens (padded) runs in chunks of columns, each attending
  /// to the ones before (a prompt longer than the budget included); false: one forward.
  bool enable_chunked_prefill = true;
  /// Batch sizes to capture graphs for (null: powers of two up to max_num_seqs, and that).
  std::optional<std::vector<int64_t>> cudagraph_capture_sizes;
  int64_t update_weights_bucket_megabytes = 512;
  // engine_kwargs.tessera
  BatchingMode batching = BatchingMode::continuous;
  /// "colocated" (verl's hybrid engine: the rollout shares the actor's devices) or "split" (the
  /// rollout ranks have devices of their own and receive the weights over the data plane).
  std::string placement = "colocated";
  /// split: rollout ranks per node, on the devices after trainer.n_gpus_per_node's; 0: as many
  /// as trainer.n_gpus_per_node.
  int64_t split_devices_per_node = 0;
  /// Tokens per block of the paged KV cache (vLLM's block_size; Note [Paged KV cache]).
  int64_t kv_block_size = 16;
  /// How decode steps read the paged cache: "kernel" (a paged attention kernel where there is one:
  /// on a CUDA device the tiled one where it takes the model's heads and a KV group has more than
  /// 4 query heads, else the heads one; the CPU kernel in fp32), "heads" (on a CUDA device the heads
  /// kernel: one block per row, KV head and up to four query heads; as kernel elsewhere), "tiled" (on a CUDA
  /// device, the tiled kernel: one block per row and KV head, the KV read once for the whole
  /// group; an error elsewhere) or "gather" (copy each row's blocks out and run the models'
  /// attention).
  std::string decode_attention = "kernel";
  /// On a CUDA device, whether a decode step whose rows alone leave most of the GPU idle (the few
  /// long rows at the end of a rollout) cuts each row's context into parts attended by blocks of
  /// their own and merged after (Note [Split decode attention] in cuda/paged_attention.cu).
  bool split_decode_attention = true;
  /// Caps the paged KV cache at this many blocks (0: on a GPU what gpu_memory_utilization leaves,
  /// elsewhere every sequence at its longest). Sequences beyond it wait or are preempted.
  int64_t max_kv_blocks = 0;
  /// How tokens are drawn: "fused" (on a GPU, without top-k / top-p: one CUDA kernel per step,
  /// Note [Fused sampling]) or "torch" (softmax, cumulative sum and search as torch ops).
  std::string sampler = "fused";
  /// Whether the engine's model runs RMSNorm, rotary embedding and SwiGLU as one CUDA kernel each
  /// (Note [Fused layers] in workers/models/fused_layers.cpp), as vLLM's custom ops do; on the
  /// CPU it changes nothing. The actor's own switch is model.use_liger.
  bool fused_layers = true;
  MultiTurnConfig multi_turn;
};

/// The parsed config plus the keys that were accepted but have no effect here.
struct ParsedRolloutConfig {
  RolloutConfig config;
  std::vector<std::string> ignored_keys;  ///< Full dotted names, in input order.
};

/// Parses the `actor_rollout_ref.rollout` object (see the header comment for the rules) and
/// validates the result. Logs the ignored keys (one spdlog info line) when there are any.
Result<ParsedRolloutConfig> parse_rollout_config(const nlohmann::json& rollout);

/// Range checks: lengths and slot counts >= 1, temperature >= 0, top_p in (0, 1], top_k >= -1,
/// max_model_len >= prompt + response, a known dtype and name. Errors name the key.
Status validate_rollout_config(const RolloutConfig& config);

/// The dtype named by config.dtype ("bfloat16", "bf16", "float16", "half", "float32", "float",
/// "fp32"); nullopt for "auto".
Result<std::optional<c10::ScalarType>> rollout_dtype(const RolloutConfig& config);

}  // namespace tessera::rollout
