// `tessera train [CONFIG] [overrides]`: verl's main_ppo over RayPPOTrainer.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "app/commands.hpp"
#include "app/worker_types.hpp"
#include "driver/config.hpp"
#include "driver/ppo_trainer.hpp"

namespace tessera::app {

int run_train(const std::vector<std::string>& args, const std::string& config_path, const std::string& config_name) {
  auto split = driver::split_config_args(args, config_path, config_name);
  auto cfg = split.ok() ? driver::load_config(driver::ConfigKind::ppo, split->file, split->overrides)
                        : Result<nlohmann::json>(split.status());
  if (!cfg.ok()) {
    std::fprintf(stderr, "tessera train: %s\n", cfg.status().to_string().c_str());
    return 2;
  }
  auto trainer = driver::RayPPOTrainer::create(std::move(*cfg), worker_types());
  Status st = trainer.ok() ? (*trainer)->init_workers() : trainer.status();
  if (st.ok()) st = (*trainer)->fit();
  if (!st.ok()) {
    std::fprintf(stderr, "tessera train: %s\n", st.to_string().c_str());
    return 1;
  }
  return 0;
}

void add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "PPO / GRPO training (verl's main_ppo): [CONFIG.yaml] [a.b=value ...]");
  static std::vector<std::string> args;
  static std::string config_path, config_name;
  cmd->add_option("args", args,
                  "an optional YAML file merged over the built-in ppo_trainer.yaml, then Hydra-style overrides: "
                  "a.b.c=value, +a.b=value, ++a.b=value, ~a.b");
  cmd->add_option("--config-path", config_path, "Hydra's config directory (with --config-name)");
  cmd->add_option("--config-name", config_name, "Hydra's config name: CONFIG_PATH/NAME.yaml is the config file");
  cmd->callback([] { exit_code() = run_train(args, config_path, config_name); });
}

}  // namespace tessera::app
