// Loggers: console line, jsonl rows (one object per step, each step once across resumes), backend
// names (verl's `file`, refused trackers), the Python trackers (wandb, mlflow, swanlab: against
// stand-in modules that record every call), progress bar, start-up summary.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>

#include "driver/logger.hpp"
#include "driver/python_tracker.hpp"
#include "tests/driver/driver_test_util.hpp"

namespace tessera::driver {
namespace {

using nlohmann::json;

std::vector<json> read_lines(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::vector<json> out;
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

TEST(Logger, JsonlAppendsOneObjectPerStep) {
  testing::TempDir dir("jsonl");
  {
    auto t = Tracking::create({"jsonl"}, dir.path() / "run");
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    ASSERT_TRUE(t->log({{"critic/score/mean", 0.5}, {"timing_s/step", 1.25}}, 1).ok());
    // Visible before the logger is closed: flushed per line.
    EXPECT_EQ(read_lines(dir.path() / "run" / "metrics.jsonl").size(), 1u);
    ASSERT_TRUE(t->log({{"critic/score/mean", NAN}}, 2).ok());
  }
  {
    auto t = Tracking::create({"file"}, dir.path() / "run");  // verl's name; a resumed run appends
    ASSERT_TRUE(t->log({{"critic/score/mean", 0.75}}, 3).ok());
  }
  auto rows = read_lines(dir.path() / "run" / "metrics.jsonl");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0], json({{"step", 1}, {"critic/score/mean", 0.5}, {"timing_s/step", 1.25}}));
  EXPECT_TRUE(rows[1]["critic/score/mean"].is_null());  // NaN is not JSON
  EXPECT_EQ(rows[2]["step"], 3);
}

TEST(Logger, JsonlHoldsEachStepOnceAcrossResumes) {
  testing::TempDir dir("jsonl_resume");
  {
    auto t = Tracking::create({"jsonl", "file"}, dir.path());  // both names: one file, written once
    ASSERT_TRUE(t.ok());
    ASSERT_TRUE(t->start_at(-1).ok());
    for (int step = 1; step <= 4; ++step) ASSERT_TRUE(t->log({{"a", 1.0 * step}}, step).ok());
  }
  ASSERT_EQ(read_lines(dir.path() / "metrics.jsonl").size(), 4u);
  {
    // Killed after step 4, resumed from the checkpoint of step 2: steps 3 and 4 run again.
    auto t = Tracking::create({"jsonl"}, dir.path());
    ASSERT_TRUE(t->start_at(2).ok());
    ASSERT_TRUE(t->log({{"val", 0.5}}, 2).ok());  // validation before training, at the resumed step
    ASSERT_TRUE(t->log({{"a", 30.0}}, 3).ok());
    ASSERT_TRUE(t->log({{"a", 40.0}}, 4).ok());
    ASSERT_TRUE(t->log({{"val", 0.75}}, 4).ok());  // validation of the last step merges too
  }
  auto rows = read_lines(dir.path() / "metrics.jsonl");
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[1], json({{"step", 2}, {"a", 2.0}, {"val", 0.5}}));
  EXPECT_EQ(rows[2], json({{"step", 3}, {"a", 30.0}}));
  EXPECT_EQ(rows[3], json({{"step", 4}, {"a", 40.0}, {"val", 0.75}}));
  {
    auto t = Tracking::create({"jsonl"}, dir.path());  // a fresh run in the same directory
    ASSERT_TRUE(t->start_at(-1).ok());
    ASSERT_TRUE(t->log({{"a", 9.0}}, 1).ok());
  }
  EXPECT_EQ(read_lines(dir.path() / "metrics.jsonl"), (std::vector<json>{json({{"step", 1}, {"a", 9.0}})}));
}

TEST(Logger, UnknownOrUnsupportedBackendIsAnError) {
  testing::TempDir dir("unknown");
  auto t = Tracking::create({"console", "trackio"}, dir.path());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message(), "trainer.logger: 'trackio' is not supported by Tessera (supported: console, jsonl "
                                  "(or file), tensorboard, wandb, mlflow, swanlab, clearml)");
  auto typo = Tracking::create({"consol"}, dir.path());
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("unknown logger 'consol'"), std::string::npos);
  EXPECT_TRUE(check_logger_backends({"console", "file", "jsonl", "wandb", "mlflow", "swanlab", "clearml"}).ok());
  EXPECT_FALSE(check_logger_backends({"vemlp_wandb"}).ok());
  EXPECT_FALSE(check_logger_backends({"trackio"}).ok());
}

