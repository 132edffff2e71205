// model_families.hpp (internal): the table of model families config.json may name (llama, qwen2,
// qwen3, qwen2_moe, qwen3_moe, mistral, gemma2), one ModelTypeTraits row each, and the family-only
// fields they read, check and write.
//
// Thread-safety: re-entrant; the table is built once, on first use, and never changes.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "proto/status.hpp"
#include "workers/models/config.hpp"

namespace tessera::models::internal {

// One row per model family: HF class names, defaults and the fields it refuses. `specifics` runs
// after the sizes and scalars are read.
struct ModelTypeTraits {
  const char* model_type;
  const char* causal_arch;
  const char* value_arch;
  int64_t default_max_positions;
  int64_t default_head_dim;  ///< 0: hidden_size / num_attention_heads.
  std::function<Status(const nlohmann::json&, const std::string&, ModelConfig&)> specifics;
  bool default_tie = false;                ///< tie_word_embeddings when absent.
  const char* activation_key = "hidden_act";
  const char* activation = "silu";         ///< The one activation implemented (and HF's default).
  std::vector<const char*> own_fields = {};  ///< Further keys `specifics` models (not kept in `extra`).
};

/// The row of `model_type`, or an error naming `source` and the known types.
Result<const ModelTypeTraits*> find_model_type(const std::string& model_type, const std::string& source);

/// Checks the Mistral/Gemma2/MoE fields of `c` (activation, sliding window, layer types, softcaps,
/// expert counts and sizes).
Status validate_family_fields(const ModelConfig& c, const std::string& source);

/// Writes the Mistral/Gemma2/MoE keys of `c` into `j`.
void write_family_fields(const ModelConfig& c, nlohmann::json& j);

}  // namespace tessera::models::internal
