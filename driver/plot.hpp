// plot.hpp: `tessera plot RUN_DIR`: charts of metrics.jsonl as SVG and PNG.
//
// plot_run reads RUN_DIR/metrics.jsonl (one JSON object per step, from JsonlLogger) and writes
// into RUN_DIR/plots/:
//   reward.{svg,png}   critic/score/mean, critic/rewards/mean and every val-core/*/mean@*,
//                      val-core/*/best@*, val-core/*/maj@* metric
//   kl.{svg,png}       actor/ppo_kl, actor/kl_loss, actor/reward_kl_penalty, critic/kl
//   entropy.{svg,png}  actor/entropy
//   lengths.{svg,png}  response_length/{mean,max,min}, prompt_length/mean
//   timing.{svg,png}   timing_s/* except step, as stacked areas (the step-time breakdown)
// A chart whose metrics are all absent is skipped with a note; that is not an error. The SVG is
// written by hand; the PNG comes from Tessera's own small rasteriser (lines, rectangles, a 5x7
// bitmap font) encoded with libpng. Files are written through a temporary name and renamed.
#pragma once

#include <cstdint>
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
};

/// An RGB image (row-major, 3 bytes per pixel).
struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;
};

/// The SVG document of `chart` at `width` x `height` pixels.
std::string render_svg(const Chart& chart, int width = 800, int height = 450);
/// The raster of `chart`.
Image render_png_image(const Chart& chart, int width = 800, int height = 450);
/// Encodes `image` as an 8-bit RGB PNG at `path` (temp + rename). Errors name the path.
Status write_png(const Image& image, const std::filesystem::path& path);

/// Reads metrics.jsonl: one object per line (blank lines skipped). Errors: "FILE:LINE: why".
Result<std::vector<nlohmann::json>> read_metrics_jsonl(const std::filesystem::path& path);

/// The charts plot_run draws from `rows` (charts with no data are left out; `notes` gets one
/// line per skipped chart).
std::vector<std::pair<std::string, Chart>> build_charts(const std::vector<nlohmann::json>& rows,
                                                        std::vector<std::string>& notes);

/// What plot_run did.
struct PlotReport {
  std::vector<std::filesystem::path> written;  ///< Files written.
  std::vector<std::string> notes;              ///< One line per skipped chart.
};

/// Reads RUN_DIR/metrics.jsonl and writes the charts into RUN_DIR/plots/. Errors: the file is
/// missing or malformed (naming FILE:LINE), or a file cannot be written.
Result<PlotReport> plot_run(const std::filesystem::path& run_dir);

}  // namespace tessera::driver
