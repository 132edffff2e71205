// plot.hpp: `tessera plot RUN_DIR...`: charts of metrics.jsonl as PNG and SVG, drawn by cairo.
//
// plot_runs reads each RUN_DIR/metrics.jsonl (one JSON object per step, from JsonlLogger) and
// writes one PNG and one SVG per chart. Without --metrics the charts are:
//   reward    critic/score/mean, critic/rewards/mean and every val-core/*/{mean,best,maj}@* metric
//   kl        actor/ppo_kl, actor/kl_loss, actor/reward_kl_penalty, critic/kl
//   entropy   actor/entropy
//   lengths   response_length/{mean,max,min}, prompt_length/mean
//   timing    timing_s/* except step, as stacked areas (one run), or timing_s/step (several runs)
// With --metrics, one chart per metric that matches one of the patterns (shell globs: `*`, `?`,
// `[...]`), named after the metric with '/' as '_'. Several runs overlay in every chart, each
// series named "RUN: metric". Smoothing is TensorBoard's: a debiased exponential moving average
// with weight w in [0, 1); the raw series stays behind it, faint.
//
// A chart whose metrics are all absent is skipped with a note; that is not an error. A pattern
// that matches nothing is an error naming it. Files are written through a temporary name and
// renamed, so a reader never sees half a chart.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "proto/status.hpp"

namespace tessera::driver {

/// One line of a chart.
struct Series {
  std::string name;
  std::vector<double> x;
  std::vector<double> y;  ///< Same length as x; non-finite points are gaps.
};

/// A chart: lines, or stacked areas when `stacked`.
struct Chart {
  std::string title;
  std::string x_label = "step";
  std::string y_label;
  std::vector<Series> series;
  bool stacked = false;
  double smoothing = 0.0;  ///< EMA weight in [0, 1); 0 draws the raw series only.
};

enum class ImageFormat { png, svg };

/// The encoded image of `chart` (PNG bytes, or an SVG document) at `width` x `height` pixels.
/// Errors: cairo could not draw or encode (out of memory).
Result<std::string> render_chart(const Chart& chart, ImageFormat format, int width = 800, int height = 450);

/// TensorBoard's smoothing of `y` with weight `w` (gaps stay gaps, the EMA is debiased).
std::vector<double> smooth(const std::vector<double>& y, double w);

/// Reads metrics.jsonl: one object per line (blank lines skipped). Errors: "FILE:LINE: why".
Result<std::vector<nlohmann::json>> read_metrics_jsonl(const std::filesystem::path& path);

/// One run's rows and the label its series carry when runs are overlaid.
struct RunMetrics {
  std::string label;
  std::vector<nlohmann::json> rows;
};

/// What to draw.
struct PlotOptions {
  std::vector<std::string> metrics;  ///< Glob patterns; empty = the standard charts above.
  double smoothing = 0.0;            ///< In [0, 1).
  std::filesystem::path out_dir;     ///< Empty = RUN_DIR/plots for one run; required for several.
};

/// The charts of `runs` keyed by file stem (charts with no data are left out; `notes` gets one
/// line per skipped chart). Errors: a metric pattern that matches nothing, naming it.
Result<std::vector<std::pair<std::string, Chart>>> build_charts(const std::vector<RunMetrics>& runs,
                                                                const PlotOptions& options,
                                                                std::vector<std::string>& notes);

/// What plot_runs did.
struct PlotReport {
  std::vector<std::filesystem::path> written;  ///< Files written.
  std::vector<std::string> notes;              ///< One line per skipped chart.
};

/// Reads each RUN_DIR/metrics.jsonl and writes the charts. Errors (one line each): a missing or
/// malformed log (FILE:LINE), a bad option (naming it), or a file that cannot be written.
Result<PlotReport> plot_runs(const std::vector<std::filesystem::path>& run_dirs, const PlotOptions& options);

/// plot_runs({run_dir}, {}): the standard charts into RUN_DIR/plots.
Result<PlotReport> plot_run(const std::filesystem::path& run_dir);

}  // namespace tessera::driver
