// Loggers and the progress bar (driver/logger.hpp).
#include "driver/logger.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <system_error>

#include "driver/config.hpp"
#include "driver/internal/jsonl.hpp"
#include "driver/python_tracker.hpp"
#include "driver/tensorboard.hpp"
#include "proto/atomic_file.hpp"
#include "workers/models/config.hpp"
#include "workers/models/param_count.hpp"

namespace tessera::driver {
namespace {

// Metrics the console prints by default, by prefix, in this order.
const char* const kConsoleKeys[] = {
    "critic/score/mean", "critic/rewards/mean", "actor/pg_loss",  "actor/kl_loss",
    "actor/ppo_kl",      "actor/entropy",       "critic/vf_loss", "response_length/mean",
    "timing_s/step",     "perf/throughput",     "val-core/",
};

std::string format_value(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{}", static_cast<int64_t>(v));
  return fmt::format("{:.4g}", v);
}

}  // namespace

std::string ConsoleLogger::format_line(const Metrics& metrics, int64_t step) const {
  std::string line = fmt::format("step:{}", step);
  auto emit = [&](const std::string& k, double v) { line += fmt::format(" - {}:{}", k, format_value(v)); };
  if (all_) {
    for (const auto& [k, v] : metrics) emit(k, v);
    return line;
  }
  for (const char* key : kConsoleKeys) {
    std::string prefix = key;
    if (prefix.back() == '/') {
      for (auto it = metrics.lower_bound(prefix); it != metrics.end() && it->first.rfind(prefix, 0) == 0; ++it) {
        emit(it->first, it->second);
      }
    } else if (auto it = metrics.find(prefix); it != metrics.end()) {
      emit(it->first, it->second);
    }
  }
  return line;
}

Status ConsoleLogger::log(const Metrics& metrics, int64_t step) {
  std::string line = format_line(metrics, step) + "\n";
  if (std::fputs(line.c_str(), out_) < 0 || std::fflush(out_) != 0) {
    return make_error(ErrorCode::io_error, "console logger: write failed");
  }
  return Status();
}

Result<std::unique_ptr<JsonlLogger>> JsonlLogger::open(const std::filesystem::path& path) {
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  if (ec) return make_error(ErrorCode::io_error, "jsonl logger: cannot create {}: {}", path.parent_path().string(), ec.message());
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) return make_error(ErrorCode::io_error, "jsonl logger: cannot open {} for appending", path.string());
  return std::unique_ptr<JsonlLogger>(new JsonlLogger(path, f));
}

JsonlLogger::~JsonlLogger() {
  if (file_ != nullptr) std::fclose(file_);
}

Status JsonlLogger::log(const Metrics& metrics, int64_t step) {
  nlohmann::json row = nlohmann::json::object();
  row["step"] = step;
  if (last_row_ && (*last_row_)["step"] == step) {
    // The same step again: merge into the row just written and replace it.
    row = std::move(*last_row_);
    if (std::fflush(file_) != 0 || ::ftruncate(::fileno(file_), last_offset_) != 0) {
      return make_error(ErrorCode::io_error, "jsonl logger: cannot rewrite the last row of {}", path_.string());
    }
  } else {
    std::fseek(file_, 0, SEEK_END);
    last_offset_ = std::ftell(file_);
  }
  for (const auto& [k, v] : metrics) row[k] = std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
  std::string line = row.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    return make_error(ErrorCode::io_error, "jsonl logger: write to {} failed", path_.string());
  }
  last_row_ = std::move(row);
  return Status();
}

