// model_paths.hpp: where the model and tokenizer keys of a config point.
//
// verl users write `actor_rollout_ref.model.path=~/models/Qwen2.5-7B-Instruct` or a Hugging Face
// repo id (`Qwen/Qwen2.5-7B-Instruct`, which verl downloads). Tessera does not download; it
// expands `~` and finds a repo id in the local Hugging Face cache (where `huggingface-cli
// download` and transformers put it): HF_HUB_CACHE, else HF_HOME/hub, else
// XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub; the snapshot refs/main names,
// else the only one. A value that is neither is left as written, for the loader to refuse naming
// the path.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "driver/config.hpp"

namespace tessera::driver {

/// `~` or `~/...` with $HOME (unchanged without HOME or for any other value).
std::string expand_user(std::string path);

/// Rewrites the model and tokenizer keys of `cfg` (PPO: actor_rollout_ref.model.path,
/// critic.model.path and tokenizer_path, reward_model.model.path and input_tokenizer,
/// data.tokenizer; SFT: model.partial_pretrain) as above.
void resolve_model_paths(nlohmann::json& cfg, ConfigKind kind);

}  // namespace tessera::driver
