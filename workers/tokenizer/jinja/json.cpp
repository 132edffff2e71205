// json.cpp: JSON in and out: the render context as Values, and json.dumps as transformers' tojson
// filter calls it.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "workers/tokenizer/jinja/internal/text.hpp"
#include "workers/tokenizer/jinja/internal/value.hpp"

namespace tessera::jinja::internal {

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::floating(static_cast<double>(u));
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value::floating(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return Value::make_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      d.items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) d.items.emplace_back(Value::string(it.key()), from_json(it.value()));
      return Value::make_dict(std::move(d));
    }
    default: fail("context holds a JSON value that is not text (binary)");
  }
}

namespace {

void json_string(std::string_view s, bool ensure_ascii, std::string& out) {
  out.push_back('"');
  for (size_t i = 0; i < s.size();) {
    const uint32_t c = decode(s, i);
    char buf[16];
    switch (c) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
      if (c >= 0x10000) {
        const uint32_t v = c - 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
      }
      out += buf;
    } else {
      encode(c, out);
    }
  }
  out.push_back('"');
}

std::string json_float(double f) {
  if (std::isnan(f)) return "NaN";
  if (std::isinf(f)) return f > 0 ? "Infinity" : "-Infinity";
  return py_float_repr(f);
}

}  // namespace

void to_json(const Value& v, const JsonStyle& st, int level, std::string& out) {
  auto newline = [&](int lvl) {
    out.push_back('\n');
    for (int k = 0; k < lvl; ++k) out += st.indent;
  };
  switch (v.kind) {
    case Kind::none: out += "null"; return;
    case Kind::boolean: out += v.b ? "true" : "false"; return;
    case Kind::integer: out += std::to_string(v.i); return;
    case Kind::floating: out += json_float(v.f); return;
    case Kind::string: json_string(v.s, st.ensure_ascii, out); return;
    case Kind::list: {
      if (!v.is_sequence()) break;
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += st.item_sep;
        if (st.indented) newline(level + 1);
        to_json((*v.list)[k], st, level + 1, out);
      }
      if (st.indented) newline(level);
      out.push_back(']');
      return;
    }
    case Kind::dict: {
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<std::pair<std::string, const Value*>> entries;
      for (const auto& kv : v.dict->items) {
        const Value& k = kv.first;
        std::string key;
        switch (k.kind) {
          case Kind::string: key = k.s; break;
          case Kind::integer: key = std::to_string(k.i); break;
          case Kind::floating: key = json_float(k.f); break;
          case Kind::boolean: key = k.b ? "true" : "false"; break;
          case Kind::none: key = "null"; break;
          default: fail("keys must be str, int, float, bool or None, not " + type_name(k));
        }
        entries.emplace_back(std::move(key), &kv.second);
      }
      if (st.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      out.push_back('{');
      for (size_t k = 0; k < entries.size(); ++k) {
        if (k) out += st.item_sep;
        if (st.indented) newline(level + 1);
        json_string(entries[k].first, st.ensure_ascii, out);
        out += st.key_sep;
        to_json(*entries[k].second, st, level + 1, out);
      }
      if (st.indented) newline(level);
      out.push_back('}');
      return;
    }
    default: break;
  }
  fail("Object of type " + type_name(v) + " is not JSON serializable");
}

}  // namespace tessera::jinja::internal
