// YAML text -> JSON with Hydra's scalar typing (driver/config.hpp), and override values.
#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>

#include "driver/config.hpp"
#include "driver/internal/config_defaults.hpp"
#include "driver/internal/config_util.hpp"

namespace tessera::driver {
namespace internal {
namespace {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  }
  return true;
}

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

bool looks_like_int(std::string_view s) {
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
  return all_digits(s);
}

// [sign] (digits '.' [digits] | '.' digits | digits) [e [sign] digits], with a '.' or an exponent.
bool looks_like_float(std::string_view s) {
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
  if (iequals(s, "inf") || iequals(s, "nan")) return true;
  size_t e = s.find_first_of("eE");
  std::string_view mant = s.substr(0, e);
  bool has_exp = e != std::string_view::npos;
  if (has_exp) {
    std::string_view ex = s.substr(e + 1);
    if (!ex.empty() && (ex[0] == '-' || ex[0] == '+')) ex.remove_prefix(1);
    if (!all_digits(ex)) return false;
  }
  size_t dot = mant.find('.');
  if (dot == std::string_view::npos) return has_exp && all_digits(mant);
  std::string_view a = mant.substr(0, dot), b = mant.substr(dot + 1);
  if (a.empty() && b.empty()) return false;
  return (a.empty() || all_digits(a)) && (b.empty() || all_digits(b));
}

nlohmann::json yaml_node_to_json(const YAML::Node& node, const std::string& source);

nlohmann::json yaml_map_to_json(const YAML::Node& node, const std::string& source) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& kv : node) out[kv.first.Scalar()] = yaml_node_to_json(kv.second, source);
  return out;
}

nlohmann::json yaml_node_to_json(const YAML::Node& node, const std::string& source) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
    case YAML::NodeType::Scalar:
      if (node.Tag() == "!") return node.Scalar();  // quoted: always a string
      return type_plain_scalar(node.Scalar());
    case YAML::NodeType::Sequence: {
      nlohmann::json out = nlohmann::json::array();
      for (const auto& item : node) out.push_back(yaml_node_to_json(item, source));
      return out;
    }
    case YAML::NodeType::Map:
      return yaml_map_to_json(node, source);
  }
  return nullptr;
}

// yaml-cpp accepts complex (non-scalar) keys; a config cannot use them.
Status check_keys(const YAML::Node& node, const std::string& source) {
  if (node.IsMap()) {
    for (const auto& kv : node) {
      if (!kv.first.IsScalar()) {
        return make_error(ErrorCode::invalid_argument, "{}:{}: a mapping key must be a plain name", source,
                          kv.first.Mark().line + 1);
      }
      TESSERA_RETURN_IF_ERROR(check_keys(kv.second, source));
    }
  } else if (node.IsSequence()) {
    for (const auto& item : node) TESSERA_RETURN_IF_ERROR(check_keys(item, source));
  }
  return Status();
}

}  // namespace

nlohmann::json type_plain_scalar(std::string_view text) {
  if (text.empty() || text == "~" || iequals(text, "null")) return nullptr;
  if (iequals(text, "true")) return true;
  if (iequals(text, "false")) return false;
  std::string s(text);
  if (looks_like_int(text)) {
    errno = 0;
    long long v = std::strtoll(s.c_str(), nullptr, 10);
    if (errno == 0) return static_cast<int64_t>(v);
    return s;  // out of int64 range: keep the text
  }
  if (looks_like_float(text)) return std::strtod(s.c_str(), nullptr);
  return s;
}

}  // namespace internal

Result<nlohmann::json> yaml_to_json(std::string_view text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return make_error(ErrorCode::invalid_argument, "{}:{}: {}", source, e.mark.line + 1, e.msg);
  }
  TESSERA_RETURN_IF_ERROR(internal::check_keys(root, source));
  if (root.IsNull()) return nlohmann::json::object();
  if (!root.IsMap()) {
    return make_error(ErrorCode::invalid_argument, "{}:{}: the top level must be a mapping of keys", source,
                      root.Mark().line + 1);
  }
  return internal::yaml_node_to_json(root, source);
}

Result<nlohmann::json> read_yaml_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::not_found, "config file '{}' cannot be opened", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return make_error(ErrorCode::io_error, "config file '{}': read error", path.string());
  return yaml_to_json(ss.str(), path.string());
}

