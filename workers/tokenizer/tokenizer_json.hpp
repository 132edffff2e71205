// tokenizer_json.hpp: one-line errors for tokenizer files. Private to workers/models.
//
// Every parser in the tokenizer takes a JsonPath naming the file and the field it is reading,
// so a malformed tokenizer.json fails with "…/tokenizer.json: field 'model.merges[12]': …".
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>

#include "proto/status.hpp"

namespace tessera::tokenizer::tokenizer_json {

/// A file plus a dotted path inside it ("model.merges[3]").
struct JsonPath {
  std::string file;
  std::string path;

  /// The path of member `key` of this object.
  JsonPath operator/(std::string_view key) const {
    return {file, path.empty() ? std::string(key) : path + "." + std::string(key)};
  }
  /// The path of element `i` of this array.
  JsonPath at(size_t i) const { return {file, path + "[" + std::to_string(i) + "]"}; }
};

/// corrupt_data: "<file>: field '<path>': <what>".
inline Status field_error(const JsonPath& p, std::string_view what) {
  return make_error(ErrorCode::corrupt_data, "{}: field '{}': {}", p.file, p.path, what);
}

/// unimplemented: "<file>: field '<path>': <what>" for valid files using features Tessera lacks.
inline Status unsupported_error(const JsonPath& p, std::string_view what) {
  return make_error(ErrorCode::unimplemented, "{}: field '{}': {}", p.file, p.path, what);
}

/// The member `key` of object `obj`; an error naming the field when absent or not an object.
inline Result<const nlohmann::json*> member(const nlohmann::json& obj, const JsonPath& p,
                                            std::string_view key) {
  if (!obj.is_object()) return field_error(p, "expected an object");
  auto it = obj.find(std::string(key));
  if (it == obj.end()) return field_error(p / key, "missing");
  return &*it;
}

/// Optional member: nullptr when absent or JSON null.
inline const nlohmann::json* optional_member(const nlohmann::json& obj, std::string_view key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(std::string(key));
  return (it == obj.end() || it->is_null()) ? nullptr : &*it;
}

/// The string member `key`; an error when absent or not a string.
inline Result<std::string> string_member(const nlohmann::json& obj, const JsonPath& p,
                                         std::string_view key) {
  TESSERA_ASSIGN_OR_RETURN(const nlohmann::json* v, member(obj, p, key));
  if (!v->is_string()) return field_error(p / key, "expected a string");
  return v->get<std::string>();
}

/// The boolean member `key`, or `fallback` when absent or null; an error when not a boolean.
inline Result<bool> bool_member(const nlohmann::json& obj, const JsonPath& p, std::string_view key,
                                bool fallback) {
  const nlohmann::json* v = optional_member(obj, key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) return field_error(p / key, "expected true or false");
  return v->get<bool>();
}

/// The optional string member `key` (absent or null -> nullopt); an error when not a string.
inline Result<std::optional<std::string>> optional_string_member(const nlohmann::json& obj,
                                                                 const JsonPath& p,
                                                                 std::string_view key) {
  const nlohmann::json* v = optional_member(obj, key);
  if (v == nullptr) return std::optional<std::string>();
  if (!v->is_string()) return field_error(p / key, "expected a string or null");
  return std::optional<std::string>(v->get<std::string>());
}

/// Reads and parses a JSON file: not_found / io_error / corrupt_data naming the file.
Result<nlohmann::json> read_json_file(const std::string& file);

}  // namespace tessera::tokenizer::tokenizer_json
