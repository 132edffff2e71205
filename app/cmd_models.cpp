// Placeholder: the model subcommands are added by the models workstream.
#include "app/commands.hpp"

namespace tessera::app {

void add_model_commands(CLI::App& /*app*/) {}

}  // namespace tessera::app
