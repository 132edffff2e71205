// Driver-facing subcommands: demo, train, sft, ... (see issue "Driver").
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "app/commands.hpp"

namespace tessera::app {

void add_driver_commands(CLI::App& app) {
  auto* demo = app.add_subcommand("demo", "Build a tiny model, SFT it, then GRPO-train it (not built yet)");
  static std::vector<std::string> overrides;
  demo->add_option("overrides", overrides, "a.b.c=value config overrides");
  demo->callback([] {
    std::fprintf(stderr,
                 "tessera demo: not built yet. The demo needs the driver, trainer and workers "
                 "(open issues \"Driver\", \"PPO workers\", \"Rollout\"); nothing was run.\n");
    exit_code() = 3;
  });
}

}  // namespace tessera::app
