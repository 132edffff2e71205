// Interpolations in config values: ${a.b}, ${.sibling}, ${oc.select:a.b,default}
// (driver/config.hpp). Everything else is refused naming the key.
#include "driver/config.hpp"
#include "driver/internal/config_util.hpp"

namespace tessera::driver {
namespace {

using Path = std::vector<std::string>;  // object keys from the root to a value's parent

constexpr int kMaxDepth = 32;  // chained references deeper than this are treated as a cycle

struct Resolver {
  nlohmann::json& root;

  Result<nlohmann::json> resolve_string(const std::string& text, const Path& parent, const std::string& key,
                                        int depth);
  Result<nlohmann::json> resolve_expr(const std::string& expr, const Path& parent, const std::string& key,
                                      int depth);
  Result<nlohmann::json> lookup(const std::string& ref, const Path& parent, const std::string& key, int depth,
                                bool missing_ok);
  Status resolve_tree(nlohmann::json& node, const Path& parent, const std::string& key, int depth);
};

// Position of the '}' closing the "${" at `open`, honouring nested braces; npos if none.
size_t closing_brace(const std::string& s, size_t open) {
  int level = 0;
  for (size_t i = open + 1; i < s.size(); ++i) {
    if (s[i] == '{') ++level;
    if (s[i] == '}' && --level == 0) return i;
  }
  return std::string::npos;
}

std::string as_text(const nlohmann::json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

Result<nlohmann::json> Resolver::resolve_string(const std::string& text, const Path& parent, const std::string& key,
                                                int depth) {
  if (depth > kMaxDepth) {
    return make_error(ErrorCode::invalid_argument, "config key '{}': interpolation cycle (more than {} links)", key,
                      kMaxDepth);
  }
  size_t open = text.find("${");
  if (open == std::string::npos) return nlohmann::json(text);
  size_t close = closing_brace(text, open);
  if (close == std::string::npos) {
    return make_error(ErrorCode::invalid_argument, "config key '{}': unterminated interpolation in '{}'", key, text);
  }
  TESSERA_ASSIGN_OR_RETURN(nlohmann::json value,
                           resolve_expr(text.substr(open + 2, close - open - 2), parent, key, depth));
  if (open == 0 && close + 1 == text.size()) return value;  // the whole value: keep its type
  if (value.is_object() || value.is_array()) {
    return make_error(ErrorCode::invalid_argument, "config key '{}': '{}' embeds {} in a string", key, text,
                      internal::json_type_phrase(value));
  }
  TESSERA_ASSIGN_OR_RETURN(nlohmann::json rest, resolve_string(text.substr(close + 1), parent, key, depth));
  return nlohmann::json(text.substr(0, open) + as_text(value) + as_text(rest));
}

Result<nlohmann::json> Resolver::resolve_expr(const std::string& expr, const Path& parent, const std::string& key,
                                              int depth) {
  static const std::string kSelect = "oc.select:";
  if (expr.rfind(kSelect, 0) == 0) {
    std::string args = expr.substr(kSelect.size());
    size_t comma = args.find(',');
    std::string ref = args.substr(0, comma);
    TESSERA_ASSIGN_OR_RETURN(nlohmann::json found, lookup(ref, parent, key, depth, /*missing_ok=*/true));
    if (!found.is_null() || comma == std::string::npos) return found;
    std::string fallback = args.substr(comma + 1);
    while (!fallback.empty() && fallback.front() == ' ') fallback.erase(0, 1);
    auto parsed = parse_override_value(fallback);
    if (!parsed.ok()) return parsed.status().with_context(fmt::format("config key '{}'", key));
    return parsed.value().is_string() ? resolve_string(parsed.value().get<std::string>(), parent, key, depth + 1)
                                      : parsed.value();
  }
  size_t colon = expr.find(':');
  if (colon != std::string::npos) {
    return make_error(ErrorCode::unimplemented,
                      "config key '{}': interpolation '${{{}}}' uses resolver '{}', which Tessera does not support "
                      "(only ${{a.b}}, ${{.sibling}} and ${{oc.select:a.b,default}})",
                      key, expr, expr.substr(0, colon));
  }
  return lookup(expr, parent, key, depth, /*missing_ok=*/false);
}

Result<nlohmann::json> Resolver::lookup(const std::string& ref, const Path& parent, const std::string& key, int depth,
                                        bool missing_ok) {
  Path base;
  std::string rest = ref;
  if (!ref.empty() && ref[0] == '.') {  // relative: one dot = the parent mapping, each more one up
    size_t dots = ref.find_first_not_of('.');
    if (dots == std::string::npos) dots = ref.size();
    if (dots - 1 > parent.size()) {
      return make_error(ErrorCode::invalid_argument, "config key '{}': '${{{}}}' climbs above the root", key, ref);
    }
    base.assign(parent.begin(), parent.end() - static_cast<long>(dots - 1));
    rest = ref.substr(dots);
  }
  auto parts = internal::split_key(rest);
  if (!parts.ok()) return parts.status().with_context(fmt::format("config key '{}'", key));
  Path target = base;
  target.insert(target.end(), parts->begin(), parts->end());
  const nlohmann::json* node = config_find(root, internal::join_key(target));
  if (node == nullptr) {
    if (missing_ok) return nlohmann::json(nullptr);
    return make_error(ErrorCode::not_found, "config key '{}': interpolation '${{{}}}' refers to missing key '{}'", key,
                      ref, internal::join_key(target));
  }
  nlohmann::json value = *node;
  Path target_parent(target.begin(), target.end() - 1);
  TESSERA_RETURN_IF_ERROR(resolve_tree(value, target_parent, internal::join_key(target), depth + 1));
  return value;
}

Status Resolver::resolve_tree(nlohmann::json& node, const Path& parent, const std::string& key, int depth) {
  if (node.is_string()) {
    if (!internal::is_interpolation(node)) return Status();
    TESSERA_ASSIGN_OR_RETURN(nlohmann::json v, resolve_string(node.get<std::string>(), parent, key, depth));
    node = std::move(v);
    return Status();
  }
  if (node.is_array()) {
    for (auto& item : node) TESSERA_RETURN_IF_ERROR(resolve_tree(item, parent, key, depth));
    return Status();
  }
  if (node.is_object()) {
    Path here = parent;
    std::string last = key.substr(key.rfind('.') == std::string::npos ? 0 : key.rfind('.') + 1);
    if (!key.empty()) here.push_back(last);
    for (auto& [name, child] : node.items()) {
      TESSERA_RETURN_IF_ERROR(resolve_tree(child, here, key.empty() ? name : key + "." + name, depth));
    }
  }
  return Status();
}

}  // namespace

Status resolve_interpolations(nlohmann::json& cfg) {
  Resolver r{cfg};
  // Resolve value by value so that later references see earlier results as well as raw text.
  return r.resolve_tree(cfg, {}, "", 0);
}

}  // namespace tessera::driver