// Stand-ins for wandb, mlflow, swanlab and clearml (and the DataFrame clearml's tables take): each call is a JSON line [name, kwargs] in
// $FAKE_TRACKER_LOG (non-finite floats as "nan" / "inf" / "-inf", which JSON cannot hold).
// `extra` is appended to wandb.py (a failure to inject).
void write_fake_trackers(const testing::TempDir& dir, const std::string& extra = "") {
  const std::string record = R"PY(import json, math, os
def _plain(v):
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if v != v else ("inf" if v > 0 else "-inf")
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v
class _Table:  # wandb.Table and swanlab.echarts.Table, as what was put in them
    def __init__(self, columns=None, data=None):
        self.columns, self.data = columns, [list(r) for r in (data or [])]
    def add_data(self, *row):
        self.data.append(list(row))
    def add(self, headers, rows):
        self.columns, self.data = headers, rows
def _values(data):
    return {k: {"columns": v.columns, "data": v.data} if isinstance(v, _Table) else v for k, v in data.items()}
def _rec(_call, **kwargs):
    with open(os.environ["FAKE_TRACKER_LOG"], "a") as f:
        f.write(json.dumps([_call, _plain(kwargs)], default=repr) + "\n")
)PY";
  dir.write("fake/wandb.py", record + R"PY(
class Settings:
    def __init__(self, **kwargs):
        self.kwargs = kwargs
    def __repr__(self):
        return "Settings(" + ", ".join(f"{k}={v}" for k, v in sorted(self.kwargs.items())) + ")"
def init(**kwargs):
    print("wandb prints")
    os.system("echo a program wandb starts prints too")  # fd 1 is not the protocol's
    _rec("wandb.init", **kwargs)
Table = _Table
def log(data, step):
    _rec("wandb.log", data=_values(data), step=step)
def finish(exit_code=None):
    _rec("wandb.finish", exit_code=exit_code)
)PY" + extra);
  dir.write("fake/mlflow.py", record + R"PY(
class _Experiment:
    experiment_id = "7"
def set_tracking_uri(uri):
    _rec("mlflow.set_tracking_uri", uri=uri)
def set_experiment(name):
    _rec("mlflow.set_experiment", name=name)
    return _Experiment()
def start_run(**kwargs):
    _rec("mlflow.start_run", **kwargs)
def log_params(params):
    _rec("mlflow.log_params", params=params)
def log_metrics(metrics, step):
    _rec("mlflow.log_metrics", metrics=metrics, step=step)
def log_artifact(path):
    _rec("mlflow.log_artifact", name=os.path.basename(path), content=json.load(open(path)))
def end_run(status="FINISHED"):
    _rec("mlflow.end_run", status=status)
)PY");
  dir.write("fake/pandas.py", R"PY(  # what the clearml stand-in reads of a DataFrame
class DataFrame:
    def __init__(self, rows):
        self.rows = rows
    @classmethod
    def from_records(cls, rows):
        return cls(list(rows))
    def to_dict(self, orient):
        return self.rows
)PY");
  dir.write("fake/clearml.py", record + R"PY(
class _Logger:
    def report_scalar(self, **kwargs):
        _rec("clearml.report_scalar", **kwargs)
    def report_table(self, table_plot, **kwargs):
        _rec("clearml.report_table", rows=table_plot.to_dict("records"), **kwargs)
class Task:
    @staticmethod
    def init(**kwargs):
        _rec("clearml.Task.init", **kwargs)
        return Task()
    def connect_configuration(self, config, name=None):
        _rec("clearml.connect_configuration", config=config, name=name)
    def get_logger(self):
        return _Logger()
    def mark_completed(self):
        _rec("clearml.mark_completed")
    def mark_failed(self, status_message=None):
        _rec("clearml.mark_failed", status_message=status_message)
    def mark_stopped(self, status_message=None):
        _rec("clearml.mark_stopped", status_message=status_message)
)PY");
  dir.write("fake/swanlab.py", record + R"PY(
def login(key):
    _rec("swanlab.login", key=key)
def init(**kwargs):
    _rec("swanlab.init", **kwargs)
class echarts:
    Table = _Table
def log(data, step):
    _rec("swanlab.log", data=_values(data), step=step)
def finish(state="success", error=None):
    _rec("swanlab.finish", state=state, error=error)
)PY");
}

