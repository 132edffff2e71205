// text.cpp: text helpers: UTF-8 as Python str (code points), Python's whitespace and case rules,
// repr() of floats and strings.
#include "workers/tokenizer/jinja/internal/text.hpp"

#include "workers/tokenizer/jinja/utf8.hpp"

#include <utf8proc.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tessera::jinja::internal {
namespace {

std::string map_cps(std::string_view s, uint32_t (*f)(uint32_t)) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) encode(f(decode(s, i)), out);
  return out;
}

}  // namespace

uint32_t decode(std::string_view s, size_t& i) {
  const utf8::Utf8Char c = utf8::decode_utf8(s, i);
  if (c.valid) {
    i += c.len;
    return c.cp;
  }
  return 0xDC00 + static_cast<unsigned char>(s[i++]);  // one byte at a time
}

void encode(uint32_t cp, std::string& out) {
  if (cp >= 0xDC80 && cp <= 0xDCFF) {
    out.push_back(static_cast<char>(cp - 0xDC00));  // the original byte back
  } else {
    utf8::append_utf8(cp, out);
  }
}

U32 to_u32(std::string_view s) {
  U32 out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) out.push_back(decode(s, i));
  return out;
}

std::string to_utf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) encode(c, out);
  return out;
}

size_t cp_length(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size();) decode(s, i), ++n;
  return n;
}

// CPython's str.isspace() (also what `\s` matches in a str regex, which jinja's lexer uses).
bool py_isspace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Python's str.isprintable() per code point (what repr() keeps unescaped).
bool py_isprintable(uint32_t c) {
  if (c == ' ') return true;
  if (c < 0x20 || c == 0x7F) return false;
  if (c < 0x7F) return true;
  if (c >= 0xDC80 && c <= 0xDCFF) return false;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS: case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

bool py_iscased(uint32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}
bool py_isupper_cp(uint32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_LU; }
bool py_islower_cp(uint32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_LL; }
uint32_t to_upper_cp(uint32_t c) { return c < 0x80 ? static_cast<uint32_t>(std::toupper(static_cast<int>(c))) : static_cast<uint32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c))); }
uint32_t to_lower_cp(uint32_t c) { return c < 0x80 ? static_cast<uint32_t>(std::tolower(static_cast<int>(c))) : static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))); }
uint32_t to_title_cp(uint32_t c) { return c < 0x80 ? to_upper_cp(c) : static_cast<uint32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c))); }

std::string py_upper(std::string_view s) { return map_cps(s, to_upper_cp); }
std::string py_lower(std::string_view s) { return map_cps(s, to_lower_cp); }

// str.title(): a cased character after a cased one is lowered, any other is title-cased.
std::string py_title(std::string_view s) {
  std::string out;
  bool prev_cased = false;
  for (size_t i = 0; i < s.size();) {
    const uint32_t c = decode(s, i);
    encode(prev_cased ? to_lower_cp(c) : to_title_cp(c), out);
    prev_cased = py_iscased(c);
  }
  return out;
}

// str.capitalize() (3.8+): the first character title-cased, the rest lowered.
std::string py_capitalize(std::string_view s) {
  std::string out;
  bool first = true;
  for (size_t i = 0; i < s.size();) {
    const uint32_t c = decode(s, i);
    encode(first ? to_title_cp(c) : to_lower_cp(c), out);
    first = false;
  }
  return out;
}

// str.strip/lstrip/rstrip: `chars` null means whitespace.
std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right) {
  const U32 u = to_u32(s);
  const U32 set = chars ? to_u32(*chars) : U32();
  auto strip_it = [&](char32_t c) { return chars ? set.find(c) != U32::npos : py_isspace(c); };
  size_t b = 0, e = u.size();
  if (left) while (b < e && strip_it(u[b])) ++b;
  if (right) while (e > b && strip_it(u[e - 1])) --e;
  return to_utf8(std::u32string_view(u).substr(b, e - b));
}

std::string rstrip_ws(std::string_view s) { return py_strip(s, nullptr, false, true); }

bool all_space(std::string_view s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size();) if (!py_isspace(decode(s, i))) return false;
  return true;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) { return s.size() >= p.size() && s.substr(s.size() - p.size()) == p; }

// repr() of a float (CPython's float_repr: shortest round-trip digits; exponent form when the
// decimal point position is below -3 or above 16).
std::string py_float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
  char buf[40];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*e", prec - 1, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  std::string s(buf);
  std::string sign;
  if (s[0] == '-') sign = "-", s.erase(0, 1);
  const size_t epos = s.find('e');
  const int exp = std::atoi(s.c_str() + epos + 1);
  std::string digits;
  for (size_t i = 0; i < epos; ++i) if (s[i] != '.') digits.push_back(s[i]);
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int decpt = exp + 1;
  std::string out;
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out = "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out = digits + std::string(static_cast<size_t>(decpt) - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(decpt)) + "." + digits.substr(static_cast<size_t>(decpt));
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += e;
  }
  return sign + out;
}

// repr() of a str.
std::string py_repr_str(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size();) {
    const uint32_t c = decode(s, i);
    char buf[16];
    if (c == static_cast<uint32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (py_isprintable(c)) {
      encode(c, out);
    } else {
      if (c < 0x100) std::snprintf(buf, sizeof buf, "\\x%02x", c);
      else if (c < 0x10000) std::snprintf(buf, sizeof buf, "\\u%04x", c);
      else std::snprintf(buf, sizeof buf, "\\U%08x", c);
      out += buf;
    }
  }
  out.push_back(quote);
  return out;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

}  // namespace tessera::jinja::internal
