// config_defaults.hpp: the default YAML texts compiled into the driver (private).
#pragma once

#include <string_view>

namespace tessera::driver::internal {

/// examples/config/ppo_trainer.yaml as of the build.
std::string_view ppo_trainer_yaml();
/// examples/config/sft_trainer.yaml as of the build.
std::string_view sft_trainer_yaml();

}  // namespace tessera::driver::internal
