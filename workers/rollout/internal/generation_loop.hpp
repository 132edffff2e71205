// generation_loop.hpp (internal): the scheduler of one generate_sequences call: admission and
// prefill, batched decode steps, finishing, slot refill (continuous batching) or waves (static),
// kv_engine.hpp describes the behaviour; paged_kv.hpp the cache layout.
//
// Thread-safety: one thread. Throws c10::Error only if the model does (the engine converts).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "proto/status.hpp"
#include "workers/rollout/config.hpp"
#include "workers/rollout/contract.hpp"
#include "workers/rollout/engine.hpp"
#include "workers/rollout/internal/decode_runner.hpp"
#include "workers/rollout/sampling.hpp"
#include "workers/rollout/step_model.hpp"

namespace tessera::rollout::internal {

class BlockCache;

/// The KV cache a rollout session keeps between its calls (Note [Prefix cache] in
/// block_cache.hpp): the pool and the blocks it remembers. Made by the first call that needs it;
/// its destruction frees the memory.
struct PrefixSession {
  PrefixSession();
  ~PrefixSession();
  PrefixSession(const PrefixSession&) = delete;
  PrefixSession& operator=(const PrefixSession&) = delete;
  std::unique_ptr<BlockCache> cache;
  /// The decode runner over `cache` (Note [Decode graphs]: its CUDA graphs serve every call of the
  /// session, the weights staying put for the whole rollout), for `runner_slots` slots and
  /// sequences up to `runner_length` tokens. Declared after the cache: destroyed first.
  std::unique_ptr<DecodeRunner> runner;
  int64_t runner_slots = 0, runner_length = 0;
  int64_t rows = 1;  ///< Sequences the session's calls run at a time, about (its pool's slots).
  /// Drops the runner, then the cache (a failed call's sequences, or a pool too small).
  void clear();
};

/// Everything the loop needs besides the model and the prompts.
struct LoopOptions {
  int64_t slots = 1;                  ///< max_num_seqs.
  int64_t prefill_token_budget = 1;   ///< max_num_batched_tokens (padded tokens per prefill).
  bool chunked_prefill = true;        ///< enable_chunked_prefill: split a prefill over the budget.
  int64_t response_length = 1;
  int64_t block_size = 16;            ///< Tokens per KV block (Note [Paged KV cache]).
  bool kernel_attention = true;       ///< PagedKV::use_kernel (decode_attention=kernel, heads or tiled).
  bool tiled_attention = false;       ///< PagedKV::tiled (decode_attention=tiled: an error where it cannot run).
  /// decode_attention=kernel: PagedKV::tiled where the tiled kernel runs and a KV group has more
  /// than 4 query heads (run_generation). Off here: a LoopOptions built by hand runs the heads kernel.
  bool prefer_tiled_attention = false;
  bool split_attention = true;        ///< PagedKV::split (split_decode_attention).
  bool fused_layers = false;          ///< The model runs the fused layer ops (engine_kwargs.tessera.fused_layers).
  int64_t max_kv_blocks = 0;          ///< Caps the KV cache (0: every slot at its longest).
  std::string max_kv_blocks_key;      ///< The config key behind the cap, for errors.
  BatchingMode batching = BatchingMode::continuous;
  bool share_prompt_prefill = true;   ///< Note [Shared prompt prefill] (rollout.enable_prefix_caching).
  bool ignore_eos = false;
  bool want_logprobs = false;
  std::vector<int64_t> eos_token_ids;
  SamplingParams sampling;
  DecodeOptions decode;               ///< Eager or CUDA graphs (Note [Decode graphs]).
  /// Read each launch's tokens while the next step runs (Note [Lagged token reads]); false reads
  /// them before launching anything else.
  bool lag_token_reads = true;
  uint64_t call_seed = 0;             ///< Row r samples from RowRng(row_seed(call_seed, streams[r] or r)).
  /// Per row, at most this many tokens (each in [1, response_length]); empty: response_length.
  std::vector<int64_t> max_tokens;
  /// Per row, the sampling stream it draws from; empty: its index.
  std::vector<int64_t> streams;
  /// A rollout session's cache (Note [Prefix cache]): the call prefills only what its prompts do
  /// not share with remembered blocks, and remembers its sequences. Null: a cache of the call's own.
  PrefixSession* session = nullptr;
  /// With a session: the longest sequence any of its calls may hold (max_model_len), which its
  /// pool is sized for.
  int64_t session_length = 0;
};

/// Generates for every prompt (token ids, non-empty, already checked against the vocabulary).
/// Returns one GeneratedRow per prompt, in order; fills `stats` (rows, tokens, steps, timings).
Result<std::vector<GeneratedRow>> run_generation(StepModel& model, const std::vector<std::vector<int64_t>>& prompts,
                                                 const LoopOptions& options, GenerationStats& stats);

}  // namespace tessera::rollout::internal