// As verl's Tracking: each library opens its run with the project, the experiment and the config,
// logs every step's metrics with step=, and finishes the run when the trainer is done.
TEST(Logger, PythonTrackersLogAsVerlDoes) {
  testing::TempDir dir("trackers");
  write_fake_trackers(dir);
  testing::ScopedEnv path("PYTHONPATH", (dir.path() / "fake").string());
  testing::ScopedEnv log_file("FAKE_TRACKER_LOG", (dir.path() / "calls.jsonl").string());
  testing::ScopedEnv python("TESSERA_LOGGER_PYTHON", "python3");
  testing::ScopedEnv mlflow_uri("MLFLOW_TRACKING_URI", "sqlite:///runs.db");
  testing::ScopedEnv swan_key("SWANLAB_API_KEY", "k123");
  testing::ScopedEnv swan_dir("SWANLAB_LOG_DIR", std::nullopt);
  testing::ScopedEnv swan_mode("SWANLAB_MODE", std::nullopt);
  const TrackerRun run{"proj", "exp", {{"trainer", {{"wandb_proxy", "http://proxy:3128"}}}, {"a", {{"b", {10, 20}}}}}};
  {
    auto t = Tracking::create({"wandb", "mlflow", "swanlab", "wandb", "clearml"}, dir.path(), stdout, dir.path() / "tb",
                              &run);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    EXPECT_FALSE(std::filesystem::exists(dir.path() / "calls.jsonl")) << "a run opened before the trainer started";
    ASSERT_TRUE(t->start_at(-1).ok());
    ASSERT_TRUE(t->log({{"critic/score/mean", 0.5}, {"actor/kl", NAN}, {"val-core/acc@4", 1.0}}, 1).ok());
    ASSERT_TRUE(t->log({{"critic/score/mean", 0.75}}, 2).ok());
    ASSERT_TRUE(t->log_generations({{"1+1=", "2", 1.0}, {"2+2=", "5", 0.0}}, 2).ok());
    ASSERT_TRUE(t->log_generations({{"1+1=", "2", 1.0}, {"2+2=", "4", 1.0}}, 3).ok());
    t->finish(true);
    EXPECT_TRUE(t->log({{"after", 1.0}}, 4).ok());  // the runs are over: nothing more is sent
  }  // waits for every run to finish
  std::vector<json> calls = read_lines(dir.path() / "calls.jsonl");
  std::map<std::string, std::vector<json>> by_lib;
  for (const json& c : calls) by_lib[c[0].get<std::string>().substr(0, c[0].get<std::string>().find('.'))].push_back(c);

  // Validation samples as verl's ValidationGenerationsLogger: wandb's table gains a row per
  // validation, swanlab gets a table per validation, mlflow an artifact per validation.
  const json wandb_table = json::parse(R"({"columns": ["step", "input_1", "output_1", "score_1", "input_2", "output_2",
      "score_2"], "data": [[2, "1+1=", "2", 1.0, "2+2=", "5", 0.0], [3, "1+1=", "2", 1.0, "2+2=", "4", 1.0]]})");
  std::vector<json> generation_calls;
  for (auto& [lib, lib_calls] : by_lib) {
    for (auto it = lib_calls.begin(); it != lib_calls.end();) {
      const json& args = (*it)[1];
      const bool generations = (args.contains("data") && args["data"].contains("val/generations")) ||
                               (*it)[0] == "mlflow.log_artifact" || (*it)[0] == "clearml.report_table";
      if (generations) {
        generation_calls.push_back(*it);
        it = lib_calls.erase(it);
      } else {
        ++it;
      }
    }
  }
  ASSERT_EQ(generation_calls.size(), 8u) << json(calls).dump();
  for (const json& c : generation_calls) {
    if (c[0] == "wandb.log" && c[1]["step"] == 3) {
      EXPECT_EQ(c[1]["data"]["val/generations"], wandb_table);
    }
    if (c[0] == "swanlab.log" && c[1]["step"] == 2) {
      EXPECT_EQ(c[1]["data"]["val/generations"],
                json::parse(R"({"columns": ["step", "input", "output", "score"],
                                "data": [[2, "1+1=", "2", 1.0], [2, "2+2=", "5", 0.0]]})"));
    }
    if (c[0] == "clearml.report_table" && c[1]["iteration"] == 3) {
      EXPECT_EQ(c[1]["title"], "Validation");
      EXPECT_EQ(c[1]["series"], "Validation generations");
      EXPECT_EQ(c[1]["rows"], json::parse(R"([{"step": 3, "input": "1+1=", "output": "2", "score": 1.0},
                                               {"step": 3, "input": "2+2=", "output": "4", "score": 1.0}])"));
    }
    if (c[0] == "mlflow.log_artifact" && c[1]["name"] == "val_step3.json") {
      EXPECT_EQ(c[1]["content"], json::parse(R"([{"input": "1+1=", "output": "2", "score": 1.0},
                                                  {"input": "2+2=", "output": "4", "score": 1.0}])"));
    }
  }

  const std::vector<json>& wandb = by_lib["wandb"];
  ASSERT_EQ(wandb.size(), 4u) << json(calls).dump();
  EXPECT_EQ(wandb[0][0], "wandb.init");
  EXPECT_EQ(wandb[0][1]["project"], "proj");
  EXPECT_EQ(wandb[0][1]["name"], "exp");
  EXPECT_EQ(wandb[0][1]["config"], run.config);
  EXPECT_EQ(wandb[0][1]["settings"], "Settings(https_proxy=http://proxy:3128)");
  EXPECT_EQ(wandb[1][1]["step"], 1);
  EXPECT_EQ(wandb[1][1]["data"], json({{"actor/kl", "nan"}, {"critic/score/mean", 0.5}, {"val-core/acc@4", 1.0}}));
  EXPECT_EQ(wandb[2][1]["step"], 2);
  EXPECT_EQ(wandb[3], json::parse(R"(["wandb.finish", {"exit_code": 0}])"));  // one run: the name twice

  const std::vector<json>& mlflow = by_lib["mlflow"];
  ASSERT_EQ(mlflow.size(), 7u) << json(calls).dump();
  EXPECT_EQ(mlflow[0][1]["uri"], "sqlite:///runs.db");
  EXPECT_EQ(mlflow[1][1]["name"], "proj");
  EXPECT_EQ(mlflow[2][1], json({{"experiment_id", "7"}, {"run_name", "exp"}}));
  EXPECT_EQ(mlflow[3][1]["params"], json({{"trainer/wandb_proxy", "http://proxy:3128"}, {"a/b/list_len", 2},
                                          {"a/b/0", 10}, {"a/b/1", 20}}));
  EXPECT_EQ(mlflow[4][1]["metrics"], json({{"actor/kl", "nan"}, {"critic/score/mean", 0.5}, {"val-core/acc_at_4", 1.0}}));
  EXPECT_EQ(mlflow[4][1]["step"], 1);
  EXPECT_EQ(mlflow[6], json::parse(R"(["mlflow.end_run", {"status": "FINISHED"}])"));

  const std::vector<json>& swanlab = by_lib["swanlab"];
  ASSERT_EQ(swanlab.size(), 5u) << json(calls).dump();
  EXPECT_EQ(swanlab[0][1]["key"], "k123");
  EXPECT_EQ(swanlab[1][1]["project"], "proj");
  EXPECT_EQ(swanlab[1][1]["experiment_name"], "exp");
  EXPECT_EQ(swanlab[1][1]["config"]["FRAMEWORK"], "verl");
  EXPECT_EQ(swanlab[1][1]["config"]["a"], run.config["a"]);
  EXPECT_EQ(swanlab[1][1]["logdir"], "swanlog");
  EXPECT_EQ(swanlab[1][1]["mode"], "cloud");
  EXPECT_EQ(swanlab[3][1]["step"], 2);
  EXPECT_EQ(swanlab[4], json::parse(R"(["swanlab.finish", {"state": "success", "error": null}])"));

  const std::vector<json>& clearml = by_lib["clearml"];
  ASSERT_EQ(clearml.size(), 7u) << json(calls).dump();  // init, config, 3 + 1 scalars, completed
  EXPECT_EQ(clearml[0][1], json({{"task_name", "exp"}, {"project_name", "proj"}, {"continue_last_task", true},
                                 {"output_uri", false}}));
  EXPECT_EQ(clearml[1][1], json({{"config", run.config}, {"name", "Hyperparameters"}}));
  EXPECT_EQ(clearml[2][1], json({{"title", "actor"}, {"series", "kl"}, {"value", "nan"}, {"iteration", 1}}));
  EXPECT_EQ(clearml[3][1], json({{"title", "critic"}, {"series", "score/mean"}, {"value", 0.5}, {"iteration", 1}}));
  EXPECT_EQ(clearml[4][1], json({{"title", "val-core"}, {"series", "acc@4"}, {"value", 1.0}, {"iteration", 1}}));
  EXPECT_EQ(clearml[6][0], "clearml.mark_completed");
}

