// logger.hpp: trainer.logger backends (verl's Tracking) and a live progress bar.
//
//   console  one line per step on stdout (or the given FILE*): "step:N - key:value - ..." with
//            the key metrics (scores, rewards, losses, KL, entropy, lengths, step time, val-core)
//   jsonl    <trainer.default_local_dir>/metrics.jsonl: one JSON object per step with "step" and
//            every metric, flushed after each line. Non-finite values are written as null (JSON
//            has no NaN). The file holds each step once: when a run starts (start_at), rows past
//            the step it resumes from are dropped (all rows for a fresh run), and a second log of
//            the step just written (validation before training, at the resumed step) merges
//            into that row.
//   file     verl's name for its JSONL backend: the same file as jsonl.
//   tensorboard  TensorBoard event files (driver/tensorboard.hpp), in verl's directory.
//   wandb, mlflow, swanlab, clearml  the Python libraries, in a process each (driver/python_tracker.hpp).
// vemlp_wandb and trackio are refused naming what is supported, as is an unknown name. The progress bar redraws one line with "\r"
// when its stream is a TTY, and prints a plain line per update otherwise.
//
// Thread-safety: none; the trainer's thread owns its loggers.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "driver/metrics.hpp"
#include "proto/status.hpp"

namespace tessera::driver {

/// One validation sample as verl's ValidationGenerationsLogger logs it: (input, output, score).
struct GenerationSample {
  std::string input, output;
  double score = 0;
};

/// One logging backend.
class MetricLogger {
 public:
  virtual ~MetricLogger() = default;
  /// Records the metrics of `step`.
  virtual Status log(const Metrics& metrics, int64_t step) = 0;
  /// The run continues after `step` (a resume), or starts afresh when `step` < 0.
  virtual Status start_at(int64_t step) { return Status(); }
  /// trainer.log_val_generations: the samples of the validation at `step`, for the backends that
  /// keep them (verl's wandb table, swanlab table, mlflow artifact, TensorBoard text); the others
  /// ignore them.
  virtual Status log_generations(const std::vector<GenerationSample>& samples, int64_t step) { return Status(); }
  /// The run is over: `ok` false when it stopped on an error. No log() after it.
  virtual void finish(bool ok) {}
};

/// The console backend. `all_metrics` prints every metric instead of the key ones.
class ConsoleLogger final : public MetricLogger {
 public:
  explicit ConsoleLogger(std::FILE* out = stdout, bool all_metrics = false) : out_(out), all_(all_metrics) {}
  Status log(const Metrics& metrics, int64_t step) override;
  /// The line log() prints (without the newline).
  std::string format_line(const Metrics& metrics, int64_t step) const;

 private:
  std::FILE* out_;
  bool all_;
};

/// The jsonl backend (see the header comment).
class JsonlLogger final : public MetricLogger {
 public:
  /// Opens `path` for appending, creating its directory. Errors name the path.
  static Result<std::unique_ptr<JsonlLogger>> open(const std::filesystem::path& path);
  ~JsonlLogger() override;
  Status log(const Metrics& metrics, int64_t step) override;
  /// Rewrites the file (atomically) without the rows whose step is past `step`; errors name
  /// the file and line of a row that does not parse.
  Status start_at(int64_t step) override;
  const std::filesystem::path& path() const { return path_; }

 private:
  JsonlLogger(std::filesystem::path path, std::FILE* file) : path_(std::move(path)), file_(file) {}
  std::filesystem::path path_;
  std::FILE* file_;
  // The last row written, and the file size before it: a repeated step rewrites it merged.
  std::optional<nlohmann::json> last_row_;
  long last_offset_ = 0;
};

/// OK when every name is a backend Tracking can create; otherwise one line naming the first
/// that is not and what is supported.
Status check_logger_backends(const std::vector<std::string>& backends);

/// verl's Tracking: fans each log call out to the configured backends.
struct TrackerRun;  // python_tracker.hpp

class Tracking {
 public:
  /// Backends by name ("console", "jsonl", "file", "tensorboard", "wandb", "mlflow", "swanlab", "clearml");
  /// jsonl writes <local_dir>/metrics.jsonl. The Python ones (required: `run`) open their run at
  /// the first start_at() or log(), when the workers are up, as verl opens its Tracking in fit():
  /// a run that fails before leaves no empty experiment behind. Errors: check_logger_backends's,
  /// and a Python backend's start (python_tracker.hpp) from start_at() / log().
  static Result<Tracking> create(const std::vector<std::string>& backends, const std::filesystem::path& local_dir,
                                 std::FILE* console = stdout,
                                 const std::filesystem::path& tensorboard_dir = "tensorboard_log",
                                 const TrackerRun* run = nullptr);
  /// From trainer.logger and trainer.default_local_dir of a loaded config; a null `console` drops
  /// the console backend (a quiet run). Writes the resolved config to <dir>/config.yaml.
  static Result<Tracking> from_config(const nlohmann::json& cfg, std::FILE* console = stdout);