Status JsonlLogger::start_at(int64_t step) {
  std::string kept;
  std::optional<nlohmann::json> last;
  long last_offset = 0;
  TESSERA_RETURN_IF_ERROR(internal::for_each_jsonl(path_, [&](const nlohmann::json& row, const std::string& where) {
    auto it = row.find("step");
    if (it == row.end() || !it->is_number_integer()) {
      return make_error(ErrorCode::corrupt_data, "{}: no integer \"step\"", where);
    }
    if (it->get<int64_t>() > step) return Status();
    last_offset = static_cast<long>(kept.size());
    kept += row.dump() + "\n";
    last = row;
    return Status();
  }));
  TESSERA_RETURN_IF_ERROR(proto::write_file_atomic(path_.string(), kept));
  // The old handle points at the replaced file: reopen.
  std::FILE* f = std::fopen(path_.c_str(), "a");
  if (f == nullptr) return make_error(ErrorCode::io_error, "jsonl logger: cannot reopen {}", path_.string());
  std::fclose(file_);
  file_ = f;
  last_row_ = std::move(last);
  last_offset_ = last_offset;
  return Status();
}

constexpr const char* kSupportedLoggers = "console, jsonl (or file), tensorboard, wandb, mlflow, swanlab, clearml";

Status check_logger_backends(const std::vector<std::string>& backends) {
  for (const auto& name : backends) {
    if (name == "console" || name == "jsonl" || name == "file" || name == "tensorboard" || is_python_tracker(name)) {
      continue;
    }
    if (name == "vemlp_wandb" || name == "trackio") {
      return make_error(ErrorCode::unimplemented, "trainer.logger: '{}' is not supported by Tessera (supported: {})",
                        name, kSupportedLoggers);
    }
    return make_error(ErrorCode::invalid_argument, "trainer.logger: unknown logger '{}' (supported: {})", name,
                      kSupportedLoggers);
  }
  return Status();
}

Result<Tracking> Tracking::create(const std::vector<std::string>& backends, const std::filesystem::path& local_dir,
                                  std::FILE* console, const std::filesystem::path& tensorboard_dir,
                                  const TrackerRun* run) {
  TESSERA_RETURN_IF_ERROR(check_logger_backends(backends));
  Tracking t;
  bool has_jsonl = false;
  for (const auto& name : backends) {
    if (is_python_tracker(name)) {
      if (run == nullptr) {
        return make_error(ErrorCode::invalid_argument, "trainer.logger: '{}' needs the run's project, experiment and "
                                                       "config (Tracking::from_config)", name);
      }
      if (std::find(t.pending_.begin(), t.pending_.end(), name) == t.pending_.end()) t.pending_.push_back(name);
      if (!t.run_) t.run_ = std::make_shared<const TrackerRun>(*run);
      continue;
    }
    if (name == "console") {
      t.add(std::make_unique<ConsoleLogger>(console));
    } else if (name == "jsonl" || name == "file") {  // "file" is verl's name for its JSONL backend
      if (has_jsonl) continue;
      has_jsonl = true;
      TESSERA_ASSIGN_OR_RETURN(auto logger, JsonlLogger::open(local_dir / "metrics.jsonl"));
      t.add(std::move(logger));
    } else if (name == "tensorboard") {
      TESSERA_ASSIGN_OR_RETURN(auto logger, TensorBoardLogger::open(tensorboard_dir));
      t.add(std::move(logger));
    }
  }
  return t;
}

Result<Tracking> Tracking::from_config(const nlohmann::json& cfg, std::FILE* console) {
  // A string is one backend (verl: trainer.logger=console); load_config already makes it a list.
  const nlohmann::json* raw = config_find(cfg, "trainer.logger");
  std::vector<std::string> backends;
  if (raw != nullptr && raw->is_string()) {
    backends.push_back(raw->get<std::string>());
  } else {
    TESSERA_ASSIGN_OR_RETURN(backends, config_get<std::vector<std::string>>(cfg, "trainer.logger"));
  }
  if (console == nullptr) backends.erase(std::remove(backends.begin(), backends.end(), "console"), backends.end());
  TESSERA_ASSIGN_OR_RETURN(std::string dir, config_get<std::string>(cfg, "trainer.default_local_dir"));
  // The run's record of what it ran with (Hydra's .hydra/config.yaml).
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return make_error(ErrorCode::io_error, "trainer.default_local_dir: cannot create {}: {}", dir, ec.message());
  TESSERA_RETURN_IF_ERROR(proto::write_file_atomic((std::filesystem::path(dir) / "config.yaml").string(), config_to_yaml(cfg)));
  TESSERA_ASSIGN_OR_RETURN(std::string project, config_get<std::string>(cfg, "trainer.project_name"));
  TESSERA_ASSIGN_OR_RETURN(std::string experiment, config_get<std::string>(cfg, "trainer.experiment_name"));
  const TrackerRun run{project, experiment, cfg};
  return create(backends, dir, console ? console : stdout, tensorboard_dir(project, experiment), &run);
}