// A run the trainer ends on an error is left failed; one whose trainer dies without a word (the
// process's input just ends) is left killed, as verl's crashed runs are.
TEST(Logger, PythonTrackerRunsEndFailedOrKilled) {
  testing::TempDir dir("tracker_ends");
  write_fake_trackers(dir);
  testing::ScopedEnv path("PYTHONPATH", (dir.path() / "fake").string());
  testing::ScopedEnv python("TESSERA_LOGGER_PYTHON", "python3");
  const TrackerRun run{"proj", "exp", json::object()};
  {
    testing::ScopedEnv log_file("FAKE_TRACKER_LOG", (dir.path() / "failed.jsonl").string());
    auto t = Tracking::create({"wandb", "mlflow", "swanlab", "clearml"}, dir.path(), stdout, dir.path() / "tb", &run);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    ASSERT_TRUE(t->log({{"x", 1.0}}, 1).ok());
  }  // no finish(true): the Tracking ends its runs as failed
  std::vector<json> failed = read_lines(dir.path() / "failed.jsonl");
  ASSERT_GE(failed.size(), 3u);
  std::vector<json> ends;
  for (const json& c : failed) {
    if (c[0] == "wandb.finish" || c[0] == "mlflow.end_run" || c[0] == "swanlab.finish" ||
        c[0].get<std::string>().rfind("clearml.mark_", 0) == 0) {
      ends.push_back(c);
    }
  }
  ASSERT_EQ(ends.size(), 4u) << json(failed).dump();
  for (const json& c : ends) {
    if (c[0] == "wandb.finish") {
      EXPECT_EQ(c[1]["exit_code"], 1);
    } else if (c[0] == "mlflow.end_run") {
      EXPECT_EQ(c[1]["status"], "FAILED");
    } else if (c[0].get<std::string>().rfind("clearml.", 0) == 0) {
      EXPECT_EQ(c[0], "clearml.mark_failed");
    } else {
      EXPECT_EQ(c[1]["state"], "crashed");
    }
  }
  {
    testing::ScopedEnv log_file("FAKE_TRACKER_LOG", (dir.path() / "killed.jsonl").string());
    auto tracker = PythonTracker::open("mlflow", run);
    ASSERT_TRUE(tracker.ok()) << tracker.status().to_string();
  }  // no finish at all: its input ends
  std::vector<json> killed = read_lines(dir.path() / "killed.jsonl");
  ASSERT_FALSE(killed.empty());
  EXPECT_EQ(killed.back(), json::parse(R"(["mlflow.end_run", {"status": "KILLED"}])"));
}

