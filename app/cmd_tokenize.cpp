// Placeholder: the tokenizer subcommands are added by the models workstream.
#include "app/commands.hpp"

namespace tessera::app {

void add_tokenizer_commands(CLI::App& /*app*/) {}

}  // namespace tessera::app
