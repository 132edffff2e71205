// python_reward.hpp: verl's custom_reward_function, run in a pool of Python processes.
//
// custom_reward_function.path names a Python file and .name a function in it (verl's
// `compute_score(data_source, solution_str, ground_truth, extra_info, **reward_kwargs)`). Tessera
// starts `processes` Python interpreters (TESSERA_REWARD_PYTHON, else python3) that import the
// file once, and sends them the rows of a batch in chunks over pipes, one JSON line per chunk
// and per answer. A function may return a number or a dict with "score" (verl's contract; the
// other keys become reward extra infos). The user's own prints go to stderr, never into the
// protocol. This is the one place Python runs, and only when configured.
//
// Failures, each one line: the file does not import or has no such function (at start, naming
// path and name); a call raises (naming the row and its data_source; the run stops, or with
// on_error=zero the row scores 0 and a warning line is printed); a chunk takes longer than
// timeout_s or its process dies (naming the rows; the process is replaced, nothing hangs).
//
// Thread-safety: one caller at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "driver/reward.hpp"
#include "proto/status.hpp"

namespace tessera::driver {

struct PythonRewardOptions {
  std::string python;                     ///< Interpreter; empty: $TESSERA_REWARD_PYTHON, else python3.
  std::string path;                       ///< custom_reward_function.path
  std::string name = "compute_score";     ///< custom_reward_function.name
  nlohmann::json kwargs = nlohmann::json::object();  ///< custom_reward_function.reward_kwargs
  int processes = 4;                      ///< custom_reward_function.processes
  std::chrono::milliseconds timeout{60000};  ///< custom_reward_function.timeout_s, per chunk
  bool errors_score_zero = false;         ///< custom_reward_function.on_error == "zero"
  /// A directory the pool owns and removes when it ends (verl's scorer module lives there, and a
  /// process replaced after a timeout imports it again). Empty: none.
  std::string owned_dir;
};

/// The options from a loaded PPO config (`path` empty when custom_reward_function is not set;
/// the pool settings are read either way: verl's own Python scorers use them too).
Result<PythonRewardOptions> python_reward_options(const nlohmann::json& cfg);

/// verl's data sources whose scorers are Python only (sympy, code execution, mathruler):
/// prime_math's numina_* sources, prime_code's codecontests/apps/codeforces/taco, geo3k.
bool is_verl_python_source(std::string_view data_source);

/// verl's reward_model.sandbox_fusion: where verl's code scorers run the solutions.
struct SandboxFusionOptions {
  std::optional<std::string> url;  ///< null: verl's scorers execute code locally (prime_code).
  int64_t max_concurrent = 64;     ///< Requests to the sandbox in flight at once, over all processes.
  int64_t memory_limit_mb = 1024;  ///< Per execution.
};

/// reward_model.sandbox_fusion of a loaded PPO config. Errors name the key.
Result<SandboxFusionOptions> sandbox_fusion_options(const nlohmann::json& cfg);

/// A pool running verl's own default_compute_score (verl must be importable by the pool's
/// interpreter), with sandbox_fusion_url, memory_limit_mb and a semaphore of max_concurrent /
/// processes requests per process when `sandbox.url` is set, as verl's get_custom_reward_fn
/// passes them. Errors name `data_source` (the first source that needs it) and say what to do.
class PythonRewardPool;
Result<std::shared_ptr<PythonRewardPool>> start_verl_scorer_pool(PythonRewardOptions options,
                                                                       const std::string& data_source,
                                                                       const SandboxFusionOptions& sandbox = {});

class PythonRewardPool {
 public:
  /// Starts the processes and waits (up to the timeout) until each has imported the function.
  static Result<std::shared_ptr<PythonRewardPool>> start(const PythonRewardOptions& options);
  ~PythonRewardPool();
  PythonRewardPool(const PythonRewardPool&) = delete;
  PythonRewardPool& operator=(const PythonRewardPool&) = delete;

  /// Scores every row, in order. Errors name the row (its index in `rows`) and data_source.
  Result<std::vector<ScoreResult>> score(const std::vector<ScoreRequest>& rows);

 private:
  struct Process;
  explicit PythonRewardPool(PythonRewardOptions options);
  Status spawn(size_t slot);
  void stop(size_t slot);
  PythonRewardOptions options_;
  std::vector<std::unique_ptr<Process>> procs_;
};

}  // namespace tessera::driver