// A library that is not installed, or whose run does not open, stops the start with one line naming
// the backend; one whose process dies stops the run at the next step rather than dropping metrics.
TEST(Logger, PythonTrackerFailuresAreOneLineNamingTheBackend) {
  testing::TempDir dir("tracker_failures");
  testing::ScopedEnv log_file("FAKE_TRACKER_LOG", (dir.path() / "calls.jsonl").string());
  testing::ScopedEnv python("TESSERA_LOGGER_PYTHON", "python3");
  const TrackerRun run{"proj", "exp", json::object()};
  {
    write_fake_trackers(dir, "raise ModuleNotFoundError(\"No module named 'wandb'\", name='wandb')\n");
    testing::ScopedEnv path("PYTHONPATH", (dir.path() / "fake").string());
    auto t = Tracking::create({"wandb"}, dir.path(), stdout, dir.path() / "tb", &run);
    ASSERT_TRUE(t.ok()) << t.status().to_string();  // opened when the trainer starts
    const Status st = t->start_at(-1);
    ASSERT_FALSE(st.ok());
    const std::string m = st.message();
    EXPECT_EQ(m.rfind("trainer.logger: wandb: ModuleNotFoundError: No module named 'wandb' (install it for python3", 0), 0u)
        << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  {
    // A dependency of the library that is missing is its own error, without the install hint.
    write_fake_trackers(dir, "raise ModuleNotFoundError(\"No module named 'pydantic'\", name='pydantic')\n");
    testing::ScopedEnv path("PYTHONPATH", (dir.path() / "fake").string());
    auto t = Tracking::create({"wandb"}, dir.path(), stdout, dir.path() / "tb", &run);
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(t->log({{"x", 1.0}}, 1).message(), "trainer.logger: wandb: ModuleNotFoundError: No module named 'pydantic'");
  }
  {
    write_fake_trackers(dir, "def init(**kwargs):\n    raise RuntimeError('api key rejected')\n");
    testing::ScopedEnv path("PYTHONPATH", (dir.path() / "fake").string());
    auto t = Tracking::create({"wandb"}, dir.path(), stdout, dir.path() / "tb", &run);
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(t->start_at(-1).message(), "trainer.logger: wandb: RuntimeError: api key rejected");
  }
  {
    write_fake_trackers(dir, "def log(data, step):\n    os._exit(3)\n");
    testing::ScopedEnv path("PYTHONPATH", (dir.path() / "fake").string());
    auto t = Tracking::create({"wandb"}, dir.path(), stdout, dir.path() / "tb", &run);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    ASSERT_TRUE(t->log({{"x", 1.0}}, 1).ok());  // the process reads it, then exits
    // Later steps fail once the process is gone: a write to its closed pipe, or, once the pipe is
    // full, the wait for it to read, which ends when it exits.
    Status failed;
    for (int64_t step = 2; failed.ok() && step < 100000; ++step) failed = t->log({{"x", 1.0}}, step);
    ASSERT_FALSE(failed.ok());
    EXPECT_EQ(failed.message().rfind("trainer.logger: wandb: step ", 0), 0u) << failed.to_string();
    EXPECT_NE(failed.message().find("the process exited"), std::string::npos) << failed.to_string();
  }
  {
    // As verl: a failed mlflow artifact upload is a warning, and the run still ends finished.
    testing::ScopedEnv log_file("FAKE_TRACKER_LOG", (dir.path() / "artifact.jsonl").string());
    write_fake_trackers(dir);
    std::string mlflow = [&] {
      std::ifstream in(dir.path() / "fake/mlflow.py");
      return std::string(std::istreambuf_iterator<char>(in), {});
    }();
    dir.write("fake/mlflow.py", mlflow + "def log_artifact(path):\n    raise OSError('artifact store unreachable')\n");
    testing::ScopedEnv path("PYTHONPATH", (dir.path() / "fake").string());
    auto t = Tracking::create({"mlflow"}, dir.path(), stdout, dir.path() / "tb", &run);
    ASSERT_TRUE(t.ok());
    ASSERT_TRUE(t->log_generations({{"1+1=", "2", NAN}}, 1).ok());
    ASSERT_TRUE(t->log({{"x", 1.0}}, 1).ok());
    t->finish(true);
  }
  std::vector<json> artifact = read_lines(dir.path() / "artifact.jsonl");
  ASSERT_FALSE(artifact.empty());
  EXPECT_EQ(artifact.back(), json::parse(R"(["mlflow.end_run", {"status": "FINISHED"}])"));
  EXPECT_EQ(tracker_line({{"a", 1.5}, {"b", -INFINITY}, {"c\"", NAN}}, 3),
            "{\"step\": 3, \"data\": {\"a\": 1.5, \"b\": -Infinity, \"c\\\"\": NaN}}\n");
}

// TensorBoard's own reader (PyPI's tensorboard EventAccumulator) reads the scalars back, and a
// resumed run's SessionLog START hides the steps the killed run logged past its checkpoint.
TEST(Logger, TensorBoardReadsTheEventFiles) {
  const char* py = std::getenv("TESSERA_PYTHON");
  if (py == nullptr || *py == '\0') GTEST_SKIP() << "TESSERA_PYTHON (with tensorboard) is not set";
  testing::TempDir dir("tensorboard");
  const auto tb = dir.path() / "tb";
  {
    auto t = Tracking::create({"tensorboard"}, dir.path(), stdout, tb);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    ASSERT_TRUE(t->start_at(-1).ok());
    for (int step = 1; step <= 4; ++step) {
      ASSERT_TRUE(t->log({{"critic/score/mean", 0.25 * step}, {"actor/kl", NAN}}, step).ok());
    }
  }
  {
    auto t = Tracking::create({"tensorboard"}, dir.path(), stdout, tb);  // resumed after step 2
    ASSERT_TRUE(t->start_at(2).ok());
    ASSERT_TRUE(t->log({{"critic/score/mean", 3.0}}, 3).ok());
    ASSERT_TRUE(t->log_generations({{"1+1=", "2", 1.0}, {"2+2=", "5", 0.25}}, 3).ok());
  }
  std::ofstream(dir.path() / "read.py") << R"(
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1])
acc.Reload()
for e in acc.Scalars("critic/score/mean"):
    print(e.step, e.value)
