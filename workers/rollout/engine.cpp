// engine.cpp: see engine.hpp.
#include "workers/rollout/engine.hpp"

#include <algorithm>

namespace tessera::rollout {

void add_generation_stats(GenerationStats& sum, const GenerationStats& s) {
  sum.rows += s.rows;
  sum.prompt_tokens += s.prompt_tokens;
  sum.preemptions += s.preemptions;
  sum.recomputed_tokens += s.recomputed_tokens;
  sum.prefill_tokens += s.prefill_tokens;
  sum.shared_prompt_tokens += s.shared_prompt_tokens;
  sum.cached_prompt_tokens += s.cached_prompt_tokens;
  sum.cached_prefill_flops += s.cached_prefill_flops;
  sum.prefill_flops += s.prefill_flops;
  sum.shared_prefill_flops += s.shared_prefill_flops;
  sum.generated_tokens += s.generated_tokens;
  sum.decode_steps += s.decode_steps;
  sum.decode_row_steps += s.decode_row_steps;
  sum.admissions += s.admissions;
  sum.prefill_forwards += s.prefill_forwards;
  sum.kv_blocks = std::max(sum.kv_blocks, s.kv_blocks);
  sum.kv_cache_bytes = std::max(sum.kv_cache_bytes, s.kv_cache_bytes);
  sum.shared_kv_blocks += s.shared_kv_blocks;
  sum.graphs_captured += s.graphs_captured;
  sum.graph_replays += s.graph_replays;
  sum.prefill_seconds += s.prefill_seconds;
  sum.decode_seconds += s.decode_seconds;
  sum.prefill_cpu_seconds += s.prefill_cpu_seconds;
  sum.decode_cpu_seconds += s.decode_cpu_seconds;
}

}  // namespace tessera::rollout
