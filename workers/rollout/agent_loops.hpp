// agent_loops.hpp: rollout.mode=async with agent.agent_loop_config_path: the user's agent loops
// (verl's AgentLoopBase subclasses), run by verl's own Python in the agent host
// (agent_host.hpp), generate with Tessera's engine. Note [Custom agent loops] in agent_loops.cpp.
//
// Input: the generate_sequences batch (contract.hpp) with `raw_prompt` (the chat messages),
// optionally `agent_name` (single_turn_agent when absent, as verl) and `index` (the dataset's
// extra_info.index, for verl's rollout traces). meta_info as generate_sequences.
// Output: generate_sequences' keys with each row's prompt and response as its loop returned them
// (AgentLoopOutput), `response_mask` its response_mask, and `__num_turns__` its num_turns.
//
// Thread-safety: none; one owner (the rollout worker's thread).
#pragma once

#include <cstdint>
#include <memory>

#include <nlohmann/json.hpp>

#include "proto/data_proto.hpp"
#include "proto/status.hpp"
#include "workers/rollout/agent_host.hpp"
#include "workers/rollout/config.hpp"
#include "workers/rollout/engine.hpp"

namespace tessera::rollout {

/// Counters of the last call, for the rollout's metrics.
struct AgentLoopStats {
  int64_t rows = 0;
  int64_t requests = 0;        ///< generate() calls the loops made.
  int64_t engine_calls = 0;    ///< Engine calls they were batched into.
  /// verl's agent_loop/* timing metrics from the loops' AgentLoopMetrics (generate_sequences,
  /// tool_calls: min, max, mean; the slowest row's), as its AgentLoopManager reports them.
  nlohmann::json metrics = nlohmann::json::object();
  GenerationStats generation;  ///< The engine's counters summed over the calls.
};

class AgentLoopRollout {
 public:
  /// REQUIRES: config.mode == "async" and config.agent_loop_config_path; `vocab_size` bounds the
  /// token ids the loops may use, `context_length` (the model's) prompt plus generated tokens.
  static Result<std::unique_ptr<AgentLoopRollout>> create(const RolloutConfig& config, std::unique_ptr<AgentLoops> loops,
                                                          int64_t vocab_size, int64_t context_length);

  /// Runs the batch's loops on `engine`. Errors name the row, its agent loop and the key.
  Result<proto::DataProto> generate(RolloutEngine& engine, const proto::DataProto& prompts);

  const AgentLoopStats& last_stats() const { return stats_; }

 private:
  AgentLoopRollout(const RolloutConfig& config, std::unique_ptr<AgentLoops> loops, int64_t vocab_size,
                   int64_t context_length)
      : config_(config), loops_(std::move(loops)), vocab_size_(vocab_size), context_length_(context_length) {}

  RolloutConfig config_;
  std::unique_ptr<AgentLoops> loops_;
  int64_t vocab_size_;
  int64_t context_length_;
  AgentLoopStats stats_;
};

}  // namespace tessera::rollout