print("tags", sorted(acc.Tags()["scalars"]))
for e in acc.Tensors("val/generations/text_summary"):
    print("text", e.step, repr(e.tensor_proto.string_val[0].decode()))
)";
  const std::string out =
      testing::run_command(fmt::format("{} {} {} 2>&1", py, (dir.path() / "read.py").string(), tb.string())).text;
  // (TensorBoard's own log line about the purge may come first.)
  EXPECT_NE(out.find("\n1 0.25\n2 0.5\n3 3.0\ntags ['actor/kl', 'critic/score/mean']\n"), std::string::npos) << out;
  // verl's text for trainer.log_val_generations, as SummaryWriter.add_text writes it.
  EXPECT_NE(out.find("text 3 '**Generation Results - Step 3**\\n\\n### Sample 1\\n**Input:** 1+1=\\n\\n**Output:** 2"
                     "\\n\\n**Score:** 1.0\\n\\n---\\n\\n### Sample 2\\n**Input:** 2+2=\\n\\n**Output:** 5\\n\\n"
                     "**Score:** 0.25\\n\\n---\\n\\n'"),
            std::string::npos)
      << out;
}

TEST(Logger, ProgressBarClearsItsLineForConsoleLines) {
  std::FILE* sink = std::tmpfile();
  double now = 0;
  ProgressBar bar(4, sink, /*is_tty=*/true, [&] { return now; });
  bar.update(1);
  bar.clear();
  std::fputs("step:1 - a:1\n", sink);  // a console line, on a line of its own
  bar.clear();                         // nothing drawn: no-op
  bar.update(2);
  bar.finish();
  std::rewind(sink);
  std::string out;
  for (int c; (c = std::fgetc(sink)) != EOF;) out += static_cast<char>(c);
  std::fclose(sink);
  const size_t line = out.find("step:1 - a:1\n");
  ASSERT_NE(line, std::string::npos) << out;
  EXPECT_EQ(out.substr(line - 4, 4), "\r\033[K") << out;  // the bar's text was erased first
  EXPECT_EQ(out.find("\r\033[K", line + 1), line + 13);      // then redrawn
}

