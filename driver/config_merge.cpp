// Merging a user file and Hydra overrides over the defaults, with key and type checks
// (driver/config.hpp).
#include <algorithm>

#include "driver/config.hpp"
#include "driver/internal/config_util.hpp"

namespace tessera::driver {
namespace internal {
namespace {

constexpr const char* kTargetKey = "_target_";  // Hydra instantiation hint: accepted, dropped

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

bool free_form(const nlohmann::json* schema) {
  return schema == nullptr || schema->is_null() || (schema->is_object() && schema->empty());
}

// Does `value` fit a default of `schema`'s type? (Objects are checked key by key elsewhere.)
bool type_fits(const nlohmann::json& value, const nlohmann::json& schema) {
  if (schema.is_null() || value.is_null() || is_interpolation(value)) return true;
  if (schema.is_boolean()) return value.is_boolean();
  if (schema.is_number_integer()) return value.is_number_integer();
  if (schema.is_number()) return value.is_number();
  if (schema.is_string()) return value.is_string();
  if (schema.is_array()) return value.is_array() || value.is_string();  // verl's str-or-list keys
  if (schema.is_object()) return value.is_object();
  return true;
}

}  // namespace

Result<std::vector<std::string>> split_key(std::string_view key) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t dot = key.find('.', start);
    std::string_view part = key.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    if (part.empty()) return make_error(ErrorCode::invalid_argument, "config key '{}' has an empty segment", key);
    parts.emplace_back(part);
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return parts;
}

std::string join_key(const std::vector<std::string>& parts, size_t count) {
  std::string out;
  for (size_t i = 0; i < count && i < parts.size(); ++i) out += (i ? "." : "") + parts[i];
  return out;
}

std::string join_key(const std::vector<std::string>& parts) { return join_key(parts, parts.size()); }

const char* json_type_phrase(const nlohmann::json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a bool";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a float";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "a list";
  return "a mapping";
}

bool is_interpolation(const nlohmann::json& v) {
  return v.is_string() && v.get_ref<const std::string&>().find("${") != std::string::npos;
}

const nlohmann::json* schema_child(const nlohmann::json* schema, const std::string& name, bool& unknown) {
  unknown = false;
  if (free_form(schema)) return nullptr;
  if (!schema->is_object()) return nullptr;
  auto it = schema->find(name);
  if (it == schema->end()) {
    unknown = true;
    return nullptr;
  }
  return &*it;
}

Status unknown_key_error(const std::string& key, const nlohmann::json* schema_parent, const std::string& name,
                         const std::string& source) {
  std::string best;
  size_t best_d = 3;  // suggest only close names
  if (schema_parent != nullptr && schema_parent->is_object()) {
    for (const auto& [k, v] : schema_parent->items()) {
      size_t d = edit_distance(k, name);
      if (d < best_d) best_d = d, best = k;
    }
  }
  std::string hint = best.empty() ? std::string(" (add a new key with +") + key + "=...)"
                                  : " (did you mean '" + best + "'?)";
  return make_error(ErrorCode::invalid_argument, "{}: unknown config key '{}'{}", source, key, hint);
}

Status check_against_schema(const nlohmann::json& value, const nlohmann::json* schema, const std::string& key,
                            const std::string& source) {
  if (free_form(schema)) return Status();
  // data.train_files / val_files: verl takes a path or a list of paths.
  const bool file_list = schema->is_string() && value.is_array() && key.size() > 6 &&
                         key.compare(key.size() - 6, 6, "_files") == 0;
  if (!file_list && !type_fits(value, *schema)) {
    return make_error(ErrorCode::invalid_argument, "{}: config key '{}' must be {} (like its default {}), got {} {}",
                      source, key, json_type_phrase(*schema), schema->dump(), json_type_phrase(value),
                      detail::json_brief(value));
  }
  if (!value.is_object() || !schema->is_object()) return Status();
  for (const auto& [name, child] : value.items()) {
    if (name == kTargetKey) continue;
    bool unknown = false;
    const nlohmann::json* sub = schema_child(schema, name, unknown);
    if (unknown) return unknown_key_error(key + "." + name, schema, name, source);
    TESSERA_RETURN_IF_ERROR(check_against_schema(child, sub, key + "." + name, source));
  }
  return Status();
}

}  // namespace internal

