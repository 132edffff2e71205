// Loggers and the progress bar (driver/logger.hpp).
#include "driver/logger.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <system_error>

#include "driver/config.hpp"

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
  for (const auto& [k, v] : metrics) row[k] = std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
  std::string line = row.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    return make_error(ErrorCode::io_error, "jsonl logger: write to {} failed", path_.string());
  }
  return Status();
}

Result<Tracking> Tracking::create(const std::vector<std::string>& backends, const std::filesystem::path& local_dir,
                                  std::FILE* console) {
  Tracking t;
  for (const auto& name : backends) {
    if (name == "console") {
      t.add(std::make_unique<ConsoleLogger>(console));
    } else if (name == "jsonl") {
      TESSERA_ASSIGN_OR_RETURN(auto logger, JsonlLogger::open(local_dir / "metrics.jsonl"));
      t.add(std::move(logger));
    } else {
      return make_error(ErrorCode::invalid_argument, "trainer.logger: unknown logger '{}' (known: console, jsonl)", name);
    }
  }
  return t;
}

Result<Tracking> Tracking::from_config(const nlohmann::json& cfg, std::FILE* console) {
  TESSERA_ASSIGN_OR_RETURN(auto backends, config_get<std::vector<std::string>>(cfg, "trainer.logger"));
  if (console == nullptr) backends.erase(std::remove(backends.begin(), backends.end(), "console"), backends.end());
  TESSERA_ASSIGN_OR_RETURN(std::string dir, config_get<std::string>(cfg, "trainer.default_local_dir"));
  return create(backends, dir, console ? console : stdout);
}

Status Tracking::log(const Metrics& metrics, int64_t step) {
  Status first;
  for (auto& l : loggers_) {
    Status st = l->log(metrics, step);
    if (first.ok() && !st.ok()) first = st;
  }
  return first;
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

void ProgressBar::finish() {
  if (tty_ && open_line_) std::fputc('\n', out_);
  open_line_ = false;
  std::fflush(out_);
}

}  // namespace tessera::driver
