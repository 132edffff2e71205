// Driver-facing subcommands: train, sft, demo, generate (each in its own cmd_*.cpp).
#include <CLI/CLI.hpp>

#include "app/commands.hpp"

namespace tessera::app {

void add_driver_commands(CLI::App& app) {
  add_train_command(app);
  add_sft_command(app);
  add_demo_command(app);
  add_generate_command(app);
}

}  // namespace tessera::app