TEST(Logger, RunSummarySaysWhatRunsAndWhereItStarts) {
  RunSummary s;
  s.what = "GRPO";
  s.device = "cuda";
  s.groups = {{"actor_rollout_ref", 8}};
  s.train_rows = 7473;
  s.val_rows = 1319;
  s.steps_per_epoch = 29;
  s.epochs = 15;
  s.total_steps = 435;
  s.out_dir = "checkpoints/gsm8k/run1";
  s.save_freq = 20;
  auto lines = run_summary_lines(s);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0], "GRPO on cuda in this process: actor_rollout_ref (8 ranks)");
  EXPECT_EQ(lines[1], "data: 7473 training rows, 1319 validation rows; 29 steps per epoch x 15 epochs -> 435 steps");
  EXPECT_EQ(lines[2], "output: checkpoints/gsm8k/run1 (metrics.jsonl, config.yaml; checkpoints every 20 steps)");
  EXPECT_EQ(lines[3], "starting at step 1");
  s.resumed_step = 40;
  EXPECT_EQ(run_summary_lines(s)[3], "resuming after step 40 (checkpoint global_step_40); 395 steps to go");
  s.resumed_step = 435;
  EXPECT_EQ(run_summary_lines(s)[3], "nothing left to do: step 435 of 435 is done (checkpoint global_step_435)");
  s.agents = 2;
  s.val_rows = -1;
  EXPECT_EQ(run_summary_lines(s)[0], "GRPO on cuda across 2 agents: actor_rollout_ref (8 ranks)");
  EXPECT_NE(run_summary_lines(s)[1].find("no validation set"), std::string::npos);
  s.model = "Qwen2ForCausalLM at m: 24 layers, 494M parameters";
  EXPECT_EQ(run_summary_lines(s)[1], "model: Qwen2ForCausalLM at m: 24 layers, 494M parameters");
}

