// Charts from metrics.jsonl and `tessera plot` (driver/plot.hpp). Drawing is plot_render.cpp.
#include "driver/plot.hpp"

#include <fnmatch.h>

#include <cmath>
#include <optional>
#include <set>

#include "driver/internal/jsonl.hpp"
#include "proto/atomic_file.hpp"

namespace tessera::driver {

Result<std::vector<nlohmann::json>> read_metrics_jsonl(const std::filesystem::path& path) {
  std::vector<nlohmann::json> rows;
  TESSERA_RETURN_IF_ERROR(internal::for_each_jsonl(path, [&](const nlohmann::json& row, const std::string& where) {
    if (!row.contains("step") || !row["step"].is_number()) {
      return make_error(ErrorCode::corrupt_data, "{}: no numeric \"step\"", where);
    }
    rows.push_back(row);
    return Status();
  }));
  return rows;
}

namespace {

// The series of metric `key` over the rows that hold it (null -> a gap); nullopt if absent.
std::optional<Series> extract(const std::vector<nlohmann::json>& rows, const std::string& key) {
  Series s{key, {}, {}};
  for (const auto& row : rows) {
    auto it = row.find(key);
    if (it == row.end()) continue;
    s.x.push_back(row["step"].get<double>());
    s.y.push_back(it->is_number() ? it->get<double>() : NAN);
  }
  if (s.x.empty()) return std::nullopt;
  return s;
}

// Every metric key in any run, sorted.
std::set<std::string> all_keys(const std::vector<RunMetrics>& runs) {
  std::set<std::string> keys;
  for (const auto& run : runs) {
    for (const auto& row : run.rows) {
      for (const auto& [k, v] : row.items()) {
        if (k != "step") keys.insert(k);
      }
    }
  }
  return keys;
}

std::vector<std::string> keys_matching(const std::set<std::string>& keys, const std::string& prefix,
                                       const std::vector<std::string>& contains, const std::string& exclude = "") {
  std::vector<std::string> out;
  for (const auto& k : keys) {
    if (k.rfind(prefix, 0) != 0 || (!exclude.empty() && k == exclude)) continue;
    bool ok = contains.empty();
    for (const auto& c : contains) ok = ok || k.find(c) != std::string::npos;
    if (ok) out.push_back(k);
  }
  return out;
}

struct Spec {
  std::string file, title, y_label;
  std::vector<std::string> keys;
  bool stacked = false;
};

std::vector<Spec> standard_specs(const std::set<std::string>& keys, bool overlay) {
  std::vector<std::string> reward = {"critic/score/mean", "critic/rewards/mean"};
  for (const auto& k : keys_matching(keys, "val-core/", {"/mean@", "/best@", "/maj@"})) reward.push_back(k);
  std::vector<Spec> specs = {
      {"reward", "Reward", "reward", reward},
      {"kl", "KL", "KL", {"actor/ppo_kl", "actor/kl_loss", "actor/reward_kl_penalty", "critic/kl"}},
      {"entropy", "Entropy", "entropy", {"actor/entropy"}},
      {"lengths", "Lengths", "tokens",
       {"response_length/mean", "response_length/max", "response_length/min", "prompt_length/mean"}},
  };
  // Stacked areas of several runs would sum across runs: overlays compare the step time instead.
  if (overlay) {
    specs.push_back({"timing", "Step time", "seconds", {"timing_s/step"}});
  } else {
    specs.push_back({"timing", "Step time breakdown", "seconds", keys_matching(keys, "timing_s/", {}, "timing_s/step"),
                     true});
  }
  return specs;
}

std::string file_stem(const std::string& metric) {
  std::string out;
  for (char c : metric) out += (c == '/' || c == '@' || c == ' ') ? '_' : c;
  return out;
}

}  // namespace

Result<std::vector<std::pair<std::string, Chart>>> build_charts(const std::vector<RunMetrics>& runs,
                                                                const PlotOptions& options,
                                                                std::vector<std::string>& notes) {
  if (!(options.smoothing >= 0 && options.smoothing < 1)) {
    return make_error(ErrorCode::invalid_argument, "--smooth must be in [0, 1), not {}", options.smoothing);
  }
  const std::set<std::string> keys = all_keys(runs);
  const bool overlay = runs.size() > 1;
  std::vector<Spec> specs;
  if (options.metrics.empty()) {
    specs = standard_specs(keys, overlay);
  } else {
    for (const auto& pattern : options.metrics) {
      bool matched = false;
      for (const auto& k : keys) {
        if (fnmatch(pattern.c_str(), k.c_str(), 0) != 0) continue;
        matched = true;
        specs.push_back({file_stem(k), k, "", {k}});
      }
      if (!matched) {
        return make_error(ErrorCode::not_found, "--metrics: no metric matches '{}' in metrics.jsonl", pattern);
      }
    }
  }
  std::vector<std::pair<std::string, Chart>> charts;
  std::set<std::string> seen;
  for (const auto& spec : specs) {
    if (!seen.insert(spec.file).second) continue;  // two patterns matched the same metric
    Chart chart{spec.title, "step", spec.y_label, {}, spec.stacked, options.smoothing};
    for (const auto& run : runs) {
      for (const auto& key : spec.keys) {
        auto s = extract(run.rows, key);
        if (!s) continue;
        if (overlay) s->name = run.label + ": " + key;
        chart.series.push_back(std::move(*s));
      }
    }
    if (chart.series.empty()) {
      notes.push_back(fmt::format("{}: skipped (none of its metrics are in the log)", spec.file));
      continue;
    }
    charts.emplace_back(spec.file, std::move(chart));
  }
  return charts;
}

namespace {

// Labels for overlaid runs: the folder names, or the paths as given where names repeat.
std::vector<std::string> run_labels(const std::vector<std::filesystem::path>& dirs) {
  std::vector<std::string> names;
  std::set<std::string> unique;
  for (const auto& d : dirs) {
    auto p = d.lexically_normal();
    std::string name = (p.has_filename() ? p.filename() : p.parent_path().filename()).string();
    names.push_back(name);
    unique.insert(name);
  }
  if (unique.size() == names.size()) return names;
  names.clear();
  for (const auto& d : dirs) names.push_back(d.string());
  return names;
}

}  // namespace

Result<PlotReport> plot_runs(const std::vector<std::filesystem::path>& run_dirs, const PlotOptions& options) {
  if (run_dirs.empty()) return make_error(ErrorCode::invalid_argument, "plot: no run directory given");
  if (run_dirs.size() > 1 && options.out_dir.empty()) {
    return make_error(ErrorCode::invalid_argument, "plot: {} runs to overlay need --out DIR", run_dirs.size());
  }
  const auto labels = run_labels(run_dirs);
  std::vector<RunMetrics> runs;
  PlotReport report;
  for (size_t i = 0; i < run_dirs.size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(auto rows, read_metrics_jsonl(run_dirs[i] / "metrics.jsonl"));
    if (rows.empty()) report.notes.push_back(fmt::format("{}: metrics.jsonl has no rows", run_dirs[i].string()));
    runs.push_back({labels[i], std::move(rows)});
  }
  TESSERA_ASSIGN_OR_RETURN(auto charts, build_charts(runs, options, report.notes));
  if (charts.empty()) return report;
  const std::filesystem::path out = options.out_dir.empty() ? run_dirs[0] / "plots" : options.out_dir;
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) return make_error(ErrorCode::io_error, "cannot create {}: {}", out.string(), ec.message());
  for (const auto& [name, chart] : charts) {
    for (auto [format, ext] : {std::pair{ImageFormat::png, ".png"}, std::pair{ImageFormat::svg, ".svg"}}) {
      const std::filesystem::path path = out / (name + ext);
      TESSERA_ASSIGN_OR_RETURN(std::string bytes, render_chart(chart, format));
      TESSERA_RETURN_IF_ERROR(proto::write_file_atomic(path, bytes));
      report.written.push_back(path);
    }
  }
  return report;
}

Result<PlotReport> plot_run(const std::filesystem::path& run_dir) { return plot_runs({run_dir}, PlotOptions{}); }

}  // namespace tessera::driver
