// builtins.cpp: helpers of the built-in functions, methods and filters: Python's argument binding,
// int()/float() of a str, and printf-style `%` formatting.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "workers/tokenizer/jinja/internal/builtins.hpp"
#include "workers/tokenizer/jinja/internal/text.hpp"

namespace tessera::jinja::internal {

// Binds positional and keyword arguments to `names` like a Python signature; parameters without
// a value take `defaults`, which cover the last defaults.size() names.
std::vector<Value> bind(std::string_view fn, const CallArgs& a, std::initializer_list<const char*> names,
                        std::vector<Value> defaults) {
  const std::vector<const char*> n(names);
  std::vector<Value> out(n.size());
  std::vector<bool> set(n.size(), false);
  if (a.pos.size() > n.size()) fail(fmt::format("{}() takes at most {} argument(s) ({} given)", fn, n.size(), a.pos.size()));
  for (size_t k = 0; k < a.pos.size(); ++k) out[k] = a.pos[k], set[k] = true;
  for (const auto& kw : a.kw) {
    size_t k = 0;
    while (k < n.size() && kw.first != n[k]) ++k;
    if (k == n.size()) fail(fmt::format("{}() got an unexpected keyword argument '{}'", fn, kw.first));
    if (set[k]) fail(fmt::format("{}() got multiple values for argument '{}'", fn, kw.first));
    out[k] = kw.second, set[k] = true;
  }
  const size_t first_default = n.size() - defaults.size();
  for (size_t k = 0; k < n.size(); ++k) {
    if (set[k]) continue;
    if (k < first_default) fail(fmt::format("{}() missing required argument '{}'", fn, n[k]));
    out[k] = defaults[k - first_default];
  }
  return out;
}

int64_t int_arg(const Value& v, std::string_view what) {
  if (!v.is_int()) fail(fmt::format("'{}' object cannot be interpreted as an integer ({})", type_name(v), what));
  return v.as_int();
}

std::string str_arg(const Value& v, std::string_view fn) {
  if (v.kind != Kind::string) fail(fmt::format("{}() argument must be str, not {}", fn, type_name(v)));
  return v.s;
}

// Python int(str): optional whitespace and sign, digits with single underscores.
bool parse_py_int(std::string_view s, int base, int64_t& out) {
  std::string t = py_strip(s, nullptr, true, true);
  size_t i = 0;
  bool neg = false;
  if (i < t.size() && (t[i] == '+' || t[i] == '-')) neg = t[i++] == '-';
  std::string digits;
  bool last_us = true;
  for (; i < t.size(); ++i) {
    if (t[i] == '_' && !last_us) {
      last_us = true;
      continue;
    }
    if (!std::isalnum(static_cast<unsigned char>(t[i]))) return false;
    digits.push_back(t[i]);
    last_us = false;
  }
  if (digits.empty() || last_us) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(digits.c_str(), &end, base);
  if (*end != 0 || errno == ERANGE) return false;
  out = neg ? -v : v;
  return true;
}

bool parse_py_float(std::string_view s, double& out) {
  std::string t = py_strip(s, nullptr, true, true);
  if (t.empty()) return false;
  std::string lower = py_lower(t);
  std::string body = lower[0] == '+' || lower[0] == '-' ? lower.substr(1) : lower;
  if (body == "inf" || body == "infinity" || body == "nan") {
    out = body == "nan" ? NAN : (lower[0] == '-' ? -INFINITY : INFINITY);
    return true;
  }
  std::string clean;
  for (size_t k = 0; k < t.size(); ++k) {
    if (t[k] == '_' && k > 0 && k + 1 < t.size() && is_digit(t[k - 1]) && is_digit(t[k + 1])) continue;
    if (!(is_digit(t[k]) || t[k] == '.' || t[k] == 'e' || t[k] == 'E' || t[k] == '+' || t[k] == '-')) return false;
    clean.push_back(t[k]);
  }
  char* end = nullptr;
  out = std::strtod(clean.c_str(), &end);
  return end != nullptr && *end == 0 && end != clean.c_str();
}

// printf-style `fmt % args` for %s %r %d %i %f %e %g %x %o %c %% with flags, width, precision.
std::string percent_format(const std::string& f, const Value& args) {
  ValueList list = args.is_seq(Seq::tuple) ? *args.list : ValueList{args};
  const bool mapping = args.kind == Kind::dict;
  size_t next = 0;
  std::string out;
  auto take_arg = [&]() -> Value {
    if (next >= list.size()) fail("not enough arguments for format string");
    return list[next++];
  };
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '%') {
      out.push_back(f[i]);
      continue;
    }
    if (++i >= f.size()) fail("incomplete format");
    Value arg;
    bool have = false;
    if (f[i] == '(') {
      const size_t close = f.find(')', i);
      if (args.is_undefined()) fail_undefined(args);
      if (close == std::string::npos || !mapping) fail("format requires a mapping");
      const Value* v = args.dict->find(f.substr(i + 1, close - i - 1));
      if (v == nullptr) fail("KeyError: " + py_repr_str(f.substr(i + 1, close - i - 1)));
      arg = *v, have = true;
      i = close + 1;
    }
    std::string spec = "%";
    while (i < f.size() && std::strchr("-+ 0#", f[i])) spec.push_back(f[i++]);
    while (i < f.size() && is_digit(f[i])) spec.push_back(f[i++]);
    if (i < f.size() && f[i] == '.') {
      spec.push_back(f[i++]);
      while (i < f.size() && is_digit(f[i])) spec.push_back(f[i++]);
    }
    if (i >= f.size()) fail("incomplete format");
    const char conv = f[i];
    if (conv == '%') {
      out.push_back('%');
      continue;
    }
    if (!have) arg = mapping ? args : take_arg();
    char buf[512];
    switch (conv) {
      case 's': case 'r': {
        const std::string s = conv == 's' ? to_str(arg) : repr(arg);
        std::snprintf(buf, sizeof buf, (spec + "s").c_str(), s.c_str());
        out += s.size() >= sizeof buf - 1 ? s : std::string(buf);
        break;
      }
      case 'd': case 'i': case 'x': case 'X': case 'o': {
        if (!arg.is_number()) fail(fmt::format("%{} format: a real number is required, not {}", conv, type_name(arg)));
        const long long v = arg.kind == Kind::floating ? static_cast<long long>(arg.f) : arg.as_int();
        std::snprintf(buf, sizeof buf, (spec + "ll" + (conv == 'i' ? 'd' : conv)).c_str(), v);
        out += buf;
        break;
      }
      case 'f': case 'F': case 'e': case 'E': case 'g': case 'G': {
        if (!arg.is_number()) fail(fmt::format("must be real number, not {}", type_name(arg)));
        std::snprintf(buf, sizeof buf, (spec + conv).c_str(), arg.as_double());
        out += buf;
        break;
      }
      case 'c': {
        if (arg.kind == Kind::string) out += arg.s;
        else encode(static_cast<uint32_t>(int_arg(arg, "%c")), out);
        break;
      }
      default: fail(fmt::format("unsupported format character '{}'", conv));
    }
  }
  // CPython skips this check when the right operand is subscriptable (a mapping or a list).
  const bool subscriptable = mapping || args.is_undefined() || args.is_seq(Seq::list) || args.is_seq(Seq::range);
  if (!subscriptable && next < list.size()) fail("not all arguments converted during string formatting");
  return out;
}

}  // namespace tessera::jinja::internal
