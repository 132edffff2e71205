// config_fields.hpp (internal): the small config.json readers shared by config.cpp,
// config_rope.cpp and model_families.cpp. Each reads one field of `j` and returns an error that
// names the file (`source`) and the field; an absent or null optional field leaves `out` as it is.
//
// Thread-safety: re-entrant.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "proto/status.hpp"
#include "workers/models/config.hpp"

namespace tessera::models::internal {

/// invalid_argument "<source>: field '<field>' <what>".
Status field_error(const std::string& source, const std::string& field, const std::string& what);

/// A required integer field.
Result<int64_t> get_int(const nlohmann::json& j, const std::string& source, const char* field);

/// An optional integer field into `out`.
Status read_int(const nlohmann::json& j, const std::string& source, const char* field, int64_t& out);

/// An optional number into `out`.
Status read_double(const nlohmann::json& j, const std::string& source, const char* field, double& out);

/// An optional boolean into `out`.
Status read_bool(const nlohmann::json& j, const std::string& source, const char* field, bool& out);

/// An optional token id into `out` (left unset when absent or null).
Status read_optional_id(const nlohmann::json& j, const std::string& source, const char* field,
                        std::optional<int64_t>& out);

/// eos_token_id, an integer or a list, into c.eos_token_ids and c.eos_is_list.
Status read_eos(const nlohmann::json& j, const std::string& source, ModelConfig& c);

/// Refuses `field` unless it is absent, null or false; `why` says what Tessera lacks.
Status require_false(const nlohmann::json& j, const std::string& source, const char* field, const char* why);

/// Refuses a dropout `field` unless it is absent, null or 0.
Status require_zero(const nlohmann::json& j, const std::string& source, const char* field);

}  // namespace tessera::models::internal
