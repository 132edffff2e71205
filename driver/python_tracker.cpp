// python_tracker.cpp: see python_tracker.hpp.
#include "driver/python_tracker.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "runtime/python_child.hpp"

namespace tessera::driver {
namespace {

using nlohmann::json;
using runtime::Clock;

// The backend's process: reads the config (one JSON line), opens the run as verl's Tracking does,
// answers {"ready": true} (or {"fatal": ...}), then logs one step per input line and finishes the
// run at end of input. After runtime::kProtocolPipes: the library's output goes to stderr.
constexpr const char* kTrackerScript = R"PY(
import signal
signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's: it ends the run with "end"
backend, project, experiment = sys.argv[1], sys.argv[2], sys.argv[3]

def flatten(x, prefix, out):  # verl's mlflow params: lists as dicts, then pandas.json_normalize(sep="/")
    if isinstance(x, list):
        x = dict({"list_len": len(x)}, **{str(i): v for i, v in enumerate(x)})
    if isinstance(x, dict):
        for k, v in x.items():
            flatten(v, f"{prefix}/{k}" if prefix else str(k), out)
    else:
        out[prefix] = x
    return out

def swanlab_finish(state):
    try:
        swanlab.finish(state=state, error=None if state == "success" else "the Tessera run " + how)
    except TypeError:  # an older swanlab
        swanlab.finish()

try:
    config = json.loads(requests.readline())
    if backend == "wandb":
        import wandb
        proxy = (config.get("trainer") or {}).get("wandb_proxy")
        settings = wandb.Settings(https_proxy=proxy) if proxy else None
        wandb.init(project=project, name=experiment, config=config, settings=settings)
        log = lambda data, step: wandb.log(data=data, step=step)
        table = None
        def log_generations(samples, step):  # verl: one table, a row per validation, re-logged whole
            global table
            columns = ["step"] + sum([[f"input_{i + 1}", f"output_{i + 1}", f"score_{i + 1}"]
                                      for i in range(len(samples))], [])
            table = wandb.Table(columns=columns, data=table.data if table is not None else None)
            table.add_data(step, *[x for sample in samples for x in sample])
            wandb.log({"val/generations": table}, step=step)
        finish = lambda: wandb.finish(exit_code=0 if how == "finished" else 1)
    elif backend == "mlflow":
        import mlflow
        mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI", "sqlite:////tmp/mlruns.db"))
        experiment_id = mlflow.set_experiment(project).experiment_id
        mlflow.start_run(experiment_id=experiment_id, run_name=experiment)
        mlflow.log_params(flatten(config, "", {}))
        log = lambda data, step: mlflow.log_metrics(metrics={k.replace("@", "_at_"): v for k, v in data.items()},
                                                    step=step)
        def log_generations(samples, step):  # as verl: a failed upload is a warning
            import tempfile
            try:
                with tempfile.TemporaryDirectory() as tmp:
                    path = os.path.join(tmp, f"val_step{step}.json")
                    with open(path, "w") as f:
                        json.dump([{"input": i, "output": o, "score": s} for i, o, s in samples], f)
                    mlflow.log_artifact(path)
            except Exception as e:
                print(f"WARNING: save validation generation file to mlflow failed with error {e}")
        finish = lambda: mlflow.end_run(status={"finished": "FINISHED", "failed": "FAILED"}.get(how, "KILLED"))
    elif backend == "swanlab":
        import swanlab
        if os.environ.get("SWANLAB_API_KEY"):
            swanlab.login(os.environ["SWANLAB_API_KEY"])
        swanlab.init(project=project, experiment_name=experiment, config={"FRAMEWORK": "verl", **config},
                     logdir=os.environ.get("SWANLAB_LOG_DIR", "swanlog"), mode=os.environ.get("SWANLAB_MODE", "cloud"))
        log = lambda data, step: swanlab.log(data, step=step)
        def log_generations(samples, step):
            t = swanlab.echarts.Table()
            t.add(headers=["step", "input", "output", "score"], rows=[[step, *sample] for sample in samples])
            swanlab.log({"val/generations": t}, step=step)
        finish = lambda: swanlab_finish("success" if how == "finished" else "crashed")
    elif backend == "clearml":
        import clearml
        task = clearml.Task.init(task_name=experiment, project_name=project, continue_last_task=True,
                                 output_uri=False)
        task.connect_configuration(config, name="Hyperparameters")
        def log(data, step):  # verl: "title/series" names; a name without "/" is its own series
            for k, v in data.items():
                title, series = k.split("/", 1) if "/" in k else (k, k)
                task.get_logger().report_scalar(title=title, series=series, value=v, iteration=step)
        def log_generations(samples, step):
            import pandas as pd
            rows = [{"step": step, "input": i, "output": o, "score": s} for i, o, s in samples]
            task.get_logger().report_table(series="Validation generations", title="Validation",
                                           table_plot=pd.DataFrame.from_records(rows), iteration=step)
        def finish():  # verl marks its task completed; a failed or killed run is marked so
            if how == "finished":
                task.mark_completed()
            elif how == "failed":
                task.mark_failed(status_message="the Tessera run failed")
            else:
                task.mark_stopped(status_message="the Tessera run " + how)
    else:
        raise ValueError(f"unknown backend {backend}")
except BaseException as e:
    missing = isinstance(e, ModuleNotFoundError) and (e.name or "").split(".")[0] == backend
    proto.write(json.dumps({"fatal": f"{type(e).__name__}: {e}", "missing": missing}) + "\n")
    proto.flush()
    sys.exit(1)
proto.write(json.dumps({"ready": True}) + "\n")
proto.flush()
how = "was killed"  # input ends without {"end": ...}: the trainer died
for line in requests:
    row = json.loads(line)
    if "end" in row:
        how = "finished" if row["end"] == 0 else "failed"
        break
    if "generations" in row:
        log_generations(row["generations"], row["step"])
    else:
        log(row["data"], row["step"])
finish()
)PY";

// JSON for a metric value; Python's json module reads NaN, Infinity and -Infinity.
std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  return json(v).dump();
}

}  // namespace

