// `tessera plot RUN_DIR...`: charts of metrics.jsonl as PNG + SVG (driver/plot.hpp).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "app/commands.hpp"
#include "driver/plot.hpp"

namespace tessera::app {

void add_plot_commands(CLI::App& app) {
  auto* plot = app.add_subcommand(
      "plot", "Render charts of RUN_DIR/metrics.jsonl as PNG and SVG: reward, KL, entropy, lengths and timing, or "
              "the metrics you name; several runs are overlaid");
  static std::vector<std::string> run_dirs;
  static driver::PlotOptions options;
  static std::string out;
  plot->add_option("run_dirs", run_dirs, "run directories (trainer.default_local_dir) holding metrics.jsonl")
      ->required();
  plot->add_option("--metrics", options.metrics,
                   "comma-separated metric names or globs, one chart each (e.g. 'critic/score/mean,timing_s/*')")
      ->delimiter(',');
  plot->add_option("--smooth", options.smoothing, "TensorBoard-style smoothing weight in [0, 1) (default 0: none)");
  plot->add_option("--out", out, "output directory (default RUN_DIR/plots; required with several runs)");
  plot->callback([] {
    options.out_dir = out;
    std::vector<std::filesystem::path> dirs(run_dirs.begin(), run_dirs.end());
    auto report = driver::plot_runs(dirs, options);
    if (!report.ok()) {
      std::fprintf(stderr, "tessera plot: %s\n", report.status().to_string().c_str());
      exit_code() = 1;
      return;
    }
    for (const auto& note : report->notes) std::fprintf(stderr, "tessera plot: %s\n", note.c_str());
    for (const auto& path : report->written) std::printf("%s\n", path.c_str());
  });
}

}  // namespace tessera::app
