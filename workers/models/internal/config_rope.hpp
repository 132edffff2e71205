// config_rope.hpp (internal): RoPE in config.json, read (rope_scaling or rope_parameters, as
// transformers 5 reads them; see config.hpp), checked against the formulas the decoder implements
// (config.hpp, RopeScaling) and written back in the older rope_theta + rope_scaling form.
//
// Thread-safety: re-entrant.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "proto/status.hpp"
#include "workers/models/config.hpp"

namespace tessera::models::internal {

/// Reads rope_theta and the RoPE dict into c.rope_theta and c.rope_scaling; refuses unimplemented
/// types naming the key and the type. REQUIRES: c.max_position_embeddings already read.
Status read_rope(const nlohmann::json& j, const std::string& source, ModelConfig& c);

/// Whether c.rope_scaling has an implemented type and the parameters its formula needs.
Status validate_rope_scaling(const ModelConfig& c, const std::string& source);

/// The rope_scaling value to write: null for "default", else the type and its parameters.
nlohmann::json rope_scaling_json(const ModelConfig& c);

}  // namespace tessera::models::internal
