// The `tessera` command-line entry point. Parses with CLI11 and dispatches to a subcommand.
#include <CLI/CLI.hpp>
#include <spdlog/cfg/env.h>

#include <cstdio>

#include "app/commands.hpp"

namespace tessera::app {

int& exit_code() {
  static int code = 0;
  return code;
}

}  // namespace tessera::app

int main(int argc, char** argv) {
  spdlog::cfg::load_env_levels();  // SPDLOG_LEVEL=debug (or e.g. "warn") for every command
  CLI::App app{"Tessera: verl's FSDP backend as a C++ actor runtime"};
  app.set_version_flag("--version", "tessera 0.1.0");
  app.require_subcommand(1);
  tessera::app::add_driver_commands(app);
  tessera::app::add_tokenizer_commands(app);
  tessera::app::add_model_commands(app);
  tessera::app::add_export_commands(app);
  tessera::app::add_agent_commands(app);
  tessera::app::add_plot_commands(app);
  tessera::app::add_config_command(app);
  tessera::app::add_repl_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return tessera::app::exit_code();
}
