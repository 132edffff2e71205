// python_tracker.hpp: the trainer.logger backends that are Python libraries (wandb, mlflow,
// swanlab, clearml), run as verl's Tracking runs them, in one Python process per backend.
//
// At start the process imports the library and opens the run as verl does:
//   wandb    wandb.init(project=project_name, name=experiment_name, config=<the resolved config>,
//            settings=wandb.Settings(https_proxy=trainer.wandb_proxy) when that is set)
//   mlflow   tracking URI $MLFLOW_TRACKING_URI (default sqlite:////tmp/mlruns.db), experiment
//            project_name, a run named experiment_name, the config flattened into params
//            ("a/b/c", lists as list_len, 0, 1, ...); '@' in metric names becomes '_at_'
//   swanlab  swanlab.login($SWANLAB_API_KEY) when set, swanlab.init(project, experiment_name,
//            config={"FRAMEWORK": "verl", ...}, logdir=$SWANLAB_LOG_DIR or swanlog,
//            mode=$SWANLAB_MODE or cloud)
//   clearml  clearml.Task.init(task_name=experiment_name, project_name, continue_last_task=True,
//            output_uri=False), the config connected as "Hyperparameters"; each metric "a/b" a
//            scalar of title a and series b (a name without "/" is both)
// then logs each step's metrics (non-finite values as NaN / inf) with step=, the validation samples
// of trainer.log_val_generations as verl's ValidationGenerationsLogger does (wandb: the table
// val/generations, a row per validation with every sample's input, output and score; swanlab: an
// echarts table; mlflow: an artifact val_step<N>.json; clearml: the table "Validation" /
// "Validation generations"), and at the end
// finishes the run: as finished when the trainer ends it so (finish(true): wandb.finish(exit_code=0),
// mlflow.end_run(status="FINISHED"), swanlab.finish(state="success")), as failed when the trainer
// stops on an error (exit_code=1, FAILED, crashed), and as killed when Tessera dies without a word
// (its input just ends: exit_code=1, KILLED, crashed), as verl's runs are left when they crash.
// ClearML's task is marked completed, failed or stopped (verl marks it completed).
//
// The interpreter is $TESSERA_LOGGER_PYTHON, else python3: the one where the library and its
// credentials (WANDB_API_KEY, `wandb login`, ...) are. The library's own output goes to stderr; the
// process ignores SIGINT (an interrupted trainer ends the run itself).
// Failures, one line each naming the backend: the library does not import or its init fails (at
// start, before the first step); the process dies during the run (at the next step's log; the run
// stops rather than losing metrics quietly).
//
// Thread-safety: none; the trainer's thread owns its loggers.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "driver/logger.hpp"

namespace tessera::driver {

/// Whether `name` is one of the Python-library backends above.
bool is_python_tracker(const std::string& name);

/// What a Python backend opens its run with.
struct TrackerRun {
  std::string project;     ///< trainer.project_name
  std::string experiment;  ///< trainer.experiment_name
  nlohmann::json config = nlohmann::json::object();  ///< The resolved config.
};

class PythonTracker final : public MetricLogger {
 public:
  /// Starts the backend's process and waits (up to `start_timeout`) until its run is open.
  static Result<std::unique_ptr<PythonTracker>> open(const std::string& backend, const TrackerRun& run,
                                                     std::chrono::milliseconds start_timeout = std::chrono::minutes(5));
  /// Waits for the process to finish its run (the library uploads what it still holds), at most a
  /// few minutes; without a finish() first the run is left as killed.
  ~PythonTracker() override;
  Status log(const Metrics& metrics, int64_t step) override;
  Status log_generations(const std::vector<GenerationSample>& samples, int64_t step) override;
  /// Tells the process how the run ended and closes its input; the destructor waits for it.
  void finish(bool ok) override;

 private:
  struct Child;
  PythonTracker(std::string backend, std::unique_ptr<Child> child);
  /// Writes one line to the process; an error names the backend and `what` ("step 3 was").
  Status send(const std::string& line, const std::string& what);
  std::string backend_;
  std::unique_ptr<Child> child_;
  bool ended_ = false;
};

/// One JSON line {"step": N, "data": {...}} with non-finite values as Python's json module reads
/// them (NaN, Infinity, -Infinity).
std::string tracker_line(const Metrics& metrics, int64_t step);

}  // namespace tessera::driver
