// engine.hpp: the narrow interface between rollout workers (and the sharding manager) and a
// generation engine: verl's BaseRollout.generate_sequences plus weights handed over by reference.
//
// Implementations: KVCacheEngine (kv_engine.hpp). A worker owns one engine per rollout rank and
// calls it from one thread.
#pragma once

#include <cstdint>
#include <optional>

#include "proto/data_proto.hpp"
#include "proto/status.hpp"
#include "workers/models/safetensors.hpp"
#include "workers/rollout/contract.hpp"
#include "workers/rollout/sampling.hpp"

namespace tessera::rollout {

/// Counters of the last generate_sequences call (for metrics and benchmarks).
struct GenerationStats {
  int64_t rows = 0;              ///< Prompts generated for.
  int64_t prompt_tokens = 0;     ///< Real prompt tokens prefilled.
  int64_t preemptions = 0;       ///< Sequences preempted for KV blocks (Note [Preemption]).
  int64_t recomputed_tokens = 0; ///< Tokens prefilled again for preempted sequences.
  int64_t prefill_tokens = 0;    ///< Tokens computed by prefill, left padding included.
  int64_t shared_prompt_tokens = 0;  ///< Prompt tokens not prefilled: a sample of the same prompt was.
  /// Prompt tokens not prefilled: remembered blocks held them (Note [Prefix cache]: an earlier
  /// call's sequences, or this call's finished or preempted ones), and their prefill FLOPs.
  int64_t cached_prompt_tokens = 0;
  double cached_prefill_flops = 0;
  /// Forward FLOPs of the prompts prefilled (their real tokens), and of those whose prefill
  /// sharing saved (verl's count: 2 x dense layer parameters x tokens + 4 x len^2 x heads x
  /// head_dim x layers; the lm_head runs on one token per prompt and is left out).
  double prefill_flops = 0;
  double shared_prefill_flops = 0;
  int64_t generated_tokens = 0;  ///< Response tokens produced (through EOS).
  int64_t decode_steps = 0;      ///< Batched decode forwards.
  int64_t decode_row_steps = 0;  ///< Sum over decode steps of the rows computed (graph padding included).
  int64_t admissions = 0;        ///< Prefills (each admits one or more prompts).
  int64_t prefill_forwards = 0;  ///< Forwards of those prefills (chunked prefill splits one into several).
  int64_t kv_blocks = 0;         ///< Blocks of the paged KV cache (paged_kv.hpp).
  int64_t kv_cache_bytes = 0;    ///< Bytes of the KV cache's pools.
  int64_t shared_kv_blocks = 0;  ///< Prompt blocks held once for several samples (not copied).
  int64_t graphs_captured = 0;   ///< CUDA graphs captured (one per batch-size bucket used).
  int64_t graph_replays = 0;     ///< Decode steps replayed from a CUDA graph.
  /// Wall time of the prefills: launching them and waiting for their first tokens.
  double prefill_seconds = 0;
  /// Wall time of the decode steps: launching them (sampling included) and waiting for their
  /// tokens (Note [Lagged token reads] in generation_loop.cpp).
  double decode_seconds = 0;
  double prefill_cpu_seconds = 0;  ///< Process CPU time (all threads) of the prefills.
  double decode_cpu_seconds = 0;   ///< Process CPU time (all threads) of the decode steps.
  double total_seconds = 0;      ///< The whole call, input checks and output assembly included.
};

/// Adds the counters of `s` into `sum` (the KV cache's size: the largest).
void add_generation_stats(GenerationStats& sum, const GenerationStats& s);

/// One generation pass over token prompts, for callers that assemble the sequences themselves
/// (the multi-turn rollout's turns, multi_turn.hpp). Sampling follows the config as in
/// generate_sequences.
struct TokenRequests {
  std::vector<std::vector<int64_t>> prompts;  ///< Per row, non-empty token ids.
  std::vector<int64_t> max_tokens;            ///< Per row, in [1, response_length]; empty: response_length.
  std::vector<int64_t> streams;               ///< Per row, the sampling stream it draws from; empty: its index.
  std::vector<int64_t> eos_token_ids;         ///< Non-empty.
  bool do_sample = true;
  bool validate = false;
  uint64_t seed = 0;                          ///< Stream s samples from row_seed(seed, s) (sampling.hpp).
  /// The sampling rule of this call (an agent loop's sampling_params); unset: the config's, by
  /// do_sample and validate. Its `fused` flag is the engine's own.
  std::optional<SamplingParams> sampling;
};

/// A rollout engine: generates responses for a batch of prompts (verl §6.3 contract).
class RolloutEngine {
 public:
  virtual ~RolloutEngine() = default;

  /// verl's generate_sequences: see workers/rollout/contract.hpp for the exact input and output.
  virtual Result<proto::DataProto> generate_sequences(const proto::DataProto& prompts) = 0;

  /// Generates for token prompts: one GeneratedRow per prompt, in order, each ending at its
  /// first EOS (unless ignore_eos) or its budget. last_stats() describes this call.
  virtual Result<std::vector<GeneratedRow>> generate_tokens(const TokenRequests& requests) = 0;

  /// The seed a call with this meta_info samples from: derived from the trainer's global_steps
  /// when given (so a resumed run samples alike), else drawn from the engine's generator.
  virtual uint64_t call_seed(const nlohmann::json& meta) = 0;

  /// Makes the engine compute with `tensors` (HF parameter names, the engine's dtype and device)
  /// in place: the engine aliases them, no byte is copied. The caller keeps them alive and
  /// unmodified while the engine generates. On error the engine's weights are unchanged.
  virtual Status load_weights_by_reference(const models::TensorMap& tensors) = 0;

  /// Counters of the last successful generate_sequences call.
  virtual const GenerationStats& last_stats() const = 0;

  /// A rollout session (Note [Prefix cache] in internal/block_cache.hpp) over about `rows`
  /// sequences at a time: until end_session(), generate_tokens keeps the KV blocks of the
  /// sequences it finished, and a later prompt that starts with them prefills only the rest (the
  /// turns of a multi-turn or agent-loop rollout). end_session() frees that memory. Engines
  /// without such a cache ignore both.
  virtual void begin_session(int64_t rows) { (void)rows; }
  virtual void end_session() {}
};

/// begin_session(rows) for a scope (`on` false: nothing).
class EngineSession {
 public:
  EngineSession(RolloutEngine& engine, bool on, int64_t rows) : engine_(on ? &engine : nullptr) {
    if (engine_ != nullptr) engine_->begin_session(rows);
  }
  ~EngineSession() {
    if (engine_ != nullptr) engine_->end_session();
  }
  EngineSession(const EngineSession&) = delete;
  EngineSession& operator=(const EngineSession&) = delete;

 private:
  RolloutEngine* engine_;
};

}  // namespace tessera::rollout