// The model line from config.json: every weight, and for a MoE model the ones a token meets.
TEST(Logger, ModelSummaryCountsParametersAndActiveExperts) {
  testing::TempDir dir("model_summary");
  const std::string moe = dir.write("moe/config.json", R"({"architectures": ["Qwen3MoeForCausalLM"],
      "model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
      "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
      "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "norm_topk_prob": true})")
                              .parent_path()
                              .string();
  EXPECT_EQ(model_summary(moe), "Qwen3MoeForCausalLM at " + moe + ": 48 layers, 30.5B parameters, 3.4B per token "
                                "(8 of 128 experts)");
  EXPECT_EQ(model_summary(dir.path() / "missing"), "");
}

TEST(Logger, ConsoleLineHasKeyMetrics) {
  ConsoleLogger console(stdout);
  Metrics m = {{"critic/score/mean", 0.5}, {"actor/pg_loss", -0.0123456}, {"val-core/a/acc/mean@1", 0.25},
               {"timing_s/gen", 3.0}, {"timing_s/step", 4.0}};
  std::string line = console.format_line(m, 7);
  EXPECT_EQ(line, "step:7 - critic/score/mean:0.5 - actor/pg_loss:-0.01235 - timing_s/step:4 - val-core/a/acc/mean@1:0.25");
  ConsoleLogger all(stdout, /*all_metrics=*/true);
  EXPECT_NE(all.format_line(m, 7).find("timing_s/gen:3"), std::string::npos);
}

TEST(Logger, ProgressBarRendersEta) {
  double now = 100.0;
  std::FILE* sink = std::tmpfile();
  ProgressBar bar(10, sink, /*is_tty=*/false, [&] { return now; });
  bar.set_initial(0);  // a fresh run whose first report is step 2
  now = 104.0;
  bar.update(2, {{"critic/score/mean", 0.5}});
  std::string line = bar.render(2, 4.0, {{"critic/score/mean", 0.5}});
  EXPECT_EQ(line, "[######........................] 2/10  20% 2.00s/step ETA 00:16 critic/score/mean=0.5");
  std::rewind(sink);
  char buf[256] = {};
  ASSERT_NE(std::fgets(buf, sizeof buf, sink), nullptr);
  EXPECT_EQ(std::string(buf), line + "\n");  // not a TTY: plain lines
  // Unset, the first update defines the starting point (a run resumed after step 4).
  ProgressBar resumed(10, sink, /*is_tty=*/false, [&] { return now; });
  now = 110.0;
  resumed.update(5);
  EXPECT_NE(resumed.render(5, 10.0, {}).find("10.00s/step ETA 00:50"), std::string::npos) << resumed.render(5, 10.0, {});
  std::fclose(sink);
  EXPECT_EQ(format_duration(3725), "1:02:05");
  EXPECT_EQ(format_duration(NAN), "--:--");
}

}  // namespace
}  // namespace tessera::driver
