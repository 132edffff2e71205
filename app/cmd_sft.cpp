// `tessera sft CONFIG [overrides]`: verl's FSDP SFT trainer over the "sft" worker group.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "app/commands.hpp"
#include "app/worker_types.hpp"
#include "driver/config.hpp"
#include "driver/sft_trainer.hpp"

namespace tessera::app {

int run_sft(const std::string& config, const std::vector<std::string>& overrides) {
  auto cfg = driver::load_config(driver::ConfigKind::sft, config, overrides);
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
  auto* cmd = app.add_subcommand("sft", "Supervised fine-tuning (verl's fsdp_sft_trainer) from a YAML config");
  static std::string config;
  static std::vector<std::string> overrides;
  cmd->add_option("config", config, "YAML file merged over examples/config/sft_trainer.yaml")->required();
  cmd->add_option("overrides", overrides, "Hydra-style overrides: a.b.c=value, +a.b=value, ++a.b=value, ~a.b");
  cmd->callback([] { exit_code() = run_sft(config, overrides); });
}

}  // namespace tessera::app
