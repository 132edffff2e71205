// `tessera plot RUN_DIR`: charts of RUN_DIR/metrics.jsonl as SVG + PNG in RUN_DIR/plots/.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "app/commands.hpp"
#include "driver/plot.hpp"

namespace tessera::app {

void add_plot_commands(CLI::App& app) {
  auto* plot = app.add_subcommand("plot", "Render reward, KL, entropy, length and timing charts of RUN_DIR/metrics.jsonl "
                                          "into RUN_DIR/plots (SVG and PNG)");
  static std::string run_dir;
  plot->add_option("run_dir", run_dir, "a run directory (trainer.default_local_dir) holding metrics.jsonl")->required();
  plot->callback([] {
    auto report = driver::plot_run(run_dir);
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