namespace {

// Hydra writes a mapping's pairs as key:value; YAML's flow mappings need key: value. Puts the space
// after each key's colon: a key follows '{' or a ',' inside a mapping and ends at its first ':'.
// Quoted text (with its backslash escapes) is copied as it is; an interpolation ${...} that is a
// whole element is single-quoted, so YAML keeps it as the string the config resolves later.
std::string hydra_flow_to_yaml(std::string_view text) {
  std::string out;
  std::vector<char> open;  // the brackets we are inside
  bool at_key = false;
  const auto element_starts = [&] {  // nothing but spaces since the last '[', ',' or key ':'
    const size_t last = out.find_last_not_of(' ');
    return last != std::string::npos && (out[last] == '[' || out[last] == ',' || out[last] == ':');
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '$' && i + 1 < text.size() && text[i + 1] == '{' && !at_key && element_starts()) {
      size_t end = i + 2;
      for (int depth = 1; end < text.size() && depth > 0; ++end) depth += text[end] == '{' ? 1 : text[end] == '}' ? -1 : 0;
      const size_t next = text.find_first_not_of(' ', end);
      if (next == std::string_view::npos || text[next] == ',' || text[next] == '}' || text[next] == ']') {
        out += "'" + std::string(text.substr(i, end - i)) + "'";
        i = end - 1;
        continue;
      }
    }
    if (c == '\'' || c == '"') {  // a quoted string, copied whole
      size_t end = i + 1;
      while (end < text.size() && text[end] != c) end += text[end] == '\\' ? 2 : 1;
      const size_t stop = std::min(end + 1, text.size());
      out.append(text.substr(i, stop - i));
      i = stop - 1;
      at_key = false;
      continue;
    }
    out.push_back(c);
    if (c == '{' || c == '[') open.push_back(c);
    if ((c == '}' || c == ']') && !open.empty()) open.pop_back();
    if (c == '{' || (c == ',' && !open.empty() && open.back() == '{')) {
      at_key = true;
    } else if (at_key && c == ':') {
      if (i + 1 < text.size() && text[i + 1] != ' ') out.push_back(' ');
      at_key = false;
    } else if (at_key && (c == '}' || c == '[' || c == ']' || c == ',')) {
      at_key = false;
    }
  }
  return out;
}

}  // namespace

Result<nlohmann::json> parse_override_value(std::string_view text) {
  if (text.empty()) return nlohmann::json(std::string());
  char c = text.front();
  if (c == '[' || c == '{' || c == '\'' || c == '"') {
    // Flow collections and quoted strings: let YAML parse them, then type the plain scalars.
    YAML::Node node;
    try {
      node = YAML::Load(hydra_flow_to_yaml(text));
    } catch (const YAML::Exception& e) {
      return make_error(ErrorCode::invalid_argument, "value '{}' does not parse: {}", text, e.msg);
    }
    return internal::yaml_node_to_json(node, "override");
  }
  return internal::type_plain_scalar(text);
}

namespace {

void emit(YAML::Emitter& out, const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::object:
      out << YAML::BeginMap;
      for (const auto& [k, child] : v.items()) {
        out << YAML::Key << k << YAML::Value;
        emit(out, child);
      }
      out << YAML::EndMap;
      break;
    case nlohmann::json::value_t::array:
      out << YAML::Flow << YAML::BeginSeq;
      for (const auto& child : v) emit(out, child);
      out << YAML::EndSeq;
      break;
    case nlohmann::json::value_t::string: {
      // Quoted wherever reading it back would type it otherwise ("1e-6", "true", "null", "").
      const auto& s = v.get_ref<const std::string&>();
      const nlohmann::json typed = internal::type_plain_scalar(s);
      if (!typed.is_string() || typed.get_ref<const std::string&>() != s) out << YAML::DoubleQuoted;
      out << s;
      break;
    }
    case nlohmann::json::value_t::null:
      out << YAML::Null;
      break;
    case nlohmann::json::value_t::boolean:
      out << (v.get<bool>() ? "true" : "false");
      break;
    case nlohmann::json::value_t::number_float: {
      const double d = v.get<double>();
      std::string text = std::isnan(d) ? "nan" : std::isinf(d) ? (d > 0 ? "inf" : "-inf") : fmt::format("{}", d);
      // A float that prints like an integer ("1") must read back as a float.
      if (std::isfinite(d) && text.find_first_of(".eE") == std::string::npos) text += ".0";
      out << text;
      break;
    }
    default:
      out << v.dump();
  }
}

}  // namespace

std::string config_to_yaml(const nlohmann::json& cfg) {
  YAML::Emitter out;
  emit(out, cfg);
  return std::string(out.c_str()) + "\n";
}

std::string_view default_config_yaml(ConfigKind kind) {
  return kind == ConfigKind::ppo ? internal::ppo_trainer_yaml() : internal::sft_trainer_yaml();
}

}  // namespace tessera::driver
