// scripted_engine.hpp: a RolloutEngine that plays scripted turns, for the multi-turn rollout's and
// the agent loops' tests: every branch of a conversation exercised deterministically.
#pragma once

#include <algorithm>
#include <initializer_list>
#include <map>
#include <vector>

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include "workers/rollout/engine.hpp"

namespace tessera::rollout::testing {

/// Plays scripted turns: stream s's k-th generation is script[s][k] cut to its budget (with
/// `rows` > 0, stream s plays row s % rows: an agent loop's k-th request of row r has stream
/// r + k x rows).
class ScriptedEngine final : public RolloutEngine {
 public:
  std::map<int64_t, std::vector<std::vector<int64_t>>> script;
  std::map<int64_t, std::vector<std::vector<int64_t>>> seen;  ///< The prompts each stream was given.
  int64_t rows = 0;                  ///< > 0: streams map to rows (above).
  std::vector<TokenRequests> calls;  ///< Every call's requests.

  Result<proto::DataProto> generate_sequences(const proto::DataProto&) override {
    return make_error(ErrorCode::unimplemented, "scripted");
  }
  bool fail = false;  ///< generate_tokens fails (a model error mid-rollout).

  Result<std::vector<GeneratedRow>> generate_tokens(const TokenRequests& r) override {
    if (fail) return make_error(ErrorCode::internal, "the model failed");
    calls.push_back(r);
    std::vector<GeneratedRow> out;
    stats_ = GenerationStats{};
    for (size_t i = 0; i < r.prompts.size(); ++i) {
      const int64_t s = rows > 0 ? r.streams.at(i) % rows : r.streams.at(i);
      auto& turns = seen[s];
      const auto& tokens = script.at(s).at(turns.size());
      turns.push_back(r.prompts[i]);
      GeneratedRow row;
      const auto n = std::min<size_t>(tokens.size(), static_cast<size_t>(r.max_tokens.at(i)));
      row.tokens.assign(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(n));
      stats_.generated_tokens += static_cast<int64_t>(n);
      out.push_back(std::move(row));
    }
    return out;
  }
  uint64_t call_seed(const nlohmann::json&) override { return 1; }
  Status load_weights_by_reference(const models::TensorMap&) override { return Status(); }
  const GenerationStats& last_stats() const override { return stats_; }

 private:
  GenerationStats stats_;
};

/// verl's GSM8K tool (verl.tools.gsm8k_tool.Gsm8kTool) as its example tool config declares it.
inline constexpr const char* kGsm8kTools = R"(tools:
  - class_name: "verl.tools.gsm8k_tool.Gsm8kTool"
    config:
      type: native
    tool_schema:
      type: "function"
      function:
        name: "calc_gsm8k_reward"
        description: "A tool for calculating the reward of gsm8k"
        parameters:
          type: "object"
          properties:
            answer:
              type: "string"
              description: "The model's answer to the GSM8K math problem, must be a digits"
          required: ["answer"]
)";

/// Row `r` of an integer tensor, as int64 values.
inline std::vector<int64_t> row_of(const at::Tensor& t, int64_t r) {
  at::Tensor row = t[r].to(at::kLong).contiguous();
  return {row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel()};
}

/// The parts one after another.
inline std::vector<int64_t> cat(std::initializer_list<std::vector<int64_t>> parts) {
  std::vector<int64_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

}  // namespace tessera::rollout::testing
