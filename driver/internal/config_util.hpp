// config_util.hpp: helpers shared by the config translation units (private to driver/).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "proto/status.hpp"

namespace tessera::driver::internal {

/// Hydra's typing of one plain (unquoted) scalar: int, float, bool, null or string.
nlohmann::json type_plain_scalar(std::string_view text);

/// Splits "a.b.c" into {"a","b","c"}; an empty segment is an error naming the key.
Result<std::vector<std::string>> split_key(std::string_view key);

/// Joins path segments with '.'.
std::string join_key(const std::vector<std::string>& parts, size_t count);
std::string join_key(const std::vector<std::string>& parts);

/// "an integer", "a float", "a bool", "a string", "a list", "a mapping", "null".
const char* json_type_phrase(const nlohmann::json& v);

/// True when `v` is a string holding an interpolation ("${").
bool is_interpolation(const nlohmann::json& v);

/// Checks `value` against the schema node for `key` (nullptr: anything goes), recursively for
/// mappings. Unknown keys and wrong types are errors naming the key, prefixed by `source`.
Status check_against_schema(const nlohmann::json& value, const nlohmann::json* schema,
                            const std::string& key, const std::string& source);

/// The schema node for a child key of `schema` (nullptr when `schema` is free-form).
/// Sets `unknown` when the schema is a strict mapping without that key.
const nlohmann::json* schema_child(const nlohmann::json* schema, const std::string& name, bool& unknown);

/// A one-line error for an unknown key, with a close sibling name suggested when there is one.
Status unknown_key_error(const std::string& key, const nlohmann::json* schema_parent,
                         const std::string& name, const std::string& source);

}  // namespace tessera::driver::internal
