// `tessera config train|sft [CONFIG] [overrides]`: the resolved config as YAML (Hydra's
// `--cfg job`), after the same checks a run makes before any worker starts.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "app/commands.hpp"
#include "driver/config.hpp"

namespace tessera::app {

void add_config_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("config", "Print the resolved config of `tessera train|sft` as YAML and check it");
  static std::string kind;
  static std::vector<std::string> args;
  static std::string config_path, config_name;
  cmd->add_option("kind", kind, "train (ppo_trainer.yaml) or sft (sft_trainer.yaml)")
      ->required()
      ->check(CLI::IsMember({"train", "sft"}));
  cmd->add_option("args", args, "an optional YAML file, then Hydra-style overrides (as for train / sft)");
  cmd->add_option("--config-path", config_path, "Hydra's config directory (with --config-name)");
  cmd->add_option("--config-name", config_name, "Hydra's config name");
  cmd->callback([] {
    const auto which = kind == "train" ? driver::ConfigKind::ppo : driver::ConfigKind::sft;
    auto split = driver::split_config_args(args, config_path, config_name);
    auto cfg = split.ok() ? driver::load_config(which, split->file, split->overrides)
                          : Result<nlohmann::json>(split.status());
    Status st = cfg.ok() ? (which == driver::ConfigKind::ppo ? driver::validate_ppo_config(*cfg)
                                                            : driver::validate_sft_config(*cfg))
                         : cfg.status();
    if (cfg.ok()) std::fputs(driver::config_to_yaml(*cfg).c_str(), stdout);
    if (!st.ok()) {
      std::fprintf(stderr, "tessera config: %s\n", st.to_string().c_str());
      exit_code() = 2;
    }
  });
}

}  // namespace tessera::app
