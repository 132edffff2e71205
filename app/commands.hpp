// commands.hpp: the `tessera` binary's subcommands. app/ is the composition root: the one place
// that links every component (driver, workers, runtime). Each command family lives in its own
// cmd_*.cpp file and adds its subcommands to the CLI11 app here; the returned callback slot is
// filled with the exit code by the command that ran.
#pragma once

namespace CLI {
class App;
}

namespace tessera::app {

/// Exit code set by whichever subcommand ran (0 on success).
int& exit_code();

/// `tessera demo` (and later: train, sft, repl, generate, plot, export).
void add_driver_commands(CLI::App& app);

/// `tessera tokenize` (app/cmd_tokenize.cpp).
void add_tokenizer_commands(CLI::App& app);

/// `tessera init-model` (app/cmd_models.cpp).
void add_model_commands(CLI::App& app);

/// `tessera export` (app/cmd_export.cpp): HF directory from a sharded FSDP checkpoint.
void add_export_commands(CLI::App& app);

/// `tessera agent` (app/cmd_agent.cpp): the node agent.
void add_agent_commands(CLI::App& app);

}  // namespace tessera::app
