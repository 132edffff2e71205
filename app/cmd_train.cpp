// `tessera train CONFIG [overrides]`: verl's main_ppo over RayPPOTrainer.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "app/commands.hpp"
#include "app/worker_types.hpp"
#include "driver/config.hpp"
#include "driver/ppo_trainer.hpp"

namespace tessera::app {

int run_train(const std::string& config, const std::vector<std::string>& overrides) {
  auto cfg = driver::load_config(driver::ConfigKind::ppo, config, overrides);
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
  auto* cmd = app.add_subcommand("train", "PPO / GRPO training (verl's main_ppo) from a YAML config");
  static std::string config;
  static std::vector<std::string> overrides;
  cmd->add_option("config", config, "YAML file merged over examples/config/ppo_trainer.yaml")->required();
  cmd->add_option("overrides", overrides, "Hydra-style overrides: a.b.c=value, +a.b=value, ++a.b=value, ~a.b");
  cmd->callback([] { exit_code() = run_train(config, overrides); });
}

}  // namespace tessera::app
