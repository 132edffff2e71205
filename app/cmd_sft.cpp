// `tessera sft [CONFIG] [overrides]`: verl's FSDP SFT trainer over the "sft" worker group.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "app/commands.hpp"
#include "app/worker_types.hpp"
#include "driver/config.hpp"
#include "driver/sft_trainer.hpp"

namespace tessera::app {

int run_sft(const std::vector<std::string>& args, const std::string& config_path, const std::string& config_name) {
  auto split = driver::split_config_args(args, config_path, config_name);
  auto cfg = split.ok() ? driver::load_config(driver::ConfigKind::sft, split->file, split->overrides)
                        : Result<nlohmann::json>(split.status());
  if (!cfg.ok()) {
    std::fprintf(stderr, "tessera sft: %s\n", cfg.status().to_string().c_str());
    return 2;
  }
  auto trainer = driver::FSDPSFTTrainer::create(std::move(*cfg), worker_types());
  Status st = trainer.ok() ? (*trainer)->fit() : trainer.status();
  if (!st.ok()) {
    std::fprintf(stderr, "tessera sft: %s\n", st.to_string().c_str());
    return 1;
  }
  if ((*trainer)->last_hf_dir()) std::printf("HF model: %s\n", (*trainer)->last_hf_dir()->c_str());
  return 0;
}

void add_sft_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("sft", "Supervised fine-tuning (verl's fsdp_sft_trainer): [CONFIG.yaml] [a.b=value ...]");
  static std::vector<std::string> args;
  static std::string config_path, config_name;
  cmd->add_option("args", args,
                  "an optional YAML file merged over the built-in sft_trainer.yaml, then Hydra-style overrides: "
                  "a.b.c=value, +a.b=value, ++a.b=value, ~a.b");
  cmd->add_option("--config-path", config_path, "Hydra's config directory (with --config-name)");
  cmd->add_option("--config-name", config_name, "Hydra's config name: CONFIG_PATH/NAME.yaml is the config file");
  cmd->callback([] { exit_code() = run_sft(args, config_path, config_name); });
}

}  // namespace tessera::app
