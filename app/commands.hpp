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

/// `tessera train`, `sft`, `demo`, `generate` (app/cmd_driver.cpp calls the four below).
void add_driver_commands(CLI::App& app);

/// `tessera train [CONFIG] [overrides]` (app/cmd_train.cpp).
void add_train_command(CLI::App& app);

/// `tessera sft [CONFIG] [overrides]` (app/cmd_sft.cpp).
void add_sft_command(CLI::App& app);

/// `tessera demo [overrides]` (app/cmd_demo.cpp).
void add_demo_command(CLI::App& app);

/// `tessera generate --model DIR --prompt TEXT` (app/cmd_generate.cpp).
void add_generate_command(CLI::App& app);

/// `tessera tokenize` (app/cmd_tokenize.cpp).
void add_tokenizer_commands(CLI::App& app);

/// `tessera init-model` (app/cmd_models.cpp).
void add_model_commands(CLI::App& app);

/// `tessera export` (app/cmd_export.cpp): HF directory from a sharded FSDP checkpoint.
void add_export_commands(CLI::App& app);

/// `tessera agent` (app/cmd_agent.cpp): the node agent.
void add_agent_commands(CLI::App& app);

/// `tessera repl [CONFIG]` (app/cmd_repl.cpp): the interactive driver.
void add_repl_command(CLI::App& app);

/// `tessera plot RUN_DIR` (app/cmd_plot.cpp): charts of metrics.jsonl.
void add_plot_commands(CLI::App& app);

/// `tessera config train|sft [CONFIG] [overrides]` (app/cmd_config.cpp): the resolved config.
void add_config_command(CLI::App& app);

}  // namespace tessera::app