struct PythonTracker::Child : runtime::PythonChild {};

bool is_python_tracker(const std::string& name) {
  return name == "wandb" || name == "mlflow" || name == "swanlab" || name == "clearml";
}

std::string tracker_line(const Metrics& metrics, int64_t step) {
  std::string line = fmt::format("{{\"step\": {}, \"data\": {{", step);
  bool first = true;
  for (const auto& [key, value] : metrics) {
    line += fmt::format("{}{}: {}", first ? "" : ", ", json(key).dump(-1, ' ', false, json::error_handler_t::replace),
                        number(value));
    first = false;
  }
  return line + "}}\n";
}

Result<std::unique_ptr<PythonTracker>> PythonTracker::open(const std::string& backend, const TrackerRun& run,
                                                           std::chrono::milliseconds start_timeout) {
  if (!is_python_tracker(backend)) {
    return make_error(ErrorCode::invalid_argument, "trainer.logger: '{}' is not a Python logger", backend);
  }
  const std::string python = runtime::python_from_env("TESSERA_LOGGER_PYTHON"), what = "trainer.logger: " + backend;
  TESSERA_ASSIGN_OR_RETURN(runtime::PythonChild spawned,
                           runtime::spawn_python(python, kTrackerScript, {backend, run.project, run.experiment}, what));
  auto child = std::make_unique<Child>();
  static_cast<runtime::PythonChild&>(*child) = std::move(spawned);
  const auto deadline = Clock::now() + start_timeout;
  Status sent =
      runtime::write_all(*child, run.config.dump(-1, ' ', false, json::error_handler_t::replace) + "\n", deadline);
  Result<std::string> line = sent.ok() ? runtime::read_line(*child, deadline) : sent;
  const json ready = line.ok() ? json::parse(*line, nullptr, false) : json();
  if (ready.is_object() && ready.value("ready", false)) {
    return std::unique_ptr<PythonTracker>(new PythonTracker(backend, std::move(child)));
  }
  runtime::kill_child(*child);
  std::string why = !line.ok() ? (line.status().code() == ErrorCode::timeout
                                      ? fmt::format("its run did not open within {} s", start_timeout.count() / 1000)
                                      : line.status().message())
                    : ready.is_object() && ready.contains("fatal") ? ready["fatal"].get<std::string>()
                                                                   : "unexpected output: " + runtime::first_line(*line);
  const bool missing = ready.is_object() && ready.value("missing", false);
  return make_error(missing ? ErrorCode::unimplemented : ErrorCode::unavailable, "{}: {}{}", what,
                    runtime::first_line(why),
                    missing ? fmt::format(" (install it for {}, or point TESSERA_LOGGER_PYTHON at a Python that has it)",
                                          python)
                            : std::string());
}

PythonTracker::PythonTracker(std::string backend, std::unique_ptr<Child> child)
    : backend_(std::move(backend)), child_(std::move(child)) {}

PythonTracker::~PythonTracker() {
  constexpr auto kGrace = std::chrono::minutes(3);
  if (!child_) return;
  const std::optional<int> status = runtime::finish_child(*child_, kGrace);
  if (!status) {
    std::fprintf(stderr, "warning: trainer.logger: %s had not finished its run after %ld s and was stopped\n",
                 backend_.c_str(), static_cast<long>(std::chrono::seconds(kGrace).count()));
  } else if (*status != 0) {
    std::fprintf(stderr, "warning: trainer.logger: %s exited with status %d while finishing its run (its output is "
                 "above)\n", backend_.c_str(), *status);
  }
}

Status PythonTracker::log_generations(const std::vector<GenerationSample>& samples, int64_t step) {
  const auto text = [](const std::string& s) { return json(s).dump(-1, ' ', false, json::error_handler_t::replace); };
  std::string line = fmt::format("{{\"step\": {}, \"generations\": [", step);
  for (size_t i = 0; i < samples.size(); ++i) {
    line += fmt::format("{}[{}, {}, {}]", i == 0 ? "" : ", ", text(samples[i].input), text(samples[i].output),
                        number(samples[i].score));
  }
  line += "]}\n";
  return send(line, fmt::format("the validation samples of step {} were", step));
}

Status PythonTracker::send(const std::string& line, const std::string& what) {
  // A logger that stopped reading for this long is stuck: the run stops instead of hanging.
  constexpr auto kWriteTimeout = std::chrono::minutes(5);
  Status st = runtime::write_all(*child_, line, Clock::now() + kWriteTimeout);
  if (st.ok()) return st;
  return make_error(ErrorCode::unavailable, "trainer.logger: {}: {} not logged: {} (its output is above)", backend_,
                    what, st.message());
}

void PythonTracker::finish(bool ok) {
  if (ended_ || !child_) return;
  ended_ = true;
  // A process that does not take this line quickly ends the run as killed instead.
  (void)runtime::write_all(*child_, ok ? "{\"end\": 0}\n" : "{\"end\": 1}\n", Clock::now() + std::chrono::seconds(10));
  if (child_->in >= 0) {
    ::close(child_->in);
    child_->in = -1;
  }
}

Status PythonTracker::log(const Metrics& metrics, int64_t step) {
  return send(tracker_line(metrics, step), fmt::format("step {} was", step));
}

}  // namespace tessera::driver