Tracking::~Tracking() { finish(false); }

Status Tracking::open_python_trackers() {
  for (auto it = pending_.begin(); it != pending_.end(); it = pending_.erase(it)) {
    TESSERA_ASSIGN_OR_RETURN(auto logger, PythonTracker::open(*it, *run_));
    add(std::move(logger));
  }
  return Status();
}

Status Tracking::start_at(int64_t step) {
  TESSERA_RETURN_IF_ERROR(open_python_trackers());
  for (auto& l : loggers_) TESSERA_RETURN_IF_ERROR(l->start_at(step));
  return Status();
}

template <class Call>
Status Tracking::each_logger(Call call) {
  if (finished_) return Status();  // the runs are over (e.g. a REPL validation after the last step)
  TESSERA_RETURN_IF_ERROR(open_python_trackers());
  Status first;
  for (auto& l : loggers_) {
    Status st = call(*l);
    if (first.ok() && !st.ok()) first = st;
  }
  return first;
}

Status Tracking::log_generations(const std::vector<GenerationSample>& samples, int64_t step) {
  return each_logger([&](MetricLogger& l) { return l.log_generations(samples, step); });
}

void Tracking::finish(bool ok) {
  if (finished_) return;
  finished_ = true;
  pending_.clear();
  for (auto& l : loggers_) l->finish(ok);
}

Status Tracking::log(const Metrics& metrics, int64_t step) {
  return each_logger([&](MetricLogger& l) { return l.log(metrics, step); });
}

std::vector<std::string> run_summary_lines(const RunSummary& s) {
  std::vector<std::string> lines;
  std::string groups;
  for (const auto& [name, ranks] : s.groups) {
    groups += fmt::format("{}{} ({} rank{})", groups.empty() ? "" : ", ", name, ranks, ranks == 1 ? "" : "s");
  }
  lines.push_back(fmt::format("{} on {}{}: {}", s.what, s.device,
                              s.agents > 0 ? fmt::format(" across {} agents", s.agents) : std::string(" in this process"),
                              groups));
  if (!s.model.empty()) lines.push_back("model: " + s.model);
  lines.insert(lines.end(), s.notes.begin(), s.notes.end());
  lines.push_back(fmt::format("data: {} training rows, {}; {} steps per epoch x {} epochs -> {} steps", s.train_rows,
                              s.val_rows < 0 ? std::string("no validation set") : fmt::format("{} validation rows", s.val_rows),
                              s.steps_per_epoch, s.epochs, s.total_steps));
  lines.push_back(fmt::format("output: {} (metrics.jsonl, config.yaml; checkpoints {})", s.out_dir,
                              s.save_freq > 0 ? fmt::format("every {} steps", s.save_freq) : std::string("at the end")));
  if (s.resumed_step >= s.total_steps) {
    lines.push_back(fmt::format("nothing left to do: step {} of {} is done (checkpoint global_step_{})", s.resumed_step,
                                s.total_steps, s.resumed_step));
  } else if (s.resumed_step > 0) {
    lines.push_back(fmt::format("resuming after step {} (checkpoint global_step_{}); {} steps to go", s.resumed_step,
                                s.resumed_step, s.total_steps - s.resumed_step));
  } else {
    lines.push_back("starting at step 1");
  }
  return lines;
}