  Tracking() = default;
  Tracking(Tracking&&) noexcept = default;
  Tracking& operator=(Tracking&&) noexcept = default;
  /// Without a finish() first, ends every backend's run as failed (an error stopped the trainer).
  ~Tracking();

  /// Logs to every backend; the first error is returned after all were tried.
  Status log(const Metrics& metrics, int64_t step);
  /// Tells every backend where the run starts: after `step` when resumed, < 0 when fresh.
  Status start_at(int64_t step);
  /// Validation samples to every backend that keeps them (MetricLogger::log_generations).
  Status log_generations(const std::vector<GenerationSample>& samples, int64_t step);
  /// Ends every backend's run, as finished (`ok`) or failed; the Python backends all finish at
  /// once, each waited for when the Tracking goes. Later calls, and log()s after it, do nothing.
  void finish(bool ok);
  /// Adds a backend (tests, custom sinks).
  void add(std::unique_ptr<MetricLogger> logger) { loggers_.push_back(std::move(logger)); }

 private:
  Status open_python_trackers();
  /// Opens the pending Python backends, then calls `call` on every backend; the first error
  /// after all were tried.
  template <class Call>
  Status each_logger(Call call);
  std::vector<std::unique_ptr<MetricLogger>> loggers_;
  std::vector<std::string> pending_;        ///< Python backends not opened yet.
  std::shared_ptr<const TrackerRun> run_;  ///< What they open their run with.
  bool finished_ = false;
};

/// A progress bar with ETA for `total` steps.
class ProgressBar {
 public:
  /// `is_tty` defaults to isatty(fileno(out)); `now` (seconds) defaults to a steady clock.
  ProgressBar(int64_t total, std::FILE* out = stderr, std::optional<bool> is_tty = std::nullopt,
              std::function<double()> now = {});
  /// Steps already done before this bar started (a resumed run): not counted in the rate.
  /// Unset, it is inferred from the first update (first step reported - 1).
  void set_initial(int64_t steps_done) { initial_ = steps_done; }
  /// Reports that `step` (1-based, <= total) finished, with a few metrics shown after the bar.
  void update(int64_t step, const Metrics& metrics = {});
  /// Ends the bar's line (TTY mode).
  void finish();
  /// Erases the bar's line (TTY mode) so another line can be printed there; the next update
  /// redraws it. Console lines call this first, so the two never share a line.
  void clear();
  /// The text of the bar for `step` at elapsed `seconds` (exposed for tests).
  std::string render(int64_t step, double seconds, const Metrics& metrics) const;

 private:
  int64_t total_;
  int64_t initial_ = -1;  // steps done before the bar started (not timed); -1: not known yet
  std::FILE* out_;
  bool tty_;
  std::function<double()> now_;
  double start_ = 0;
  bool open_line_ = false;
};

/// What a run says when it starts (run_summary_lines).
struct RunSummary {
  std::string what;                                    ///< "GRPO", "PPO (gae)", "SFT"
  std::string device;                                  ///< trainer.device
  size_t agents = 0;                                   ///< cluster.agents (0: in this process)
  std::vector<std::pair<std::string, int32_t>> groups; ///< Worker group name, ranks.
  int64_t train_rows = 0, val_rows = 0;                ///< val_rows < 0: no validation set
  int64_t steps_per_epoch = 0, epochs = 0, total_steps = 0;
  std::string out_dir;                                 ///< trainer.default_local_dir
  int64_t save_freq = -1;
  int64_t resumed_step = 0;                            ///< 0: a fresh start
  std::string model;                                   ///< What the model is (model_summary); empty: no line
  std::vector<std::string> notes;                      ///< Lines after the model's: what the run does differently
};

/// "Qwen3MoeForCausalLM at PATH: 48 layers, 30.5B parameters, 3.3B per token (8 of 128 experts)",
/// from config.json at `path` (with verl's override_config); empty when it cannot be read.
std::string model_summary(const std::string& path, const nlohmann::json& override = nullptr);

/// The start-up lines: what runs where, the data and step counts, the output directory, and
/// one line saying whether the run starts, resumes after step N, or has nothing left to do.
std::vector<std::string> run_summary_lines(const RunSummary& s);

/// A RunSummary with the fields a loaded config gives: device, agents, epochs, output
/// directory and save_freq (trainer.* and cluster.agents).
RunSummary run_summary_from_config(const nlohmann::json& cfg);

/// Prints run_summary_lines(s) to `out` (each prefixed "tessera: "); nothing when `out` is null.
void print_run_summary(std::FILE* out, const RunSummary& s);

/// "1:02:03" / "02:03" for a duration in seconds ("--:--" when not finite or negative).
std::string format_duration(double seconds);

}  // namespace tessera::driver