namespace {

using internal::check_against_schema;
using internal::schema_child;

// Merges `user` into `base` (both mappings) under dotted prefix `prefix`.
Status merge_into(nlohmann::json& base, const nlohmann::json& user, const nlohmann::json* schema,
                  const std::string& prefix, const std::string& source) {
  for (const auto& [name, value] : user.items()) {
    if (name == "_target_") continue;
    std::string key = prefix.empty() ? name : prefix + "." + name;
    bool unknown = false;
    const nlohmann::json* sub = schema_child(schema, name, unknown);
    if (unknown) return internal::unknown_key_error(key, schema, name, source);
    if (value.is_object() && base.is_object() && base.contains(name) && base[name].is_object()) {
      if (sub != nullptr && !sub->is_object() && !sub->is_null()) {
        return check_against_schema(value, sub, key, source);  // a mapping where a scalar belongs
      }
      TESSERA_RETURN_IF_ERROR(merge_into(base[name], value, sub, key, source));
      continue;
    }
    TESSERA_RETURN_IF_ERROR(check_against_schema(value, sub, key, source));
    nlohmann::json cleaned = value;
    if (cleaned.is_object()) cleaned.erase("_target_");
    base[name] = std::move(cleaned);
  }
  return Status();
}

// The schema node at `parts` (nullptr once a free-form node is crossed); `unknown` is set when a
// strict mapping lacks a key on the way.
const nlohmann::json* schema_at(const nlohmann::json& schema, const std::vector<std::string>& parts, bool& unknown,
                                size_t& unknown_at, const nlohmann::json*& unknown_parent) {
  const nlohmann::json* node = &schema;
  unknown = false;
  for (size_t i = 0; i < parts.size(); ++i) {
    const nlohmann::json* parent = node;
    node = schema_child(node, parts[i], unknown);
    if (unknown) {
      unknown_at = i;
      unknown_parent = parent;
      return nullptr;
    }
    if (node == nullptr) return nullptr;
  }
  return node;
}

struct Override {
  enum class Op { set, add, force, remove } op = Op::set;
  std::string key;
  std::string value;
};

Result<Override> parse_override(std::string_view text) {
  Override o;
  if (text.rfind("++", 0) == 0) {
    o.op = Override::Op::force, text.remove_prefix(2);
  } else if (text.rfind("+", 0) == 0) {
    o.op = Override::Op::add, text.remove_prefix(1);
  } else if (text.rfind("~", 0) == 0) {
    o.op = Override::Op::remove, text.remove_prefix(1);
  }
  size_t eq = text.find('=');
  if (o.op == Override::Op::remove) {
    o.key = std::string(text.substr(0, eq));  // "~a.b" or "~a.b=value"
  } else {
    if (eq == std::string_view::npos) {
      return make_error(ErrorCode::invalid_argument, "override '{}' is not of the form key=value", text);
    }
    o.key = std::string(text.substr(0, eq));
    o.value = std::string(text.substr(eq + 1));
  }
  if (o.key.empty()) return make_error(ErrorCode::invalid_argument, "override '{}' has no key", text);
  return o;
}

Status set_value(nlohmann::json& cfg, const std::vector<std::string>& parts, nlohmann::json value,
                 const nlohmann::json& schema, const Override& o, const std::string& source) {
  bool unknown = false;
  size_t unknown_at = 0;
  const nlohmann::json* unknown_parent = nullptr;
  const nlohmann::json* sub = schema_at(schema, parts, unknown, unknown_at, unknown_parent);
  if (unknown && o.op == Override::Op::set) {
    return internal::unknown_key_error(o.key, unknown_parent, parts[unknown_at], source);
  }
  nlohmann::json* node = &cfg;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    nlohmann::json& next = (*node)[parts[i]];
    if (next.is_null()) next = nlohmann::json::object();
    if (!next.is_object()) {
      return make_error(ErrorCode::invalid_argument, "{}: config key '{}' is {}, not a mapping", source,
                        internal::join_key(parts, i + 1), internal::json_type_phrase(next));
    }
    node = &next;
  }
  const std::string& leaf = parts.back();
  bool exists = node->contains(leaf);
  if (o.op == Override::Op::set && !exists) return internal::unknown_key_error(o.key, nullptr, leaf, source);
  if (o.op == Override::Op::add && exists) {
    return make_error(ErrorCode::already_exists, "{}: config key '{}' already exists (use {}={} or ++{}={})", source,
                      o.key, o.key, o.value, o.key, o.value);
  }
  TESSERA_RETURN_IF_ERROR(check_against_schema(value, unknown ? nullptr : sub, o.key, source));
  if (exists && value.is_object() && (*node)[leaf].is_object()) {
    return merge_into((*node)[leaf], value, unknown ? nullptr : sub, o.key, source);
  }
  if (value.is_object()) value.erase("_target_");
  (*node)[leaf] = std::move(value);
  return Status();
}

Status remove_value(nlohmann::json& cfg, const std::vector<std::string>& parts, const Override& o,
                    const std::string& source) {
  nlohmann::json* node = &cfg;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (!node->is_object() || !node->contains(parts[i])) {
      return make_error(ErrorCode::not_found, "{}: cannot delete missing config key '{}'", source, o.key);
    }
    node = &(*node)[parts[i]];
  }
  if (!node->is_object() || node->erase(parts.back()) == 0) {
    return make_error(ErrorCode::not_found, "{}: cannot delete missing config key '{}'", source, o.key);
  }
  return Status();
}

}  // namespace

Status merge_config(nlohmann::json& base, const nlohmann::json& user, const nlohmann::json& schema,
                    const std::string& source) {
  if (!user.is_object()) {
    return make_error(ErrorCode::invalid_argument, "{}: the top level must be a mapping of keys", source);
  }
  return merge_into(base, user, &schema, "", source);
}

Status apply_override(nlohmann::json& cfg, std::string_view override_text, const nlohmann::json& schema) {
  std::string source = fmt::format("override '{}'", override_text);
  TESSERA_ASSIGN_OR_RETURN(Override o, parse_override(override_text));
  auto parts = internal::split_key(o.key);
  if (!parts.ok()) return parts.status().with_context(source);
  if (o.op == Override::Op::remove) return remove_value(cfg, *parts, o, source);
  auto value = parse_override_value(o.value);
  if (!value.ok()) return value.status().with_context(source);
  return set_value(cfg, *parts, std::move(value).value(), schema, o, source);
}

const nlohmann::json* config_find(const nlohmann::json& cfg, std::string_view key) {
  const nlohmann::json* node = &cfg;
  size_t start = 0;
  while (true) {
    size_t dot = key.find('.', start);
    std::string part(key.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start));
    if (!node->is_object()) return nullptr;
    auto it = node->find(part);
    if (it == node->end()) return nullptr;
    node = &*it;
    if (dot == std::string_view::npos) return node;
    start = dot + 1;
  }
}

namespace detail {

std::string json_brief(const nlohmann::json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}
const char* type_name_int() { return "an integer"; }
const char* type_name_double() { return "a number"; }
const char* type_name_bool() { return "a bool"; }
const char* type_name_string() { return "a string"; }

}  // namespace detail
}  // namespace tessera::driver