std::string model_summary(const std::string& path, const nlohmann::json& override) {
  auto c = models::load_model_config(path, override);
  if (!c.ok()) return std::string();
  auto billions = [](double n) { return n >= 1e9 ? fmt::format("{:.1f}B", n / 1e9) : fmt::format("{:.0f}M", n / 1e6); };
  std::string text = fmt::format("{} at {}: {} layers, {} parameters", c->architecture, path, c->num_hidden_layers,
                                 billions(models::model_params(*c, /*per_token=*/false)));
  if (c->moe.num_experts > 0) {
    text += fmt::format(", {} per token ({} of {} experts)", billions(models::model_params(*c, /*per_token=*/true)),
                        c->moe.num_experts_per_tok, c->moe.num_experts);
  }
  return text;
}

RunSummary run_summary_from_config(const nlohmann::json& cfg) {
  RunSummary r;
  auto text = [&](const char* key) {
    auto v = config_get<std::string>(cfg, key);
    return v.ok() ? *v : std::string();
  };
  auto number = [&](const char* key, int64_t fallback) {
    auto v = config_get<int64_t>(cfg, key);
    return v.ok() ? *v : fallback;
  };
  r.device = text("trainer.device");
  r.out_dir = text("trainer.default_local_dir");
  r.epochs = number("trainer.total_epochs", 1);
  r.save_freq = number("trainer.save_freq", -1);
  if (const auto* agents = config_find(cfg, "cluster.agents"); agents != nullptr && agents->is_array()) {
    r.agents = agents->size();
  }
  return r;
}

void print_run_summary(std::FILE* out, const RunSummary& s) {
  if (out == nullptr) return;
  for (const auto& line : run_summary_lines(s)) std::fprintf(out, "tessera: %s\n", line.c_str());
  std::fflush(out);
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  auto s = static_cast<int64_t>(std::llround(seconds));
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60);
  return fmt::format("{:02}:{:02}", s / 60, s % 60);
}

ProgressBar::ProgressBar(int64_t total, std::FILE* out, std::optional<bool> is_tty, std::function<double()> now)
    : total_(total), out_(out), now_(std::move(now)) {
  tty_ = is_tty.has_value() ? *is_tty : ::isatty(::fileno(out)) == 1;
  if (!now_) {
    now_ = [] { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); };
  }
  start_ = now_();
}

std::string ProgressBar::render(int64_t step, double seconds, const Metrics& metrics) const {
  constexpr int kWidth = 30;
  const double frac = total_ > 0 ? std::clamp(static_cast<double>(step) / static_cast<double>(total_), 0.0, 1.0) : 1.0;
  const int filled = static_cast<int>(frac * kWidth);
  const int64_t done = step - std::max<int64_t>(initial_, 0);
  const double per_step = done > 0 ? seconds / static_cast<double>(done) : NAN;
  std::string bar = std::string(static_cast<size_t>(filled), '#') + std::string(static_cast<size_t>(kWidth - filled), '.');
  std::string line = fmt::format("[{}] {}/{} {:3d}% {} ETA {}", bar, step, total_, static_cast<int>(frac * 100),
                                 std::isfinite(per_step) ? fmt::format("{:.2f}s/step", per_step) : "?s/step",
                                 format_duration(per_step * static_cast<double>(total_ - step)));
  for (const char* key : {"critic/score/mean", "response_length/mean"}) {
    if (auto it = metrics.find(key); it != metrics.end()) line += fmt::format(" {}={}", key, format_value(it->second));
  }
  return line;
}

void ProgressBar::update(int64_t step, const Metrics& metrics) {
  if (initial_ < 0) initial_ = step - 1;  // a resumed run's first update is its first new step
  std::string line = render(step, now_() - start_, metrics);
  if (tty_) {
    std::fprintf(out_, "\r\033[K%s", line.c_str());
    open_line_ = true;
  } else {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

void ProgressBar::clear() {
  if (!tty_ || !open_line_) return;
  std::fputs("\r\033[K", out_);
  std::fflush(out_);
  open_line_ = false;
}

void ProgressBar::finish() {
  if (tty_ && open_line_) std::fputc('\n', out_);
  open_line_ = false;
  std::fflush(out_);
}

}  // namespace tessera::driver
