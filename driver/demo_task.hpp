// demo_task.hpp: the built-in synthetic task of `tessera demo`: integer addition ("12+34=" ->
// "46"), generated deterministically from a seed, written as verl-format JSONL datasets.
//
// Files written by write_demo_datasets(dir):
//   rl_train.jsonl, rl_val.jsonl  verl RLHFDataset rows: data_source "tessera/arith", prompt =
//                                 [{"role":"user","content":"A+B="}], ability "math",
//                                 reward_model {style "rule", ground_truth "C"}, extra_info
//                                 {split, index}.
//   sft_train.jsonl, sft_val.jsonl SFT rows {"prompt": "A+B=", "response": "C"}. A fraction
//                                 `sft_noise` of the TRAINING responses is deliberately wrong
//                                 (a uniformly random number in the answer range), so the warm-up
//                                 teaches the format and a broad answer distribution and leaves
//                                 the RL phase something to sharpen (see examples/demo/README.md).
//                                 The SFT validation responses are all correct.
// Validation problems are drawn first, each set without repeats (verl groups validation samples by
// prompt, so a repeated prompt would count as several samples of one prompt). When the problem space holds at least 4x the validation
// rows (digits >= 2 with the default sizes) they are excluded from both training sets, so the
// validation accuracy measures generalisation; with digits = 1 (100 problems, the demo's
// setting) validation and training draw from the same 100 problems (holds_out_validation()).
//
// Randomness is a std::mt19937_64 (its output sequence is fixed by the C++ standard) reduced
// with plain modulo, so the same options give the same bytes on every platform.
// Thread-safety: pure functions over their arguments.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "proto/status.hpp"
#include "runtime/worker.hpp"

namespace tessera::driver {

/// The data_source of demo rows (the reward scorer registered under that name checks them).
inline constexpr const char* kDemoDataSource = "tessera/arith";

/// The characters the demo's character tokenizer needs (digits, '+', '=', and what the ChatML
/// template adds: role names, newline).
inline constexpr const char* kDemoAlphabet = "0123456789+= \nabcdefghijklmnopqrstuvwxyz";

/// Sizes and seeds of the generated datasets.
struct DemoTaskOptions {
  int64_t digits = 1;           ///< Operands are uniform in [0, 10^digits).
  int64_t rl_train_size = 2048;
  int64_t rl_val_size = 100;     ///< Distinct problems (<= 10^(2 digits)).
  int64_t sft_train_size = 8192;
  int64_t sft_val_size = 100;    ///< Distinct problems (<= 10^(2 digits)).
  double sft_noise = 0.5;       ///< Fraction of SFT training answers replaced by random numbers.
  uint64_t seed = 1;
};

/// One addition problem.
struct ArithProblem {
  int64_t a = 0;
  int64_t b = 0;
  std::string question() const;  ///< "A+B=".
  std::string answer() const;    ///< Decimal A+B.
};

/// `count` problems with operands uniform in [0, 10^digits), skipping any in `exclude`; with
/// `distinct`, no problem twice (validation sets: verl groups validation samples by prompt).
/// REQUIRES: 1 <= digits <= 6; enough (distinct) problems exist outside `exclude`.
std::vector<ArithProblem> make_problems(int64_t count, int64_t digits, uint64_t seed,
                                        const std::vector<ArithProblem>& exclude = {}, bool distinct = false);

/// The verl RLHFDataset row of `p` (see the header comment).
nlohmann::json rl_row(const ArithProblem& p, const std::string& split, int64_t index);

/// Checks the options: digits in [1, 6], positive sizes, validation sizes within the number of
/// distinct problems, noise in [0, 1). Errors name the option.
Status validate_demo_task_options(const DemoTaskOptions& options);

/// Whether the validation problems are excluded from training (see the header comment).
bool holds_out_validation(const DemoTaskOptions& options);

/// Writes the four JSONL files into `dir` (created if missing), each atomically.
Status write_demo_datasets(const DemoTaskOptions& options, const std::string& dir);

// ---- The demo run (demo_run.cpp) -------------------------------------------------------------

/// What `tessera demo` is given.
struct DemoRunOptions {
  std::filesystem::path examples_dir;   ///< Holds sft.yaml and grpo.yaml (examples/demo).
  /// "demo.<option>=v" (digits, sft_noise, seed, hidden, layers, rl_train_size, rl_val_size,
  /// sft_train_size, sft_val_size), "sft.<key>=v" (SFT config overrides, prefix stripped; +/++/~
  /// forms too), anything else: GRPO config overrides (as `tessera train`).
  std::vector<std::string> overrides;
  std::FILE* out = stdout;       ///< Phase lines and the summary (null: quiet).
  std::FILE* progress = stderr;  ///< Progress bars (null: none).
};

/// What a demo run measured.
struct DemoReport {
  std::filesystem::path run_dir;   ///< trainer.default_local_dir: metrics.jsonl, plots/, sft/, data/.
  std::string metric;              ///< The val-core metric compared ("val-core/tessera/arith/.../mean@1").
  double val_before = 0.0;         ///< Validation reward before the RL phase (after SFT).
  double val_after = 0.0;          ///< At the last RL step.
  double best_after = 0.0;         ///< Best validation during the RL phase.
  double sft_seconds = 0.0, rl_seconds = 0.0, total_seconds = 0.0;
};

/// `tessera demo`: writes the datasets, init-models a tiny Qwen2 (hidden 64, 2 layers, character
/// tokenizer), SFT-warms it on noisy answers, trains it with GRPO through the worker groups, and
/// plots the run. The run directory is cleared first only if an earlier demo created it (it holds
/// the marker file .tessera-demo); any other non-empty directory is refused.
/// REQUIRES: `registry` holds "sft" and "actor_rollout_ref".
Result<DemoReport> run_demo(const DemoRunOptions& options, const runtime::WorkerTypeRegistry& registry);

}  // namespace tessera::driver
