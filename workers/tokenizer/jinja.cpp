// jinja.cpp: lexer, parser and tree-walking interpreter for the Jinja subset of jinja.hpp.
//
// One file, against STYLE.md's "small files", because the component was specified as
// jinja.hpp/jinja.cpp; it is laid out in the sections that would each be a file: text helpers,
// values, JSON, lexer, syntax tree and parser, interpreter, operators, methods, filters, tests,
// globals, and the public API. "Exactly like transformers" is the contract, so comments name the
// jinja2 3.1 / CPython behaviour a rule copies wherever it is not the obvious one, and
// tests/workers/tokenizer/jinja_test.cpp checks the whole against the Python original.
//
// Errors inside the interpreter are C++ exceptions of type `internal::Error` (message + line);
// they never leave this file: Template::parse/render turn them into a Status.
#include "workers/tokenizer/jinja.hpp"

#include <nlohmann/json.hpp>
#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>
#include <vector>

#include "workers/tokenizer/unicode.hpp"

namespace tessera::tokenizer::jinja {
namespace internal {

// ---------------------------------------------------------------------------------------------
// Errors

struct Error {
  std::string message;
  int line = 0;  // 0 until the innermost node that knows its line attaches it
};

[[noreturn]] void fail(std::string message) { throw Error{std::move(message), 0}; }

// ---------------------------------------------------------------------------------------------
// Text helpers: UTF-8 as Python str (code points), Python's whitespace and case rules.

// Decodes the code point at s[i] and advances i. A byte that does not start well-formed UTF-8
// decodes as U+DC80+byte (Python's surrogateescape) so that encode() gives the byte back.
uint32_t decode(std::string_view s, size_t& i) {
  const unicode::Utf8Char c = unicode::decode_utf8(s, i);
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
    unicode::append_utf8(cp, out);
  }
}

using U32 = std::u32string;

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

std::string map_cps(std::string_view s, uint32_t (*f)(uint32_t)) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) encode(f(decode(s, i)), out);
  return out;
}
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

// ---------------------------------------------------------------------------------------------
// Values

enum class Kind : uint8_t { undefined, none, boolean, integer, floating, string, list, dict, function, ns, loop };

// The Python type behind a Kind::list value. Only list and tuple are sequences proper; the rest
// are what jinja2's filters and dict methods hand back (generators, a reversed iterator, dict
// views, range objects), which differ from a list in printing, len(), truthiness, indexing, JSON
// and, for generators and iterators, in being consumed by the first walk over them.
enum class Seq : uint8_t { list, tuple, generator, reversed, dict_items, dict_keys, dict_values, range };

struct Value;
using ValueList = std::vector<Value>;
struct Dict;
struct Namespace;
struct Function;
struct LoopState;

// A Python value as a template sees it. Lists and dicts are immutable once built (the sandbox
// forbids mutating methods), so they are shared; a namespace is the one mutable object.
struct Value {
  Kind kind = Kind::undefined;
  Seq seq = Seq::list;  // for Kind::list: which Python type it is
  bool markup = false;  // for Kind::string: a markupsafe.Markup (from |safe or |escape)
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // the string; for undefined, the error its misuse raises
  std::shared_ptr<const ValueList> list;
  std::shared_ptr<const Dict> dict;
  std::shared_ptr<Namespace> ns;
  std::shared_ptr<const Function> fn;
  std::shared_ptr<const LoopState> loop;
  std::shared_ptr<bool> spent;  // generators and iterators: set once walked
  int64_t range_step = 1;       // Seq::range: its step (its start is `i`)

  static Value undefined(std::string message) {
    Value v;
    v.s = std::move(message);
    return v;
  }
  static Value none() {
    Value v;
    v.kind = Kind::none;
    return v;
  }
  static Value boolean(bool x) {
    Value v;
    v.kind = Kind::boolean;
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v;
    v.kind = Kind::integer;
    v.i = x;
    return v;
  }
  static Value floating(double x) {
    Value v;
    v.kind = Kind::floating;
    v.f = x;
    return v;
  }
  static Value string(std::string x) {
    Value v;
    v.kind = Kind::string;
    v.s = std::move(x);
    return v;
  }
  static Value make_list(ValueList items, Seq seq = Seq::list) {
    Value v;
    v.kind = Kind::list;
    v.seq = seq;
    v.list = std::make_shared<const ValueList>(std::move(items));
    if (seq == Seq::generator || seq == Seq::reversed) v.spent = std::make_shared<bool>(false);
    return v;
  }
  // A generator made by jinja2 function `fn` (the name Python prints for it).
  static Value generator(ValueList items, std::string fn) {
    Value v = make_list(std::move(items), Seq::generator);
    v.s = std::move(fn);
    return v;
  }
  static Value make_dict(Dict d);
  static Value function(std::string name, std::function<Value(class Interp&, struct CallArgs&)> call);

  bool is_undefined() const { return kind == Kind::undefined; }
  bool is_seq(Seq s) const { return kind == Kind::list && seq == s; }
  bool is_sequence() const { return kind == Kind::list && (seq == Seq::list || seq == Seq::tuple); }  // list or tuple
  bool one_shot() const { return kind == Kind::list && (seq == Seq::generator || seq == Seq::reversed); }
  bool is_number() const { return kind == Kind::integer || kind == Kind::floating || kind == Kind::boolean; }
  bool is_int() const { return kind == Kind::integer || kind == Kind::boolean; }
  int64_t as_int() const { return kind == Kind::boolean ? (b ? 1 : 0) : i; }
  double as_double() const { return kind == Kind::floating ? f : static_cast<double>(as_int()); }
};

bool py_equal(const Value& a, const Value& b);

struct Dict {
  std::vector<std::pair<Value, Value>> items;

  const Value* find(const Value& key) const {
    for (const auto& kv : items) if (py_equal(kv.first, key)) return &kv.second;
    return nullptr;
  }
  const Value* find(std::string_view key) const {
    for (const auto& kv : items) if (kv.first.kind == Kind::string && kv.first.s == key) return &kv.second;
    return nullptr;
  }
  void set(Value key, Value value) {
    for (auto& kv : items) {
      if (py_equal(kv.first, key)) {
        kv.second = std::move(value);
        return;
      }
    }
    items.emplace_back(std::move(key), std::move(value));
  }
};

struct Namespace {
  Dict attrs;
};

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

class Interp;

struct Function {
  std::string name;
  std::function<Value(Interp&, CallArgs&)> call;
};

struct LoopState {
  int64_t index0 = 0;
  int64_t length = 0;
  std::shared_ptr<const ValueList> items;
};

Value Value::make_dict(Dict d) {
  Value v;
  v.kind = Kind::dict;
  v.dict = std::make_shared<const Dict>(std::move(d));
  return v;
}

Value Value::function(std::string name, std::function<Value(Interp&, CallArgs&)> call) {
  Value v;
  v.kind = Kind::function;
  v.fn = std::make_shared<const Function>(Function{std::move(name), std::move(call)});
  return v;
}

// range(start, stop, step), which prints as Python shows it.
Value make_range(int64_t start, int64_t stop, int64_t step) {
  const int64_t n = step > 0 ? (stop > start ? (stop - start + step - 1) / step : 0)
                             : (start > stop ? (start - stop - step - 1) / -step : 0);
  if (n > 100000) fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  ValueList out;
  for (int64_t k = 0; k < n; ++k) out.push_back(Value::integer(start + k * step));
  Value r = Value::make_list(std::move(out), Seq::range);
  r.i = start;
  r.range_step = step;
  r.s = step == 1 ? fmt::format("range({}, {})", start, stop) : fmt::format("range({}, {}, {})", start, stop, step);
  return r;
}

// type(x).__name__ as Python error messages show it.
std::string type_name(const Value& v) {
  switch (v.kind) {
    case Kind::undefined: return "Undefined";
    case Kind::none: return "NoneType";
    case Kind::boolean: return "bool";
    case Kind::integer: return "int";
    case Kind::floating: return "float";
    case Kind::string: return "str";
    case Kind::list: {
      static const char* const kNames[] = {"list", "tuple", "generator", "list_reverseiterator", "dict_items",
                                           "dict_keys", "dict_values", "range"};
      return kNames[static_cast<int>(v.seq)];
    }
    case Kind::dict: return "dict";
    case Kind::function: return "function";
    case Kind::ns: return "TemplateNamespace";
    case Kind::loop: return "LoopContext";
  }
  return "object";
}

// jinja2.utils.object_type_repr, used in undefined messages.
std::string object_type_repr(const Value& v) {
  if (v.kind == Kind::none) return "None";
  return type_name(v) + " object";
}

[[noreturn]] void fail_undefined(const Value& v) { fail(v.s); }

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::undefined: case Kind::none: return false;
    case Kind::boolean: return v.b;
    case Kind::integer: return v.i != 0;
    case Kind::floating: return v.f != 0;
    case Kind::string: return !v.s.empty();
    case Kind::list: return v.one_shot() || !v.list->empty();
    case Kind::dict: return !v.dict->items.empty();
    default: return true;
  }
}

std::string repr(const Value& v);

// str(x).
std::string to_str(const Value& v) {
  switch (v.kind) {
    case Kind::undefined: return "";
    case Kind::string: return v.s;
    case Kind::none: return "None";
    case Kind::boolean: return v.b ? "True" : "False";
    case Kind::integer: return std::to_string(v.i);
    case Kind::floating: return py_float_repr(v.f);
    case Kind::list: case Kind::dict: return repr(v);
    case Kind::ns: {
      std::string out = "<Namespace {";
      bool first = true;
      for (const auto& kv : v.ns->attrs.items) {
        if (!first) out += ", ";
        first = false;
        out += repr(kv.first) + ": " + repr(kv.second);
      }
      return out + "}>";
    }
    case Kind::function: return "<function " + v.fn->name + ">";
    case Kind::loop: return "<LoopContext " + std::to_string(v.loop->index0 + 1) + "/" + std::to_string(v.loop->length) + ">";
  }
  return "";
}

// repr(x).
std::string repr(const Value& v) {
  switch (v.kind) {
    case Kind::undefined: return "Undefined";
    case Kind::string: return v.markup ? "Markup(" + py_repr_str(v.s) + ")" : py_repr_str(v.s);
    case Kind::list: {
      // Python prints an address here; any fixed one is as good as another.
      if (v.seq == Seq::generator) return "<generator object " + v.s + " at 0x7f0000000000>";
      if (v.seq == Seq::reversed) return "<list_reverseiterator object at 0x7f0000000000>";
      if (v.seq == Seq::range) return v.s;
      const bool tuple = v.seq == Seq::tuple;
      std::string out = v.is_sequence() ? std::string(1, tuple ? '(' : '[') : type_name(v) + "([";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        out += repr((*v.list)[k]);
      }
      if (tuple && v.list->size() == 1) out += ",";
      out += v.is_sequence() ? std::string(1, tuple ? ')' : ']') : "])";
      return out;
    }
    case Kind::dict: {
      std::string out = "{";
      bool first = true;
      for (const auto& kv : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += repr(kv.first) + ": " + repr(kv.second);
      }
      return out + "}";
    }
    default: return to_str(v);
  }
}

bool py_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_int() && b.is_int()) return a.as_int() == b.as_int();
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::undefined: case Kind::none: return true;
    case Kind::string: return a.s == b.s;
    case Kind::list: {
      if (a.seq != b.seq || a.list->size() != b.list->size()) return false;
      if (a.one_shot()) return a.list == b.list;
      for (size_t k = 0; k < a.list->size(); ++k) if (!py_equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    }
    case Kind::dict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& kv : a.dict->items) {
        const Value* other = b.dict->find(kv.first);
        if (other == nullptr || !py_equal(kv.second, *other)) return false;
      }
      return true;
    }
    case Kind::ns: return a.ns == b.ns;
    case Kind::function: return a.fn == b.fn;
    case Kind::loop: return a.loop == b.loop;
    default: return false;
  }
}

// The items `for` walks (Python iter()): list/tuple elements, dict keys, string characters.
ValueList iterate(const Value& v) {
  switch (v.kind) {
    case Kind::undefined: return {};
    case Kind::list:
      if (v.spent) {
        if (*v.spent) return {};
        *v.spent = true;
      }
      return *v.list;
    case Kind::dict: {
      ValueList out;
      out.reserve(v.dict->items.size());
      for (const auto& kv : v.dict->items) out.push_back(kv.first);
      return out;
    }
    case Kind::string: {
      ValueList out;
      for (size_t i = 0; i < v.s.size();) {
        std::string ch;
        encode(decode(v.s, i), ch);
        out.push_back(Value::string(std::move(ch)));
      }
      return out;
    }
    default: fail("'" + type_name(v) + "' object is not iterable");
  }
}

int64_t py_len(const Value& v) {
  switch (v.kind) {
    case Kind::undefined: return 0;
    case Kind::string: return static_cast<int64_t>(cp_length(v.s));
    case Kind::list:
      if (v.one_shot()) break;
      return static_cast<int64_t>(v.list->size());
    case Kind::dict: return static_cast<int64_t>(v.dict->items.size());
    default: break;
  }
  fail("object of type '" + type_name(v) + "' has no len()");
}

// ---------------------------------------------------------------------------------------------
// JSON in and out

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

// json.dumps options (transformers' tojson filter passes all of them through).
struct JsonStyle {
  bool ensure_ascii = false;
  bool indented = false;
  std::string indent;
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};

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

// ---------------------------------------------------------------------------------------------
// Lexer: jinja2.lexer.Lexer.tokeniter with trim_blocks and lstrip_blocks on, newline_sequence
// "\n" and keep_trailing_newline off.

enum class Tok : uint8_t { data, var_begin, var_end, block_begin, block_end, name, string, integer, floating, op, eof };

struct Token {
  Tok type = Tok::eof;
  std::string text;  // data text, name, decoded string literal, or operator
  int line = 1;
  int64_t ival = 0;
  double fval = 0;
};

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || static_cast<unsigned char>(c) >= 0x80; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }
int count_newlines(std::string_view s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

// The value of a string literal: Python's "unicode-escape" decoding, as jinja applies it.
std::string unescape_literal(std::string_view raw) {
  std::string out;
  for (size_t i = 0; i < raw.size();) {
    if (raw[i] != '\\' || i + 1 >= raw.size()) {
      out.push_back(raw[i++]);
      continue;
    }
    const char c = raw[i + 1];
    i += 2;
    auto hex = [&](int n, const char* what) {
      uint32_t v = 0;
      for (int k = 0; k < n; ++k, ++i) {
        if (i >= raw.size() || !std::isxdigit(static_cast<unsigned char>(raw[i]))) fail(std::string("truncated ") + what + " escape");
        v = v * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(raw[i])) ? raw[i] - '0' : (std::tolower(raw[i]) - 'a' + 10));
      }
      return v;
    };
    switch (c) {
      case '\n': break;
      case '\\': out.push_back('\\'); break;
      case '\'': out.push_back('\''); break;
      case '"': out.push_back('"'); break;
      case 'a': out.push_back('\a'); break;
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'n': out.push_back('\n'); break;
      case 'r': out.push_back('\r'); break;
      case 't': out.push_back('\t'); break;
      case 'v': out.push_back('\v'); break;
      case 'x': encode(hex(2, "\\xXX"), out); break;
      case 'u': encode(hex(4, "\\uXXXX"), out); break;
      case 'U': {
        const uint32_t v = hex(8, "\\UXXXXXXXX");
        if (v > 0x10FFFF) fail("illegal Unicode character");
        encode(v, out);
        break;
      }
      default:
        if (c >= '0' && c <= '7') {
          uint32_t v = static_cast<uint32_t>(c - '0');
          for (int k = 0; k < 2 && i < raw.size() && raw[i] >= '0' && raw[i] <= '7'; ++k) v = v * 8 + static_cast<uint32_t>(raw[i++] - '0');
          encode(v, out);
        } else if (c == 'N') {
          fail("\\N{...} escapes are not supported");
        } else {
          out.push_back('\\');
          out.push_back(c);
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) : src_(normalize(source)) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      const size_t start = find_tag(pos_);
      if (start == std::string::npos) {
        push(Tok::data, src_.substr(pos_), line_);
        break;
      }
      std::string text = src_.substr(pos_, start - pos_);
      const int text_line = line_;
      line_ += count_newlines(text);
      const char kind = src_[start + 1];
      size_t raw_end = 0;
      char sign = 0;
      const bool raw = kind == '%' && match_raw_begin(start, raw_end, sign);
      if (!raw && start + 2 < src_.size() && (src_[start + 2] == '-' || src_[start + 2] == '+')) sign = src_[start + 2];
      text = strip_before_tag(std::move(text), sign, /*lstrip_allowed=*/kind != '{');
      if (!text.empty()) push(Tok::data, std::move(text), text_line);
      line_starting_ = false;
      if (raw) {
        line_ += count_newlines(std::string_view(src_).substr(start, raw_end - start));
        line_starting_ = src_[raw_end - 1] == '\n';
        pos_ = raw_end;
        lex_raw_body();
        continue;
      }
      pos_ = start + 2 + (sign ? 1 : 0);
      if (kind == '#') lex_comment();
      else lex_tag(kind == '%');
    }
    push(Tok::eof, "", line_);
    return std::move(out_);
  }

 private:
  static std::string normalize(std::string_view in) {
    std::string out;
    out.reserve(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      if (in[i] == '\r') {
        out.push_back('\n');
        if (i + 1 < in.size() && in[i + 1] == '\n') ++i;
      } else {
        out.push_back(in[i]);
      }
    }
    if (!out.empty() && out.back() == '\n') out.pop_back();  // keep_trailing_newline=False
    return out;
  }

  [[noreturn]] void error(std::string message) const { throw Error{std::move(message), line_}; }

  void push(Tok type, std::string text, int line) {
    Token t;
    t.type = type;
    t.text = std::move(text);
    t.line = line;
    out_.push_back(std::move(t));
  }

  bool at(size_t p, std::string_view s) const { return src_.compare(p, s.size(), s) == 0; }

  size_t find_tag(size_t from) const {
    for (size_t p = src_.find('{', from); p != std::string::npos; p = src_.find('{', p + 1)) {
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) return p;
    }
    return std::string::npos;
  }

  size_t skip_space(size_t p) const {
    while (p < src_.size()) {
      size_t q = p;
      if (!py_isspace(decode(src_, q))) break;
      p = q;
    }
    return p;
  }

  // `{%(-|+|)\s*raw\s*(-%}\s*|%})` at `start`.
  bool match_raw_begin(size_t start, size_t& end, char& sign) const {
    size_t p = start + 2;
    char s = 0;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) s = src_[p++];
    p = skip_space(p);
    if (!at(p, "raw")) return false;
    p = skip_space(p + 3);
    if (at(p, "-%}")) {
      end = skip_space(p + 3);
    } else if (at(p, "%}")) {
      end = p + 2;
    } else {
      return false;
    }
    sign = s;
    return true;
  }

  // OptionalLStrip: `-` strips all whitespace before the tag; otherwise lstrip_blocks removes
  // the spaces and tabs between a line start and a block or comment tag.
  std::string strip_before_tag(std::string text, char sign, bool lstrip_allowed) const {
    if (sign == '-') return rstrip_ws(text);
    if (sign == '+' || !lstrip_allowed) return text;
    const size_t nl = text.rfind('\n');
    const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if ((l_pos > 0 || line_starting_) && all_space(std::string_view(text).substr(l_pos))) text.resize(l_pos);
    return text;
  }

  // Consumes a block/comment end: `+%}` keeps what follows, `-%}` eats whitespace, plain `%}`
  // eats one newline (trim_blocks). Returns false when `close` is not at pos_.
  bool end_tag(std::string_view close, bool trim_newline) {
    size_t p;
    if (at(pos_, std::string("+") + std::string(close)) && close != "}}") {
      p = pos_ + 1 + close.size();
    } else if (at(pos_, std::string("-") + std::string(close))) {
      p = skip_space(pos_ + 1 + close.size());
    } else if (at(pos_, close)) {
      p = pos_ + close.size();
      if (trim_newline && p < src_.size() && src_[p] == '\n') ++p;
    } else {
      return false;
    }
    line_ += count_newlines(std::string_view(src_).substr(pos_, p - pos_));
    line_starting_ = src_[p - 1] == '\n';
    pos_ = p;
    return true;
  }

  void lex_comment() {
    for (size_t p = pos_; p < src_.size(); ++p) {
      if (src_[p] != '+' && src_[p] != '-' && src_[p] != '#') continue;
      const size_t save = pos_;
      pos_ = p;
      if ((src_[p] != '#' || at(p, "#}")) && end_tag("#}", /*trim_newline=*/true)) {
        line_ += count_newlines(std::string_view(src_).substr(save, p - save));
        return;
      }
      pos_ = save;
    }
    error("Missing end of comment tag");
  }

  void lex_raw_body() {
    for (size_t p = src_.find("{%", pos_); p != std::string::npos; p = src_.find("{%", p + 1)) {
      size_t q = p + 2;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      q = skip_space(q);
      if (!at(q, "endraw")) continue;
      q = skip_space(q + 6);
      const size_t save = pos_;
      pos_ = q;
      if (!end_tag("%}", /*trim_newline=*/true)) {
        pos_ = save;
        continue;
      }
      const size_t after = pos_;
      const bool after_starting = line_starting_;
      line_starting_ = src_[save - 1] == '\n';
      std::string text = strip_before_tag(src_.substr(save, p - save), sign, true);
      if (!text.empty()) push(Tok::data, std::move(text), line_);
      line_ += count_newlines(std::string_view(src_).substr(save, q - save));
      line_starting_ = after_starting;
      pos_ = after;
      return;
    }
    error("Missing end of raw directive");
  }

  void lex_tag(bool block) {
    push(block ? Tok::block_begin : Tok::var_begin, "", line_);
    std::vector<char> balance;
    while (pos_ < src_.size()) {
      if (balance.empty()) {
        const int line = line_;
        if (block ? end_tag("%}", /*trim_newline=*/true) : end_tag("}}", /*trim_newline=*/false)) {
          push(block ? Tok::block_end : Tok::var_end, "", line);
          return;
        }
      }
      size_t q = pos_;
      if (py_isspace(decode(src_, q))) {
        const size_t e = skip_space(pos_);
        line_ += count_newlines(std::string_view(src_).substr(pos_, e - pos_));
        pos_ = e;
        continue;
      }
      if (lex_number() || lex_name() || lex_string() || lex_operator(balance)) continue;
      error(fmt::format("unexpected char {} at {}", py_repr_str(std::string(1, src_[pos_])), pos_));
    }
  }

  size_t digits_from(size_t p) const {  // (\d+_)*\d+ ; p must be at a digit
    while (p < src_.size() && is_digit(src_[p])) ++p;
    while (p + 1 < src_.size() && src_[p] == '_' && is_digit(src_[p + 1])) {
      ++p;
      while (p < src_.size() && is_digit(src_[p])) ++p;
    }
    return p;
  }

  static std::string without_underscores(std::string_view s) {
    std::string out;
    for (char c : s) if (c != '_') out.push_back(c);
    return out;
  }

  bool lex_number() {
    const size_t n = src_.size();
    if (!is_digit(src_[pos_])) return false;
    // float_re (tried before integer_re); (?<!\.) keeps `x.0.1`-style access out of it.
    if (pos_ == 0 || src_[pos_ - 1] != '.') {
      const size_t int_end = digits_from(pos_);
      size_t p = int_end;
      bool frac = false;
      if (p + 1 < n && src_[p] == '.' && is_digit(src_[p + 1])) p = digits_from(p + 1), frac = true;
      size_t end = frac ? p : 0;
      if (p < n && (src_[p] == 'e' || src_[p] == 'E')) {
        size_t r = p + 1;
        if (r < n && (src_[r] == '+' || src_[r] == '-')) ++r;
        if (r < n && is_digit(src_[r])) end = digits_from(r);
      }
      if (end != 0) {
        Token t;
        t.type = Tok::floating;
        t.text = src_.substr(pos_, end - pos_);
        t.fval = std::strtod(without_underscores(t.text).c_str(), nullptr);
        t.line = line_;
        out_.push_back(std::move(t));
        pos_ = end;
        return true;
      }
    }
    // integer_re: 0b/0o/0x with optional single underscores, [1-9](_?\d)*, 0(_?0)*.
    size_t p = pos_;
    int base = 10;
    auto run = [&](size_t from, auto ok) {
      size_t q = from;
      while (true) {
        if (q < n && ok(src_[q])) ++q;
        else if (q + 1 < n && src_[q] == '_' && ok(src_[q + 1])) q += 2;
        else break;
      }
      return q;
    };
    const char c1 = pos_ + 1 < n ? static_cast<char>(std::tolower(src_[pos_ + 1])) : 0;
    size_t digits_begin = pos_;
    if (src_[pos_] == '0' && (c1 == 'b' || c1 == 'o' || c1 == 'x')) {
      base = c1 == 'b' ? 2 : c1 == 'o' ? 8 : 16;
      auto ok = [base](char c) {
        if (base == 2) return c == '0' || c == '1';
        if (base == 8) return c >= '0' && c <= '7';
        return std::isxdigit(static_cast<unsigned char>(c)) != 0;
      };
      const size_t q = run(pos_ + 2, ok);
      if (q > pos_ + 2) p = q, digits_begin = pos_ + 2;
    }
    if (p == pos_) {
      if (src_[pos_] == '0') p = run(pos_ + 1, [](char c) { return c == '0'; });
      else p = run(pos_ + 1, [](char c) { return is_digit(c); });
    }
    Token t;
    t.type = Tok::integer;
    t.text = src_.substr(pos_, p - pos_);
    const std::string digits = without_underscores(std::string_view(src_).substr(digits_begin, p - digits_begin));
    errno = 0;
    t.ival = static_cast<int64_t>(std::strtoull(digits.c_str(), nullptr, base));
    if (errno == ERANGE || std::strtoull(digits.c_str(), nullptr, base) > static_cast<unsigned long long>(INT64_MAX)) {
      error("integer literal " + t.text + " does not fit in 64 bits");
    }
    t.line = line_;
    out_.push_back(std::move(t));
    pos_ = p;
    return true;
  }

  bool lex_name() {
    if (!is_name_start(src_[pos_])) return false;
    size_t p = pos_;
    while (p < src_.size() && is_name_char(src_[p])) ++p;
    push(Tok::name, src_.substr(pos_, p - pos_), line_);
    pos_ = p;
    return true;
  }

  bool lex_string() {
    const char q = src_[pos_];
    if (q != '\'' && q != '"') return false;
    size_t p = pos_ + 1;
    while (p < src_.size() && src_[p] != q) p += src_[p] == '\\' ? 2 : 1;
    if (p >= src_.size()) return false;
    Token t;
    t.type = Tok::string;
    t.line = line_;
    try {
      t.text = unescape_literal(std::string_view(src_).substr(pos_ + 1, p - pos_ - 1));
    } catch (Error& e) {
      error(e.message);
    }
    out_.push_back(std::move(t));
    line_ += count_newlines(std::string_view(src_).substr(pos_, p + 1 - pos_));
    pos_ = p + 1;
    return true;
  }

  bool lex_operator(std::vector<char>& balance) {
    static const char* kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : kTwo) {
      if (at(pos_, op)) {
        push(Tok::op, op, line_);
        pos_ += 2;
        return true;
      }
    }
    const char c = src_[pos_];
    if (std::strchr("+-/*%~[](){}><=.:|,;", c) == nullptr || c == 0) return false;
    if (c == '{' || c == '(' || c == '[') balance.push_back(c == '{' ? '}' : c == '(' ? ')' : ']');
    if (c == '}' || c == ')' || c == ']') {
      if (balance.empty()) error(fmt::format("unexpected '{}'", c));
      const char expected = balance.back();
      balance.pop_back();
      if (expected != c) error(fmt::format("unexpected '{}', expected '{}'", c, expected));
    }
    push(Tok::op, std::string(1, c), line_);
    ++pos_;
    return true;
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> out_;
};

// ---------------------------------------------------------------------------------------------
// Syntax tree

enum class EK : uint8_t {
  literal, name, getattr, getitem, slice, call, filter, test, neg, pos, binop, concat, compare, and_, or_, not_,
  cond, list, tuple, dict
};

struct Expr;
using ExprP = std::unique_ptr<Expr>;

struct Expr {
  EK k = EK::literal;
  int line = 1;
  Value value;       // literal
  std::string name;  // variable, attribute, filter or test name, binary operator
  ExprP a, b, c;     // operands; slice: start/stop/step; cond: a if b else c
  std::vector<ExprP> items;  // call/filter/test args, list/tuple items, dict key,value,..., concat parts, compare operands
  std::vector<std::string> ops;  // compare operators, one per items[k]
  std::vector<std::pair<std::string, ExprP>> kwargs;
  ExprP dyn_args, dyn_kwargs;
  bool known = true;  // filter/test exists (an unknown one only fails when reached, in soft frames)
};

enum class SK : uint8_t {
  text, output, if_, for_, set, set_attr, set_block, macro, call_block, filter_block, with, break_, continue_, scope
};

struct Stmt;
using StmtP = std::unique_ptr<Stmt>;
using Body = std::vector<StmtP>;

struct Target {
  std::vector<std::string> names;
  bool tuple = false;
};

struct Stmt {
  SK k = SK::text;
  int line = 1;
  std::string text;  // text; set_attr: the namespace variable; macro: its name
  std::string attr;  // set_attr: the attribute
  ExprP expr;        // output/set value, for iterable, call of a call block, filter chain of a filter block
  ExprP cond;        // for ... if cond
  Target target;
  std::vector<std::pair<ExprP, Body>> branches;  // if/elif/else (else: null condition)
  Body body, else_body;
  std::vector<std::pair<std::string, ExprP>> params;  // macro/caller parameters with defaults; with assignments
  bool uses_caller = false, uses_varargs = false, uses_kwargs = false;
};

// The name a filter block or filtered set block binds its rendered body to.
constexpr const char* kBlockValue = "\x01block";

bool is_known_filter(std::string_view name);
bool is_known_test(std::string_view name);

// ---------------------------------------------------------------------------------------------
// Parser: jinja2.parser.Parser, same grammar and precedence.

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  Body parse_template() {
    Body body = subparse({});
    if (cur().type != Tok::eof) error(fmt::format("unexpected {}", describe(cur())), cur().line);
    return body;
  }

 private:
  const Token& cur() const { return toks_[p_]; }
  const Token& look() const { return toks_[std::min(p_ + 1, toks_.size() - 1)]; }
  Token take() {
    Token t = toks_[p_];
    if (p_ + 1 < toks_.size()) ++p_;
    return t;
  }
  bool at_op(std::string_view op) const { return cur().type == Tok::op && cur().text == op; }
  bool at_name(std::string_view n) const { return cur().type == Tok::name && cur().text == n; }
  bool skip_op(std::string_view op) {
    if (!at_op(op)) return false;
    take();
    return true;
  }
  bool skip_name(std::string_view n) {
    if (!at_name(n)) return false;
    take();
    return true;
  }

  [[noreturn]] static void error(std::string message, int line) { throw Error{std::move(message), line}; }

  static std::string describe_type(Tok t) {
    switch (t) {
      case Tok::data: return "template data / text";
      case Tok::var_begin: return "begin of print statement";
      case Tok::var_end: return "end of print statement";
      case Tok::block_begin: return "begin of statement block";
      case Tok::block_end: return "end of statement block";
      case Tok::name: return "name";
      case Tok::string: return "string";
      case Tok::integer: return "integer";
      case Tok::floating: return "float";
      case Tok::op: return "operator";
      case Tok::eof: return "end of template";
    }
    return "token";
  }
  static std::string describe(const Token& t) {
    if (t.type == Tok::name || t.type == Tok::op) return "'" + t.text + "'";
    return "'" + describe_type(t.type) + "'";
  }

  void expect(Tok type) {
    if (cur().type != type) {
      if (cur().type == Tok::eof) error(fmt::format("unexpected end of template, expected '{}'.", describe_type(type)), cur().line);
      error(fmt::format("expected token '{}', got {}", describe_type(type), describe(cur())), cur().line);
    }
    take();
  }
  void expect_op(std::string_view op) {
    if (!at_op(op)) {
      if (cur().type == Tok::eof) error(fmt::format("unexpected end of template, expected '{}'.", op), cur().line);
      error(fmt::format("expected token '{}', got {}", op, describe(cur())), cur().line);
    }
    take();
  }
  std::string expect_name() {
    if (cur().type != Tok::name) {
      if (cur().type == Tok::eof) error("unexpected end of template, expected 'name'.", cur().line);
      error(fmt::format("expected token 'name', got {}", describe(cur())), cur().line);
    }
    return take().text;
  }
  void expect_name(std::string_view n) {
    if (!at_name(n)) error(fmt::format("expected token '{}', got {}", n, describe(cur())), cur().line);
    take();
  }

  static ExprP node(EK k, int line) {
    auto e = std::make_unique<Expr>();
    e->k = k;
    e->line = line;
    return e;
  }
  static StmtP stmt(SK k, int line) {
    auto s = std::make_unique<Stmt>();
    s->k = k;
    s->line = line;
    return s;
  }

  // --- statements

  Body subparse(const std::vector<std::string>& end_tags) {
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::data) {
        auto s = stmt(SK::text, t.line);
        s->text = take().text;
        body.push_back(std::move(s));
      } else if (t.type == Tok::var_begin) {
        const int line = take().line;
        auto s = stmt(SK::output, line);
        s->expr = parse_tuple(/*simplified=*/false, /*with_condexpr=*/true, {}, /*explicit_parens=*/false);
        expect(Tok::var_end);
        body.push_back(std::move(s));
      } else if (t.type == Tok::block_begin) {
        take();
        if (cur().type == Tok::name && std::find(end_tags.begin(), end_tags.end(), cur().text) != end_tags.end()) return body;
        body.push_back(parse_statement());
        expect(Tok::block_end);
      } else if (t.type == Tok::eof) {
        return body;
      } else {
        error(fmt::format("unexpected {}", describe(t)), t.line);
      }
    }
  }

  // parse_statements: the block_end after a tag header, then the body up to one of `end_tags`.
  Body statements(const std::vector<std::string>& end_tags, bool drop_needle) {
    skip_op(":");
    expect(Tok::block_end);
    Body body = subparse(end_tags);
    if (cur().type == Tok::eof) {
      std::string wanted;
      for (size_t k = 0; k < end_tags.size(); ++k) wanted += (k ? " or '" : "'") + end_tags[k] + "'";
      error(fmt::format("Unexpected end of template. Jinja was looking for the following tags: {}. The innermost "
                        "block that needs to be closed is '{}'.", wanted, tag_stack_.empty() ? "" : tag_stack_.back()),
            cur().line);
    }
    if (drop_needle) take();
    return body;
  }

  StmtP parse_statement() {
    const Nest nest(nesting_, cur().line);
    const Token& t = cur();
    if (t.type != Tok::name) error("tag name expected", t.line);
    const std::string tag = t.text;
    const int line = t.line;
    tag_stack_.push_back(tag);
    StmtP s;
    if (tag == "if") s = parse_if();
    else if (tag == "for") s = parse_for();
    else if (tag == "set") s = parse_set();
    else if (tag == "macro") s = parse_macro();
    else if (tag == "call") s = parse_call_block();
    else if (tag == "filter") s = parse_filter_block();
    else if (tag == "with") s = parse_with();
    else if (tag == "print") {
      take();
      s = stmt(SK::output, line);
      s->expr = parse_tuple(/*simplified=*/false, /*with_condexpr=*/true, {}, /*explicit_parens=*/false);
    } else if (tag == "break" || tag == "continue") {
      take();
      s = stmt(tag == "break" ? SK::break_ : SK::continue_, line);
    } else if (tag == "generation") {  // transformers' AssistantTracker: renders its body
      take();
      s = stmt(SK::scope, line);
      s->body = statements({"endgeneration"}, true);
    } else if (tag == "block" || tag == "extends" || tag == "include" || tag == "import" || tag == "from" ||
               tag == "autoescape") {
      error(fmt::format("the '{}' tag is not supported (templates are rendered standalone)", tag), line);
    } else {
      error(fmt::format("Encountered unknown tag '{}'.", tag), line);
    }
    tag_stack_.pop_back();
    return s;
  }

  StmtP parse_if() {
    auto s = stmt(SK::if_, take().line);
    while (true) {
      ExprP test = parse_tuple(/*simplified=*/false, /*with_condexpr=*/false, {}, /*explicit_parens=*/false);
      Body body = statements({"elif", "else", "endif"}, false);
      s->branches.emplace_back(std::move(test), std::move(body));
      const Token t = take();
      if (t.text == "elif") continue;
      if (t.text == "else") s->branches.emplace_back(nullptr, statements({"endif"}, true));
      break;
    }
    return s;
  }

  StmtP parse_for() {
    auto s = stmt(SK::for_, take().line);
    s->target = parse_assign_target({"in"});
    expect_name("in");
    s->expr = parse_tuple(/*simplified=*/false, /*with_condexpr=*/false, {"recursive"}, /*explicit_parens=*/false);
    if (skip_name("if")) s->cond = parse_expression(/*with_condexpr=*/true);
    if (at_name("recursive")) error("recursive for loops are not supported", cur().line);
    s->body = statements({"endfor", "else"}, false);
    if (take().text == "else") s->else_body = statements({"endfor"}, true);
    return s;
  }

  Target parse_assign_target(const std::vector<std::string>& extra_end) {
    Target t;
    const bool paren = skip_op("(");
    while (true) {
      if (!t.names.empty()) {
        if (!skip_op(",")) break;
        t.tuple = true;
        if (cur().type != Tok::name || is_end(extra_end)) break;
      }
      if (cur().type != Tok::name) error(fmt::format("expected token 'name', got {}", describe(cur())), cur().line);
      const std::string n = take().text;
      if (n == "true" || n == "false" || n == "none" || n == "True" || n == "False" || n == "None") {
        error("can't assign to 'const'", cur().line);
      }
      t.names.push_back(n);
      if (!at_op(",")) break;
    }
    if (paren) {
      expect_op(")");
      t.tuple = true;
    }
    return t;
  }

  bool is_end(const std::vector<std::string>& extra_end) const {
    if (cur().type == Tok::var_end || cur().type == Tok::block_end || at_op(")")) return true;
    return cur().type == Tok::name && std::find(extra_end.begin(), extra_end.end(), cur().text) != extra_end.end();
  }

  StmtP parse_set() {
    const int line = take().line;
    if (cur().type == Tok::name && look().type == Tok::op && look().text == ".") {
      auto s = stmt(SK::set_attr, line);
      s->text = take().text;
      take();
      s->attr = expect_name();
      expect_op("=");
      s->expr = parse_tuple(/*simplified=*/false, /*with_condexpr=*/true, {}, /*explicit_parens=*/false);
      return s;
    }
    Target target = parse_assign_target({});
    if (skip_op("=")) {
      auto s = stmt(SK::set, line);
      s->target = std::move(target);
      s->expr = parse_tuple(/*simplified=*/false, /*with_condexpr=*/true, {}, /*explicit_parens=*/false);
      return s;
    }
    auto s = stmt(SK::set_block, line);
    if (target.tuple) error("can't assign a block to a tuple", line);
    s->target = std::move(target);
    if (at_op("|")) s->expr = parse_filter(block_value(line), false);
    s->body = statements({"endset"}, true);
    return s;
  }

  static ExprP block_value(int line) {
    auto e = node(EK::name, line);
    e->name = kBlockValue;
    return e;
  }

  void parse_signature(Stmt& s) {
    expect_op("(");
    while (!at_op(")")) {
      if (!s.params.empty()) expect_op(",");
      if (at_op(")")) break;
      std::string n = expect_name();
      ExprP dflt;
      if (skip_op("=")) dflt = parse_expression(/*with_condexpr=*/true);
      else if (!s.params.empty() && s.params.back().second) error("non-default argument follows default argument", cur().line);
      s.params.emplace_back(std::move(n), std::move(dflt));
    }
    expect_op(")");
  }

  StmtP parse_macro() {
    auto s = stmt(SK::macro, take().line);
    s->text = expect_name();
    parse_signature(*s);
    s->body = statements({"endmacro"}, true);
    return s;
  }

  StmtP parse_call_block() {
    auto s = stmt(SK::call_block, take().line);
    if (at_op("(")) parse_signature(*s);
    s->expr = parse_expression(/*with_condexpr=*/true);
    if (s->expr->k != EK::call) error("expected call", s->line);
    s->body = statements({"endcall"}, true);
    return s;
  }

  StmtP parse_filter_block() {
    auto s = stmt(SK::filter_block, take().line);
    s->expr = parse_filter(block_value(s->line), true);
    s->body = statements({"endfilter"}, true);
    return s;
  }

  StmtP parse_with() {
    auto s = stmt(SK::with, take().line);
    while (cur().type != Tok::block_end) {
      if (!s->params.empty()) expect_op(",");
      std::string n = expect_name();
      expect_op("=");
      s->params.emplace_back(std::move(n), parse_expression(/*with_condexpr=*/true));
    }
    s->body = statements({"endwith"}, true);
    return s;
  }

  // --- expressions (highest call first: tuple > condexpr > or > and > not > compare > math1 >
  // concat > math2 > pow > unary > primary/postfix/filter)

  ExprP parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprP parse_tuple(bool simplified, bool with_condexpr, const std::vector<std::string>& extra_end, bool explicit_parens) {
    const int line = cur().line;
    std::vector<ExprP> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) expect_op(",");
      if (is_end(extra_end)) break;
      args.push_back(simplified ? parse_primary() : parse_expression(with_condexpr));
      if (at_op(",")) is_tuple = true;
      else break;
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parens) error(fmt::format("Expected an expression, got {}", describe(cur())), cur().line);
    }
    auto e = node(EK::tuple, line);
    e->items = std::move(args);
    return e;
  }

  ExprP parse_condexpr() {
    const int line = cur().line;
    ExprP expr1 = parse_or();
    while (skip_name("if")) {
      auto e = node(EK::cond, line);
      e->b = parse_or();
      if (skip_name("else")) e->c = parse_condexpr();
      e->a = std::move(expr1);
      expr1 = std::move(e);
    }
    return expr1;
  }

  ExprP parse_or() {
    ExprP left = parse_and();
    while (at_name("or")) {
      auto e = node(EK::or_, take().line);
      e->a = std::move(left);
      e->b = parse_and();
      left = std::move(e);
    }
    return left;
  }

  ExprP parse_and() {
    ExprP left = parse_not();
    while (at_name("and")) {
      auto e = node(EK::and_, take().line);
      e->a = std::move(left);
      e->b = parse_not();
      left = std::move(e);
    }
    return left;
  }

  ExprP parse_not() {
    const Nest nest(nesting_, cur().line);
    if (at_name("not")) {
      auto e = node(EK::not_, take().line);
      e->a = parse_not();
      return e;
    }
    return parse_compare();
  }

  ExprP parse_compare() {
    const int line = cur().line;
    ExprP expr = parse_math1();
    auto e = node(EK::compare, line);
    while (true) {
      std::string op;
      if (cur().type == Tok::op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
                                    cur().text == ">" || cur().text == ">=")) {
        op = take().text;
      } else if (skip_name("in")) {
        op = "in";
      } else if (at_name("not") && look().type == Tok::name && look().text == "in") {
        take();
        take();
        op = "notin";
      } else {
        break;
      }
      e->ops.push_back(op);
      e->items.push_back(parse_math1());
    }
    if (e->ops.empty()) return expr;
    e->a = std::move(expr);
    return e;
  }

  ExprP binop(std::string op, ExprP l, ExprP r, int line) {
    auto e = node(EK::binop, line);
    e->name = std::move(op);
    e->a = std::move(l);
    e->b = std::move(r);
    return e;
  }

  ExprP parse_math1() {
    ExprP left = parse_concat();
    while (at_op("+") || at_op("-")) {
      const Token t = take();
      left = binop(t.text, std::move(left), parse_concat(), t.line);
    }
    return left;
  }

  ExprP parse_concat() {
    const int line = cur().line;
    ExprP first = parse_math2();
    if (!at_op("~")) return first;
    auto e = node(EK::concat, line);
    e->items.push_back(std::move(first));
    while (skip_op("~")) e->items.push_back(parse_math2());
    return e;
  }

  ExprP parse_math2() {
    ExprP left = parse_pow();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      const Token t = take();
      left = binop(t.text, std::move(left), parse_pow(), t.line);
    }
    return left;
  }

  ExprP parse_pow() {
    ExprP left = parse_unary(true);
    while (at_op("**")) {
      const Token t = take();
      left = binop("**", std::move(left), parse_unary(true), t.line);
    }
    return left;
  }

  ExprP parse_unary(bool with_filter) {
    const Nest nest(nesting_, cur().line);
    ExprP e;
    if (at_op("-") || at_op("+")) {
      const Token t = take();
      e = node(t.text == "-" ? EK::neg : EK::pos, t.line);
      e->a = parse_unary(false);
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprP parse_primary() {
    const Token& t = cur();
    ExprP e;
    if (t.type == Tok::name) {
      e = node(EK::literal, t.line);
      if (t.text == "true" || t.text == "True") e->value = Value::boolean(true);
      else if (t.text == "false" || t.text == "False") e->value = Value::boolean(false);
      else if (t.text == "none" || t.text == "None") e->value = Value::none();
      else e->k = EK::name, e->name = t.text;
      take();
    } else if (t.type == Tok::string) {
      e = node(EK::literal, t.line);
      std::string s;
      while (cur().type == Tok::string) s += take().text;  // adjacent literals concatenate
      e->value = Value::string(std::move(s));
    } else if (t.type == Tok::integer) {
      e = node(EK::literal, t.line);
      e->value = Value::integer(take().ival);
    } else if (t.type == Tok::floating) {
      e = node(EK::literal, t.line);
      e->value = Value::floating(take().fval);
    } else if (at_op("(")) {
      take();
      e = parse_tuple(/*simplified=*/false, /*with_condexpr=*/true, {}, /*explicit_parens=*/true);
      expect_op(")");
    } else if (at_op("[")) {
      e = node(EK::list, take().line);
      while (!at_op("]")) {
        if (!e->items.empty()) expect_op(",");
        if (at_op("]")) break;
        e->items.push_back(parse_expression(/*with_condexpr=*/true));
      }
      expect_op("]");
    } else if (at_op("{")) {
      e = node(EK::dict, take().line);
      while (!at_op("}")) {
        if (!e->items.empty()) expect_op(",");
        if (at_op("}")) break;
        e->items.push_back(parse_expression(/*with_condexpr=*/true));
        expect_op(":");
        e->items.push_back(parse_expression(/*with_condexpr=*/true));
      }
      expect_op("}");
    } else {
      error(fmt::format("unexpected {}", describe(t)), t.line);
    }
    return e;
  }

  ExprP parse_postfix(ExprP e) {
    while (true) {
      if (at_op(".") || at_op("[")) e = parse_subscript(std::move(e));
      else if (at_op("(")) e = parse_call(std::move(e));
      else return e;
    }
  }

  ExprP parse_filter_expr(ExprP e) {
    while (true) {
      if (at_op("|")) e = parse_filter(std::move(e), false);
      else if (at_name("is")) e = parse_test(std::move(e));
      else if (at_op("(")) e = parse_call(std::move(e));
      else return e;
    }
  }

  ExprP parse_subscript(ExprP obj) {
    const Token t = take();
    if (t.text == ".") {
      const Token attr = take();
      if (attr.type == Tok::name) {
        auto e = node(EK::getattr, t.line);
        e->a = std::move(obj);
        e->name = attr.text;
        return e;
      }
      if (attr.type != Tok::integer) error("expected name or number", attr.line);
      auto e = node(EK::getitem, t.line);
      e->a = std::move(obj);
      e->b = node(EK::literal, attr.line);
      e->b->value = Value::integer(attr.ival);
      return e;
    }
    std::vector<ExprP> args;
    while (!at_op("]")) {
      if (!args.empty()) expect_op(",");
      args.push_back(parse_subscribed());
    }
    expect_op("]");
    auto e = node(EK::getitem, t.line);
    e->a = std::move(obj);
    if (args.size() == 1) {
      e->b = std::move(args[0]);
    } else {
      e->b = node(EK::tuple, t.line);
      e->b->items = std::move(args);
    }
    return e;
  }

  ExprP parse_subscribed() {
    const int line = cur().line;
    ExprP start;
    if (!at_op(":")) {
      start = parse_expression(/*with_condexpr=*/true);
      if (!at_op(":")) return start;
    }
    take();  // ':'
    auto e = node(EK::slice, line);
    e->a = std::move(start);
    if (!at_op(":") && !at_op("]") && !at_op(",")) e->b = parse_expression(/*with_condexpr=*/true);
    if (skip_op(":")) {
      if (!at_op("]") && !at_op(",")) e->c = parse_expression(/*with_condexpr=*/true);
    }
    return e;
  }

  void parse_call_args(Expr& e) {
    const int line = cur().line;
    expect_op("(");
    bool require_comma = false;
    auto ensure = [&](bool ok) {
      if (!ok) error("invalid syntax for function call expression", line);
    };
    while (!at_op(")")) {
      if (require_comma) {
        expect_op(",");
        if (at_op(")")) break;
      }
      if (skip_op("*")) {
        ensure(!e.dyn_args && !e.dyn_kwargs);
        e.dyn_args = parse_expression(/*with_condexpr=*/true);
      } else if (skip_op("**")) {
        ensure(!e.dyn_kwargs);
        e.dyn_kwargs = parse_expression(/*with_condexpr=*/true);
      } else if (cur().type == Tok::name && look().type == Tok::op && look().text == "=") {
        ensure(!e.dyn_kwargs);
        std::string key = take().text;
        take();
        e.kwargs.emplace_back(std::move(key), parse_expression(/*with_condexpr=*/true));
      } else {
        ensure(!e.dyn_args && !e.dyn_kwargs && e.kwargs.empty());
        e.items.push_back(parse_expression(/*with_condexpr=*/true));
      }
      require_comma = true;
    }
    expect_op(")");
  }

  ExprP parse_call(ExprP callee) {
    auto e = node(EK::call, cur().line);
    e->a = std::move(callee);
    parse_call_args(*e);
    return e;
  }

  std::string dotted_name() {
    std::string n = expect_name();
    while (skip_op(".")) n += "." + expect_name();
    return n;
  }

  ExprP parse_filter(ExprP operand, bool start_inline) {
    while (at_op("|") || start_inline) {
      if (!start_inline) take();
      start_inline = false;
      const int line = cur().line;
      auto e = node(EK::filter, line);
      e->name = dotted_name();
      e->known = is_known_filter(e->name);
      e->a = std::move(operand);
      if (at_op("(")) parse_call_args(*e);
      operand = std::move(e);
    }
    return operand;
  }

  ExprP parse_test(ExprP operand) {
    const int line = take().line;  // 'is'
    const bool negated = skip_name("not");
    auto e = node(EK::test, line);
    e->name = dotted_name();
    e->known = is_known_test(e->name);
    e->a = std::move(operand);
    const Token& t = cur();
    if (at_op("(")) {
      parse_call_args(*e);
    } else if ((t.type == Tok::name || t.type == Tok::string || t.type == Tok::integer || t.type == Tok::floating ||
                at_op("(") || at_op("[") || at_op("{")) &&
               !(t.type == Tok::name && (t.text == "else" || t.text == "or" || t.text == "and"))) {
      if (at_name("is")) error("You cannot chain multiple tests with is", t.line);
      e->items.push_back(parse_postfix(parse_primary()));
    }
    if (!negated) return e;
    auto n = node(EK::not_, line);
    n->a = std::move(e);
    return n;
  }

  // Bounds the recursion of nested expressions and blocks (jinja2 hits Python's recursion limit).
  struct Nest {
    int& depth;
    Nest(int& d, int line) : depth(d) {
      if (++depth > 200) error("template nesting is too deep", line);
    }
    ~Nest() { --depth; }
  };

  std::vector<Token> toks_;
  size_t p_ = 0;
  std::vector<std::string> tag_stack_;
  int nesting_ = 0;
};

// After parsing, what jinja2's code generator checks: unknown filters and tests outside an `if`
// or conditional expression (a "soft frame") fail at compile time, break/continue need a loop,
// and a macro takes `caller`, extra positional (`varargs`) or keyword (`kwargs`) arguments only
// when its body names them.
class Checker {
 public:
  void body(const Body& b, bool soft, bool in_loop) {
    for (const auto& s : b) stmt(*s, soft, in_loop);
  }

 private:
  [[noreturn]] static void error(std::string m, int line) { throw Error{std::move(m), line}; }

  void stmt(Stmt& s, bool soft, bool in_loop) {
    switch (s.k) {
      case SK::text: case SK::break_: case SK::continue_:
        if (s.k != SK::text && !in_loop) error(fmt::format("'{}' outside loop", s.k == SK::break_ ? "break" : "continue"), s.line);
        return;
      case SK::output: case SK::set: case SK::set_attr: expr(*s.expr, soft); return;
      case SK::if_:
        for (auto& br : s.branches) {
          if (br.first) expr(*br.first, true);
          body(br.second, true, in_loop);
        }
        return;
      case SK::for_:
        expr(*s.expr, soft);
        if (s.cond) expr(*s.cond, false);
        body(s.body, false, true);
        body(s.else_body, false, in_loop);
        return;
      case SK::set_block: case SK::filter_block:
        if (s.expr) expr(*s.expr, false);
        body(s.body, false, in_loop);
        return;
      case SK::macro: case SK::call_block: {
        for (auto& p : s.params) if (p.second) expr(*p.second, false);
        if (s.k == SK::call_block) expr(*s.expr, soft);
        body(s.body, false, false);
        std::set<std::string> names;
        collect(s.body, names);
        for (auto& p : s.params) if (p.second) collect(*p.second, names);
        s.uses_caller = names.count("caller") > 0;
        s.uses_varargs = names.count("varargs") > 0;
        s.uses_kwargs = names.count("kwargs") > 0;
        return;
      }
      case SK::with:
        for (auto& p : s.params) expr(*p.second, soft);
        body(s.body, false, in_loop);
        return;
      case SK::scope: body(s.body, false, false); return;
    }
  }

  void expr(Expr& e, bool soft) {
    if ((e.k == EK::filter || e.k == EK::test) && !e.known && !soft) {
      error(fmt::format("No {} named '{}'.", e.k == EK::filter ? "filter" : "test", e.name), e.line);
    }
    const bool inner_soft = soft || e.k == EK::cond;
    for (Expr* c : {e.a.get(), e.b.get(), e.c.get(), e.dyn_args.get(), e.dyn_kwargs.get()}) if (c) expr(*c, inner_soft);
    for (auto& c : e.items) expr(*c, inner_soft);
    for (auto& kw : e.kwargs) expr(*kw.second, inner_soft);
  }

  static void collect(const Expr& e, std::set<std::string>& names) {
    if (e.k == EK::name) names.insert(e.name);
    for (const Expr* c : {e.a.get(), e.b.get(), e.c.get(), e.dyn_args.get(), e.dyn_kwargs.get()}) if (c) collect(*c, names);
    for (const auto& c : e.items) collect(*c, names);
    for (const auto& kw : e.kwargs) collect(*kw.second, names);
  }
  static void collect(const Body& b, std::set<std::string>& names) {
    for (const auto& s : b) {
      for (const Expr* c : {s->expr.get(), s->cond.get()}) if (c) collect(*c, names);
      for (const auto& br : s->branches) {
        if (br.first) collect(*br.first, names);
        collect(br.second, names);
      }
      for (const auto& p : s->params) if (p.second) collect(*p.second, names);
      if (s->k == SK::set_attr) names.insert(s->text);
      collect(s->body, names);
      collect(s->else_body, names);
    }
  }
};

struct Program {
  std::string source_name;
  Body body;
};

// ---------------------------------------------------------------------------------------------
// Interpreter

// Variables of one frame. Like jinja2's generated code: the template's top level writes the
// context, each for-loop iteration and macro call gets a fresh child frame, and `if` adds none.
struct Scope {
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;

  const Value* find(std::string_view name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent.get()) {
      for (const auto& kv : s->vars) if (kv.first == name) return &kv.second;
    }
    return nullptr;
  }
  void set(std::string_view name, Value v) {
    for (auto& kv : vars) {
      if (kv.first == name) {
        kv.second = std::move(v);
        return;
      }
    }
    vars.emplace_back(std::string(name), std::move(v));
  }
};
using ScopeP = std::shared_ptr<Scope>;

ScopeP child(const ScopeP& parent) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  return s;
}

enum class Flow : uint8_t { normal, break_, continue_ };

Value undefined_member(const Value& obj, const Value& key) {
  if (key.kind == Kind::string) return Value::undefined(py_repr_str(object_type_repr(obj)) + " has no attribute " + py_repr_str(key.s));
  return Value::undefined(object_type_repr(obj) + " has no element " + repr(key));
}

Value get_attr(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key);
Value apply_filter(Interp& in, const std::string& name, Value v, CallArgs& args);
bool apply_test(Interp& in, const std::string& name, const Value& v, CallArgs& args);
Value binary_op(std::string_view op, const Value& l, const Value& r);
int64_t sub64(int64_t a, int64_t b);
bool compare_op(std::string_view op, const Value& l, const Value& r);
Value slice_of(const Value& obj, const Value& start, const Value& stop, const Value& step);
void add_globals(Scope& globals);

class Interp {
 public:
  std::string render(const Program& prog, const Value& context) {
    auto globals = std::make_shared<Scope>();
    add_globals(*globals);
    auto top = child(globals);
    for (const auto& kv : context.dict->items) top->set(kv.first.s, kv.second);
    std::string out;
    exec(prog.body, top, out);
    return out;
  }

  Value eval(const Expr& e, const ScopeP& sc) {
    try {
      return eval_node(e, sc);
    } catch (Error& err) {
      if (err.line == 0) err.line = e.line;
      throw;
    }
  }

  Value call(const Value& callee, CallArgs& args) {
    if (callee.kind == Kind::undefined) fail_undefined(callee);
    if (callee.kind != Kind::function) fail("'" + type_name(callee) + "' object is not callable");
    return callee.fn->call(*this, args);
  }

  Flow exec(const Body& body, const ScopeP& sc, std::string& out) {
    for (const auto& st : body) {
      Flow f;
      try {
        f = exec_stmt(*st, sc, out);
      } catch (Error& err) {
        if (err.line == 0) err.line = st->line;
        throw;
      }
      if (f != Flow::normal) return f;
    }
    return Flow::normal;
  }

  // A macro (or a call block's `caller`) bound to the frame it was defined in.
  // The function holds its frame weakly and the interpreter keeps the frame alive until the
  // render ends, so a macro stored in its own frame makes no reference cycle.
  Value macro_value(const Stmt& st, const ScopeP& closure, std::string name) {
    closures_.push_back(closure);
    std::weak_ptr<Scope> frame = closure;
    return Value::function(name, [&st, frame, name](Interp& in, CallArgs& a) {
      const ScopeP closure = frame.lock();
      if (!closure) fail("macro '" + name + "' outlived its frame");
      return in.call_macro(st, closure, name, a);
    });
  }

  // Namespaces are the one mutable value, so only they can form cycles; they are emptied when
  // the render ends.
  void track(const std::shared_ptr<Namespace>& ns) { namespaces_.push_back(ns); }

  ~Interp() {
    for (auto& weak : namespaces_) {
      if (auto ns = weak.lock()) ns->attrs.items.clear();
    }
  }

 private:
  static constexpr int kMaxDepth = 256;  // macro recursion (CPython stops near 1000 frames)

  CallArgs eval_args(const Expr& e, const ScopeP& sc) {
    CallArgs a;
    for (const auto& x : e.items) a.pos.push_back(eval(*x, sc));
    for (const auto& kw : e.kwargs) a.kw.emplace_back(kw.first, eval(*kw.second, sc));
    if (e.dyn_args) for (auto& v : iterate(eval(*e.dyn_args, sc))) a.pos.push_back(std::move(v));
    if (e.dyn_kwargs) {
      const Value d = eval(*e.dyn_kwargs, sc);
      if (d.kind != Kind::dict) fail("argument after ** must be a mapping, not " + type_name(d));
      for (const auto& kv : d.dict->items) {
        if (kv.first.kind != Kind::string) fail("keywords must be strings");
        a.kw.emplace_back(kv.first.s, kv.second);
      }
    }
    return a;
  }

  Value eval_node(const Expr& e, const ScopeP& sc) {
    switch (e.k) {
      case EK::literal: return e.value;
      case EK::name: {
        if (const Value* v = sc->find(e.name)) return *v;
        return Value::undefined(py_repr_str(e.name) + " is undefined");
      }
      case EK::getattr: return get_attr(eval(*e.a, sc), e.name);
      case EK::getitem: {
        const Value obj = eval(*e.a, sc);
        if (e.b->k == EK::slice) {
          const Expr& s = *e.b;
          auto part = [&](const ExprP& x) { return x ? eval(*x, sc) : Value::none(); };
          return slice_of(obj, part(s.a), part(s.b), part(s.c));
        }
        return get_item(obj, eval(*e.b, sc));
      }
      case EK::slice: fail("slice outside a subscript");
      case EK::call: {
        const Value callee = eval(*e.a, sc);
        CallArgs a = eval_args(e, sc);
        return call(callee, a);
      }
      case EK::filter: {
        Value v = eval(*e.a, sc);
        CallArgs a = eval_args(e, sc);
        if (!e.known) fail("No filter named '" + e.name + "' found.");
        return apply_filter(*this, e.name, std::move(v), a);
      }
      case EK::test: {
        const Value v = eval(*e.a, sc);
        CallArgs a = eval_args(e, sc);
        if (!e.known) fail("No test named '" + e.name + "' found.");
        return Value::boolean(apply_test(*this, e.name, v, a));
      }
      case EK::neg: case EK::pos: {
        const Value v = eval(*e.a, sc);
        if (v.is_undefined()) fail_undefined(v);
        if (!v.is_number()) fail(std::string("bad operand type for unary ") + (e.k == EK::neg ? "-" : "+") + ": '" + type_name(v) + "'");
        if (e.k == EK::pos) return v.kind == Kind::boolean ? Value::integer(v.as_int()) : v;
        return v.kind == Kind::floating ? Value::floating(-v.f) : Value::integer(sub64(0, v.as_int()));
      }
      case EK::binop: {
        const Value l = eval(*e.a, sc);
        const Value r = eval(*e.b, sc);
        return binary_op(e.name, l, r);
      }
      case EK::concat: {
        std::string s;
        for (const auto& x : e.items) s += to_str(eval(*x, sc));
        return Value::string(std::move(s));
      }
      case EK::compare: {
        Value left = eval(*e.a, sc);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value right = eval(*e.items[k], sc);
          if (!compare_op(e.ops[k], left, right)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case EK::and_: {
        Value l = eval(*e.a, sc);
        return truthy(l) ? eval(*e.b, sc) : l;
      }
      case EK::or_: {
        Value l = eval(*e.a, sc);
        return truthy(l) ? l : eval(*e.b, sc);
      }
      case EK::not_: return Value::boolean(!truthy(eval(*e.a, sc)));
      case EK::cond: {
        if (truthy(eval(*e.b, sc))) return eval(*e.a, sc);
        if (e.c) return eval(*e.c, sc);
        return Value::undefined(fmt::format("the inline if-expression on line {} evaluated to false and no else section was defined.", e.line));
      }
      case EK::list: case EK::tuple: {
        ValueList items;
        items.reserve(e.items.size());
        for (const auto& x : e.items) items.push_back(eval(*x, sc));
        return Value::make_list(std::move(items), e.k == EK::tuple ? Seq::tuple : Seq::list);
      }
      case EK::dict: {
        Dict d;
        for (size_t k = 0; k + 1 < e.items.size(); k += 2) {
          Value key = eval(*e.items[k], sc);
          if (key.kind == Kind::list && !key.is_seq(Seq::tuple) && !key.one_shot()) fail("unhashable type: '" + type_name(key) + "'");
          if (key.kind == Kind::dict) fail("unhashable type: 'dict'");
          d.set(std::move(key), eval(*e.items[k + 1], sc));
        }
        return Value::make_dict(std::move(d));
      }
    }
    fail("unknown expression");
  }

  static void assign(const Target& t, const Value& v, Scope& sc) {
    if (!t.tuple) {
      sc.set(t.names[0], v);
      return;
    }
    if (v.is_undefined()) fail_undefined(v);
    const ValueList parts = iterate(v);
    if (parts.size() < t.names.size()) {
      fail(fmt::format("not enough values to unpack (expected {}, got {})", t.names.size(), parts.size()));
    }
    if (parts.size() > t.names.size()) fail(fmt::format("too many values to unpack (expected {})", t.names.size()));
    for (size_t k = 0; k < parts.size(); ++k) sc.set(t.names[k], parts[k]);
  }

  Flow exec_stmt(const Stmt& st, const ScopeP& sc, std::string& out) {
    switch (st.k) {
      case SK::text: out += st.text; return Flow::normal;
      case SK::output: out += to_str(eval(*st.expr, sc)); return Flow::normal;
      case SK::if_:
        for (const auto& br : st.branches) {
          if (!br.first || truthy(eval(*br.first, sc))) return exec(br.second, sc, out);
        }
        return Flow::normal;
      case SK::for_: return exec_for(st, sc, out);
      case SK::set: assign(st.target, eval(*st.expr, sc), *sc); return Flow::normal;
      case SK::set_attr: {
        const Value* found = sc->find(st.text);
        if (found == nullptr || found->kind != Kind::ns) fail("cannot assign attribute on non-namespace object");
        const std::shared_ptr<Namespace> ns = found->ns;
        Value v = eval(*st.expr, sc);
        check_namespace_name(st.attr);
        ns->attrs.set(Value::string(st.attr), std::move(v));
        return Flow::normal;
      }
      case SK::set_block: {
        std::string text;
        auto inner = child(sc);
        exec(st.body, inner, text);
        Value v = Value::string(std::move(text));
        if (st.expr) {
          auto holder = child(sc);
          holder->set(kBlockValue, std::move(v));
          v = eval(*st.expr, holder);
        }
        assign(st.target, v, *sc);
        return Flow::normal;
      }
      case SK::filter_block: {
        std::string text;
        exec(st.body, child(sc), text);
        auto holder = child(sc);
        holder->set(kBlockValue, Value::string(std::move(text)));
        out += to_str(eval(*st.expr, holder));
        return Flow::normal;
      }
      case SK::macro: sc->set(st.text, macro_value(st, sc, st.text)); return Flow::normal;
      case SK::call_block: {
        const Expr& call_expr = *st.expr;
        const Value callee = eval(*call_expr.a, sc);
        CallArgs a = eval_args(call_expr, sc);
        a.kw.emplace_back("caller", macro_value(st, sc, "caller"));
        out += to_str(call(callee, a));
        return Flow::normal;
      }
      case SK::with: {
        auto inner = child(sc);
        for (const auto& p : st.params) inner->set(p.first, eval(*p.second, sc));
        exec(st.body, inner, out);
        return Flow::normal;
      }
      case SK::break_: return Flow::break_;
      case SK::continue_: return Flow::continue_;
      case SK::scope: exec(st.body, child(sc), out); return Flow::normal;
    }
    return Flow::normal;
  }

  Flow exec_for(const Stmt& st, const ScopeP& sc, std::string& out) {
    const Value seq = eval(*st.expr, sc);
    ValueList items = iterate(seq);
    if (st.cond) {
      ValueList kept;
      for (auto& x : items) {
        auto test_scope = child(sc);
        assign(st.target, x, *test_scope);
        if (truthy(eval(*st.cond, test_scope))) kept.push_back(std::move(x));
      }
      items = std::move(kept);
    }
    // jinja2 runs `else` unless some iteration reached the end of the body: its generated code
    // clears a flag at the end of the body, so break/continue skip clearing it.
    bool body_completed = false;
    auto shared = std::make_shared<const ValueList>(std::move(items));
    const auto n = static_cast<int64_t>(shared->size());
    for (int64_t k = 0; k < n; ++k) {
      auto iter_scope = child(sc);
      assign(st.target, (*shared)[static_cast<size_t>(k)], *iter_scope);
      Value loop;
      loop.kind = Kind::loop;
      loop.loop = std::make_shared<const LoopState>(LoopState{k, n, shared});
      iter_scope->set("loop", std::move(loop));
      const Flow f = exec(st.body, iter_scope, out);
      if (f == Flow::normal) body_completed = true;
      if (f == Flow::break_) break;
    }
    if (!body_completed && !st.else_body.empty()) exec(st.else_body, child(sc), out);
    return Flow::normal;
  }

 public:
  static void check_namespace_name(const std::string& name) {
    if (!name.empty() && name[0] == '_') {
      fail("Chat templates cannot store underscore-prefixed attributes on a namespace, but got " + py_repr_str(name) +
           ". Please rename the attribute.");
    }
  }

  Value call_macro(const Stmt& st, const ScopeP& closure, const std::string& name, CallArgs& a) {
    struct DepthGuard {
      int& d;
      explicit DepthGuard(int& x) : d(x) {
        if (++d > kMaxDepth) fail("maximum recursion depth exceeded");
      }
      ~DepthGuard() { --d; }
    } guard(depth_);
    auto sc = child(closure);
    const size_t np = st.params.size();
    std::vector<bool> bound(np, false);
    for (size_t k = 0; k < a.pos.size() && k < np; ++k) sc->set(st.params[k].first, a.pos[k]), bound[k] = true;
    if (a.pos.size() > np && !st.uses_varargs) {
      fail(fmt::format("macro '{}' takes not more than {} argument(s)", name, np));
    }
    Dict kwargs;
    Value caller = Value::undefined("No caller defined");
    for (auto& kw : a.kw) {
      size_t k = 0;
      while (k < np && st.params[k].first != kw.first) ++k;
      if (k < np) {
        if (bound[k]) fail(fmt::format("macro '{}' got multiple values for argument '{}'", name, kw.first));
        sc->set(kw.first, kw.second);
        bound[k] = true;
      } else if (kw.first == "caller" && st.uses_caller) {
        caller = kw.second;
      } else if (st.uses_kwargs) {
        kwargs.set(Value::string(kw.first), kw.second);
      } else {
        fail(fmt::format("macro '{}' takes no keyword argument '{}'", name, kw.first));
      }
    }
    for (size_t k = 0; k < np; ++k) {
      if (bound[k]) continue;
      const auto& p = st.params[k];
      sc->set(p.first, p.second ? eval(*p.second, sc) : Value::undefined("parameter " + py_repr_str(p.first) + " was not provided"));
    }
    if (st.uses_varargs) {
      ValueList extra;
      for (size_t k = np; k < a.pos.size(); ++k) extra.push_back(a.pos[k]);
      sc->set("varargs", Value::make_list(std::move(extra), Seq::tuple));
    }
    if (st.uses_kwargs) sc->set("kwargs", Value::make_dict(std::move(kwargs)));
    if (st.uses_caller) sc->set("caller", caller);
    std::string out;
    exec(st.body, sc, out);
    return Value::string(std::move(out));
  }

 private:
  int depth_ = 0;
  std::vector<ScopeP> closures_;
  std::vector<std::weak_ptr<Namespace>> namespaces_;
};

// ---------------------------------------------------------------------------------------------
// Operators (Python semantics, as jinja2 compiles them)

[[noreturn]] void unsupported(std::string_view op, const Value& l, const Value& r) {
  fail(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(l), type_name(r)));
}

// Python ints are unbounded; Tessera's are 64-bit and refuse to wrap.
int64_t checked(bool overflowed, int64_t v) {
  if (overflowed) fail("OverflowError: integer result does not fit in 64 bits");
  return v;
}
int64_t add64(int64_t a, int64_t b) {
  int64_t r = 0;
  const bool overflowed = __builtin_add_overflow(a, b, &r);
  return checked(overflowed, r);
}
int64_t sub64(int64_t a, int64_t b) {
  int64_t r = 0;
  const bool overflowed = __builtin_sub_overflow(a, b, &r);
  return checked(overflowed, r);
}
int64_t mul64(int64_t a, int64_t b) {
  int64_t r = 0;
  const bool overflowed = __builtin_mul_overflow(a, b, &r);
  return checked(overflowed, r);
}

int64_t floor_div(int64_t a, int64_t b) {
  if (a == INT64_MIN && b == -1) checked(true, 0);
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

Value repeat(const Value& seq, int64_t n) {
  const size_t unit = seq.kind == Kind::string ? seq.s.size() : seq.list->size();
  if (unit == 0 || n <= 0) n = 0;
  else if (static_cast<uint64_t>(n) > (uint64_t{1} << 28) / unit) fail("MemoryError: repetition is too large");
  if (seq.kind == Kind::string) {
    std::string out;
    for (int64_t k = 0; k < n; ++k) out += seq.s;
    Value v = Value::string(std::move(out));
    v.markup = seq.markup;
    return v;
  }
  ValueList out;
  for (int64_t k = 0; k < n; ++k) out.insert(out.end(), seq.list->begin(), seq.list->end());
  return Value::make_list(std::move(out), seq.seq);
}

std::string percent_format(const std::string& fmt_str, const Value& args);

std::string html_escape(std::string_view s);

// markupsafe.escape(v) for a string argument of a Markup operation (other values pass).
Value escape_arg(const Value& v) {
  if (v.kind != Kind::string || v.markup) return v;
  Value out = Value::string(html_escape(v.s));
  out.markup = true;
  return out;
}
Value escape_args(const Value& v) {
  if (v.kind == Kind::dict) {
    Dict d;
    for (const auto& kv : v.dict->items) d.items.emplace_back(kv.first, escape_arg(kv.second));
    return Value::make_dict(std::move(d));
  }
  if (!v.is_seq(Seq::tuple)) return escape_arg(v);
  ValueList items;
  for (const auto& x : *v.list) items.push_back(escape_arg(x));
  return Value::make_list(std::move(items), Seq::tuple);
}

// markupsafe.escape's replacements.
std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

Value binary_op(std::string_view op, const Value& l, const Value& r) {
  if (op == "%" && l.kind == Kind::string && r.is_undefined()) {  // str.__mod__ takes Undefined as a mapping
    return Value::string(percent_format(l.s, r));
  }
  if (l.is_undefined()) fail_undefined(l);
  if (r.is_undefined()) fail_undefined(r);
  const bool nums = l.is_number() && r.is_number();
  const bool ints = l.is_int() && r.is_int();
  if (op == "+") {
    if (ints) return Value::integer(add64(l.as_int(), r.as_int()));
    if (nums) return Value::floating(l.as_double() + r.as_double());
    if (l.kind == Kind::string && r.kind == Kind::string) {
      if (!l.markup && !r.markup) return Value::string(l.s + r.s);
      // Markup.__add__/__radd__ escape the plain operand.
      Value m = Value::string((l.markup ? l.s : html_escape(l.s)) + (r.markup ? r.s : html_escape(r.s)));
      m.markup = true;
      return m;
    }
    if (l.is_sequence() && r.kind == Kind::list && l.seq == r.seq) {
      ValueList out(*l.list);
      out.insert(out.end(), r.list->begin(), r.list->end());
      return Value::make_list(std::move(out), l.seq);
    }
    if (l.kind == Kind::string || l.is_sequence()) {
      fail(fmt::format("can only concatenate {} (not \"{}\") to {}", type_name(l), type_name(r), type_name(l)));
    }
    unsupported("+", l, r);
  }
  if (op == "-") {
    if (ints) return Value::integer(sub64(l.as_int(), r.as_int()));
    if (nums) return Value::floating(l.as_double() - r.as_double());
    unsupported("-", l, r);
  }
  if (op == "*") {
    if (ints) return Value::integer(mul64(l.as_int(), r.as_int()));
    if (nums) return Value::floating(l.as_double() * r.as_double());
    if ((l.kind == Kind::string || l.is_sequence()) && r.is_int()) return repeat(l, r.as_int());
    if ((r.kind == Kind::string || r.is_sequence()) && l.is_int()) return repeat(r, l.as_int());
    if (l.kind == Kind::string || l.is_sequence() || r.kind == Kind::string || r.is_sequence()) {
      fail(fmt::format("can't multiply sequence by non-int of type '{}'", type_name(l.kind == Kind::string || l.is_sequence() ? r : l)));
    }
    unsupported("*", l, r);
  }
  if (op == "/") {
    if (!nums) unsupported("/", l, r);
    if (r.as_double() == 0) fail("division by zero");
    return Value::floating(l.as_double() / r.as_double());
  }
  if (op == "//") {
    if (!nums) unsupported("//", l, r);
    if (ints) {
      if (r.as_int() == 0) fail("integer division or modulo by zero");
      return Value::integer(floor_div(l.as_int(), r.as_int()));
    }
    if (r.as_double() == 0) fail("float floor division by zero");
    return Value::floating(std::floor(l.as_double() / r.as_double()));
  }
  if (op == "%") {
    if (l.kind == Kind::string && l.markup) {  // Markup.__mod__ escapes its arguments
      Value v = Value::string(percent_format(l.s, escape_args(r)));
      v.markup = true;
      return v;
    }
    if (l.kind == Kind::string) return Value::string(percent_format(l.s, r));
    if (!nums) unsupported("%", l, r);
    if (ints) {
      if (r.as_int() == 0) fail("integer modulo by zero");
      if (r.as_int() == -1) return Value::integer(0);
      const int64_t m = l.as_int() % r.as_int();
      return Value::integer(m != 0 && ((m < 0) != (r.as_int() < 0)) ? m + r.as_int() : m);
    }
    if (r.as_double() == 0) fail("float modulo");
    double m = std::fmod(l.as_double(), r.as_double());
    if (m != 0 && ((m < 0) != (r.as_double() < 0))) m += r.as_double();
    return Value::floating(m);
  }
  if (op == "**") {
    if (ints && r.as_int() >= 0) {
      int64_t result = 1, base = l.as_int();
      for (int64_t e = r.as_int(); e > 0; e >>= 1) {
        if (e & 1) result = mul64(result, base);
        if (e > 1) base = mul64(base, base);
      }
      return Value::integer(result);
    }
    if (nums) {
      if (l.as_double() == 0 && r.as_double() < 0) fail("0.0 cannot be raised to a negative power");
      return Value::floating(std::pow(l.as_double(), r.as_double()));
    }
    unsupported("** or pow()", l, r);
  }
  fail(fmt::format("unknown operator {}", op));
}

// The type name Python's hash() rejects in `v`, or null when `v` is hashable.
const char* unhashable(const Value& v) {
  if (v.kind == Kind::dict) return "dict";
  if (v.kind != Kind::list || v.one_shot()) return nullptr;
  if (v.seq != Seq::tuple && v.seq != Seq::range) {
    static const char* const kNames[] = {"list", "tuple", "generator", "list_reverseiterator", "dict_items", "dict_keys", "dict_values", "range"};
    return v.seq == Seq::dict_values ? nullptr : kNames[static_cast<int>(v.seq)];
  }
  for (const auto& x : *v.list) if (const char* t = unhashable(x)) return t;
  return nullptr;
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Kind::undefined: return false;
    case Kind::string:
      if (item.kind != Kind::string) fail("'in <string>' requires string as left operand, not " + type_name(item));
      return container.s.find(item.s) != std::string::npos;
    case Kind::list:
      for (const auto& x : iterate(container)) if (py_equal(x, item)) return true;
      return false;
    case Kind::dict:
      if (const char* t = unhashable(item)) fail(std::string("unhashable type: '") + t + "'");
      return container.dict->find(item) != nullptr;
    default: fail("argument of type '" + type_name(container) + "' is not iterable");
  }
}

// a < b (Python); fails for unordered type pairs.
bool py_less(const Value& a, const Value& b, std::string_view op = "<") {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_int() && b.is_int()) return a.as_int() < b.as_int();
    return a.as_double() < b.as_double();
  }
  if (a.kind == Kind::string && b.kind == Kind::string) return a.s < b.s;
  if (a.is_sequence() && b.kind == Kind::list && a.seq == b.seq) {
    const size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      if (!py_equal((*a.list)[k], (*b.list)[k])) return py_less((*a.list)[k], (*b.list)[k], op);
    }
    return a.list->size() < b.list->size();
  }
  fail(fmt::format("'{}' not supported between instances of '{}' and '{}'", op, type_name(a), type_name(b)));
}

bool compare_op(std::string_view op, const Value& l, const Value& r) {
  if (op == "==") return py_equal(l, r);
  if (op == "!=") return !py_equal(l, r);
  if (op == "in") return contains(r, l);
  if (op == "notin") return !contains(r, l);
  if (op == "<") return py_less(l, r, op);
  if (op == ">") return py_less(r, l, op);
  if (op == "<=") return py_equal(l, r) ? (py_less(l, r, op), true) : py_less(l, r, op);
  if (op == ">=") return py_equal(l, r) ? (py_less(r, l, op), true) : py_less(r, l, op);
  fail(fmt::format("unknown comparison {}", op));
}

// obj[start:stop:step] for str, list and tuple.
Value slice_of(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) fail_undefined(obj);
  auto index = [](const Value& v, int64_t dflt) {
    if (v.kind == Kind::none) return dflt;
    if (!v.is_int()) fail("slice indices must be integers or None or have an __index__ method");
    return v.as_int();
  };
  if (obj.kind == Kind::dict) fail("unhashable type: 'slice'");
  if (obj.kind != Kind::string && !obj.is_sequence() && !obj.is_seq(Seq::range)) {
    fail("'" + type_name(obj) + "' object is not subscriptable");
  }
  const int64_t st = index(step, 1);
  if (st == 0) fail("slice step cannot be zero");
  const U32 text = obj.kind == Kind::string ? to_u32(obj.s) : U32();
  const auto len = static_cast<int64_t>(obj.kind == Kind::string ? text.size() : obj.list->size());
  auto adjust = [&](const Value& v, bool is_start) {
    if (v.kind == Kind::none) return st > 0 ? (is_start ? int64_t{0} : len) : (is_start ? len - 1 : int64_t{-1});
    int64_t x = index(v, 0);
    if (x < 0) {
      x += len;
      if (x < 0) x = st < 0 ? -1 : 0;
    } else if (x >= len) {
      x = st < 0 ? len - 1 : len;
    }
    return x;
  };
  const int64_t b = adjust(start, true), e = adjust(stop, false);
  if (obj.is_seq(Seq::range)) return make_range(obj.i + b * obj.range_step, obj.i + e * obj.range_step, obj.range_step * st);
  std::vector<size_t> picks;
  for (int64_t k = b; st > 0 ? k < e : k > e; k += st) picks.push_back(static_cast<size_t>(k));
  if (obj.kind == Kind::string) {
    U32 out;
    for (size_t k : picks) out.push_back(text[k]);
    Value v = Value::string(to_utf8(out));
    v.markup = obj.markup;
    return v;
  }
  ValueList out;
  for (size_t k : picks) out.push_back((*obj.list)[k]);
  return Value::make_list(std::move(out), obj.is_seq(Seq::tuple) ? Seq::tuple : Seq::list);
}

// ---------------------------------------------------------------------------------------------
// Builtin-call helpers

// Binds positional and keyword arguments to `names` like a Python signature; parameters without
// a value take `defaults`, which cover the last defaults.size() names.
std::vector<Value> bind(std::string_view fn, const CallArgs& a, std::initializer_list<const char*> names,
                        std::vector<Value> defaults = {}) {
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

// ---------------------------------------------------------------------------------------------
// Methods of str, dict and list (what the sandbox allows; mutating ones are "unsafe")

// Splits `s` like str.split/str.rsplit; `sep` null splits on runs of whitespace.
ValueList py_split(const std::string& s, const std::string* sep, int64_t maxsplit, bool from_right) {
  ValueList out;
  const U32 u = to_u32(s);
  if (sep == nullptr) {
    std::vector<std::pair<size_t, size_t>> words;  // [begin, end) in code points
    if (!from_right) {
      size_t i = 0;
      while (true) {
        while (i < u.size() && py_isspace(u[i])) ++i;
        if (i >= u.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          size_t e = u.size();
          words.emplace_back(i, e);
          break;
        }
        size_t j = i;
        while (j < u.size() && !py_isspace(u[j])) ++j;
        words.emplace_back(i, j);
        i = j;
      }
    } else {
      size_t i = u.size();
      while (true) {
        while (i > 0 && py_isspace(u[i - 1])) --i;
        if (i == 0) break;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          words.emplace_back(0, i);
          break;
        }
        size_t j = i;
        while (j > 0 && !py_isspace(u[j - 1])) --j;
        words.emplace_back(j, i);
        i = j;
      }
      std::reverse(words.begin(), words.end());
    }
    for (const auto& w : words) out.push_back(Value::string(to_utf8(std::u32string_view(u).substr(w.first, w.second - w.first))));
    return out;
  }
  if (sep->empty()) fail("empty separator");
  std::vector<std::string> parts;
  if (!from_right) {
    size_t start = 0;
    while (true) {
      const size_t p = (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) ? std::string::npos : s.find(*sep, start);
      if (p == std::string::npos) {
        parts.push_back(s.substr(start));
        break;
      }
      parts.push_back(s.substr(start, p - start));
      start = p + sep->size();
    }
  } else {
    size_t end = s.size();
    while (true) {
      size_t p = std::string::npos;
      if (!(maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) && end >= sep->size()) {
        p = s.rfind(*sep, end - sep->size());
      }
      if (p == std::string::npos) {
        parts.push_back(s.substr(0, end));
        break;
      }
      parts.push_back(s.substr(p + sep->size(), end - p - sep->size()));
      end = p;
    }
    std::reverse(parts.begin(), parts.end());
  }
  for (auto& p : parts) out.push_back(Value::string(std::move(p)));
  return out;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count) {
  std::string out;
  if (old.empty()) {
    const U32 u = to_u32(s);
    int64_t done = 0;
    for (size_t k = 0; k <= u.size(); ++k) {
      if (count < 0 || done < count) out += repl, ++done;
      if (k < u.size()) encode(u[k], out);
    }
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t p = s.find(old, start);
    if (p == std::string::npos) break;
    out.append(s, start, p - start);
    out += repl;
    start = p + old.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  return out;
}

// Resolves Python's optional [start[, end]] arguments against a length.
std::pair<size_t, size_t> span_args(const CallArgs& a, size_t first, size_t len) {
  auto idx = [&](size_t k, int64_t dflt) {
    if (a.pos.size() <= k || a.pos[k].kind == Kind::none) return dflt;
    int64_t x = int_arg(a.pos[k], "slice index");
    if (x < 0) x = std::max<int64_t>(0, x + static_cast<int64_t>(len));
    return std::min<int64_t>(x, static_cast<int64_t>(len));
  };
  const int64_t b = idx(first, 0), e = idx(first + 1, static_cast<int64_t>(len));
  return {static_cast<size_t>(b), static_cast<size_t>(std::max(b, e))};
}

ValueList splitlines(const std::string& s, bool keepends) {
  ValueList out;
  const U32 u = to_u32(s);
  size_t start = 0;
  for (size_t k = 0; k < u.size(); ++k) {
    const char32_t c = u[k];
    const bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
                     c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) continue;
    size_t end = k + 1;
    if (c == '\r' && k + 1 < u.size() && u[k + 1] == '\n') end = k + 2;
    out.push_back(Value::string(to_utf8(std::u32string_view(u).substr(start, (keepends ? end : k) - start))));
    start = end;
    k = end - 1;
  }
  if (start < u.size()) out.push_back(Value::string(to_utf8(std::u32string_view(u).substr(start))));
  return out;
}

template <class Pred>
bool all_cps(const std::string& s, Pred p) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size();) if (!p(decode(s, i))) return false;
  return true;
}

bool is_category(uint32_t c, std::initializer_list<utf8proc_category_t> cats) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return std::find(cats.begin(), cats.end(), cat) != cats.end();
}
bool py_isalpha_cp(uint32_t c) {
  return is_category(c, {UTF8PROC_CATEGORY_LU, UTF8PROC_CATEGORY_LL, UTF8PROC_CATEGORY_LT, UTF8PROC_CATEGORY_LM, UTF8PROC_CATEGORY_LO});
}
bool py_isnumeric_cp(uint32_t c) { return is_category(c, {UTF8PROC_CATEGORY_ND, UTF8PROC_CATEGORY_NL, UTF8PROC_CATEGORY_NO}); }

// str.islower/isupper: at least one cased character, and no cased character of the other case.
bool py_case_is(const std::string& s, bool upper) {
  bool cased = false;
  for (size_t i = 0; i < s.size();) {
    const uint32_t c = decode(s, i);
    if (upper ? py_islower_cp(c) || is_category(c, {UTF8PROC_CATEGORY_LT}) : py_isupper_cp(c) || is_category(c, {UTF8PROC_CATEGORY_LT})) return false;
    if (py_iscased(c)) cased = true;
  }
  return cased;
}

std::string pad(const std::string& s, int64_t width, const std::string& fill, int mode) {  // mode: -1 ljust, 0 center, 1 rjust
  const auto len = static_cast<int64_t>(cp_length(s));
  if (width <= len) return s;
  const int64_t marg = width - len;
  int64_t left = mode < 0 ? 0 : mode > 0 ? marg : marg / 2 + (marg & width & 1);
  std::string out;
  for (int64_t k = 0; k < left; ++k) out += fill;
  out += s;
  for (int64_t k = 0; k < marg - left; ++k) out += fill;
  return out;
}

Value str_format(const std::string& f, const CallArgs& a);

Value str_method_plain(const Value& self, const std::string& m, CallArgs& a);

// markupsafe.Markup's overrides of str methods: they return Markup, and escape what they add
// (replace's `new`, the fill character of ljust/rjust/center, join's items, format's values).
Value str_method(const Value& self, const std::string& m, CallArgs& a) {
  static const std::set<std::string> kWrapped = {
      "capitalize", "title", "lower", "upper", "replace", "ljust", "rjust", "lstrip", "rstrip", "center", "strip",
      "swapcase", "zfill", "casefold", "removeprefix", "removesuffix", "split", "rsplit", "splitlines", "partition",
      "rpartition", "format", "join"};
  if (!self.markup || kWrapped.count(m) == 0) return str_method_plain(self, m, a);
  if (m == "join") {
    ValueList items;
    for (const auto& x : iterate(bind("str.join", a, {"iterable"})[0])) items.push_back(escape_arg(x));
    a.pos = {Value::make_list(std::move(items))};
    a.kw.clear();
  } else if (m == "format") {
    for (auto& x : a.pos) x = escape_arg(x);
    for (auto& kw : a.kw) kw.second = escape_arg(kw.second);
  } else if (m == "replace" || m == "ljust" || m == "rjust" || m == "center") {
    if (a.pos.size() > 1) a.pos[1] = escape_arg(a.pos[1]);
  }
  Value r = str_method_plain(self, m, a);
  if (r.kind == Kind::string) r.markup = true;
  if (r.kind == Kind::list) {
    ValueList items = *r.list;
    for (auto& x : items) if (x.kind == Kind::string) x.markup = true;
    r = Value::make_list(std::move(items), r.seq);
  }
  return r;
}

Value str_method_plain(const Value& self, const std::string& m, CallArgs& a) {
  const std::string& s = self.s;
  const std::string fn = "str." + m;
  if (m == "strip" || m == "lstrip" || m == "rstrip") {
    const auto v = bind(fn, a, {"chars"}, {Value::none()});
    const std::string chars = v[0].kind == Kind::none ? "" : str_arg(v[0], fn);
    return Value::string(py_strip(s, v[0].kind == Kind::none ? nullptr : &chars, m != "rstrip", m != "lstrip"));
  }
  if (m == "split" || m == "rsplit") {
    const auto v = bind(fn, a, {"sep", "maxsplit"}, {Value::none(), Value::integer(-1)});
    const std::string sep = v[0].kind == Kind::none ? "" : str_arg(v[0], fn);
    return Value::make_list(py_split(s, v[0].kind == Kind::none ? nullptr : &sep, int_arg(v[1], "maxsplit"), m == "rsplit"));
  }
  if (m == "splitlines") return Value::make_list(splitlines(s, truthy(bind(fn, a, {"keepends"}, {Value::boolean(false)})[0])));
  if (m == "startswith" || m == "endswith") {
    if (a.pos.empty()) fail(fn + "() takes at least 1 argument (0 given)");
    const U32 u = to_u32(s);
    const auto sp = span_args(a, 1, u.size());
    const std::string region = to_utf8(std::u32string_view(u).substr(sp.first, sp.second - sp.first));
    ValueList options = a.pos[0].is_seq(Seq::tuple) ? *a.pos[0].list : ValueList{a.pos[0]};
    for (const auto& o : options) {
      if (o.kind != Kind::string) fail(fn + " first arg must be str or a tuple of str, not " + type_name(o));
      if (m == "startswith" ? starts_with(region, o.s) : ends_with(region, o.s)) return Value::boolean(true);
    }
    return Value::boolean(false);
  }
  if (m == "upper") return Value::string(py_upper(s));
  if (m == "lower" || m == "casefold") return Value::string(py_lower(s));
  if (m == "title") return Value::string(py_title(s));
  if (m == "capitalize") return Value::string(py_capitalize(s));
  if (m == "swapcase") {
    std::string out;
    for (size_t i = 0; i < s.size();) {
      const uint32_t c = decode(s, i);
      encode(py_isupper_cp(c) ? to_lower_cp(c) : py_islower_cp(c) ? to_upper_cp(c) : c, out);
    }
    return Value::string(out);
  }
  if (m == "replace") {
    const auto v = bind(fn, a, {"old", "new", "count"}, {Value::integer(-1)});
    return Value::string(py_replace(s, str_arg(v[0], fn), str_arg(v[1], fn), int_arg(v[2], "count")));
  }
  if (m == "find" || m == "rfind" || m == "index" || m == "rindex" || m == "count") {
    if (a.pos.empty()) fail(fn + "() takes at least 1 argument (0 given)");
    const U32 u = to_u32(s);
    const U32 sub = to_u32(str_arg(a.pos[0], fn));
    const auto sp = span_args(a, 1, u.size());
    const std::u32string_view region = std::u32string_view(u).substr(sp.first, sp.second - sp.first);
    if (m == "count") {
      if (sub.empty()) return Value::integer(static_cast<int64_t>(region.size() + 1));
      int64_t n = 0;
      for (size_t p = region.find(sub); p != std::u32string_view::npos; p = region.find(sub, p + sub.size())) ++n;
      return Value::integer(n);
    }
    const size_t p = m[0] == 'r' ? region.rfind(sub) : region.find(sub);
    if (p == std::u32string_view::npos) {
      if (m == "index" || m == "rindex") fail("substring not found");
      return Value::integer(-1);
    }
    return Value::integer(static_cast<int64_t>(p + sp.first));
  }
  if (m == "join") {
    const auto v = bind(fn, a, {"iterable"});
    std::string out;
    const ValueList items = iterate(v[0]);
    for (size_t k = 0; k < items.size(); ++k) {
      if (items[k].kind != Kind::string) fail(fmt::format("sequence item {}: expected str instance, {} found", k, type_name(items[k])));
      if (k) out += s;
      out += items[k].s;
    }
    return Value::string(out);
  }
  if (m == "isdigit" || m == "isdecimal") return Value::boolean(all_cps(s, [](uint32_t c) { return is_category(c, {UTF8PROC_CATEGORY_ND}); }));
  if (m == "isnumeric") return Value::boolean(all_cps(s, py_isnumeric_cp));
  if (m == "isalpha") return Value::boolean(all_cps(s, py_isalpha_cp));
  if (m == "isalnum") return Value::boolean(all_cps(s, [](uint32_t c) { return py_isalpha_cp(c) || py_isnumeric_cp(c); }));
  if (m == "isspace") return Value::boolean(all_cps(s, py_isspace));
  if (m == "isupper") return Value::boolean(py_case_is(s, true));
  if (m == "islower") return Value::boolean(py_case_is(s, false));
  if (m == "zfill") {
    const int64_t width = int_arg(bind(fn, a, {"width"})[0], "width");
    const auto len = static_cast<int64_t>(cp_length(s));
    if (width <= len) return self;
    const bool sign = !s.empty() && (s[0] == '+' || s[0] == '-');
    return Value::string((sign ? s.substr(0, 1) : "") + std::string(static_cast<size_t>(width - len), '0') + (sign ? s.substr(1) : s));
  }
  if (m == "ljust" || m == "rjust" || m == "center") {
    const auto v = bind(fn, a, {"width", "fillchar"}, {Value::string(" ")});
    return Value::string(pad(s, int_arg(v[0], "width"), str_arg(v[1], fn), m == "ljust" ? -1 : m == "center" ? 0 : 1));
  }
  if (m == "partition" || m == "rpartition") {
    const std::string sep = str_arg(bind(fn, a, {"sep"})[0], fn);
    if (sep.empty()) fail("empty separator");
    const size_t p = m == "partition" ? s.find(sep) : s.rfind(sep);
    ValueList parts;
    if (p == std::string::npos) {
      parts = m == "partition" ? ValueList{Value::string(s), Value::string(""), Value::string("")}
                               : ValueList{Value::string(""), Value::string(""), Value::string(s)};
    } else {
      parts = {Value::string(s.substr(0, p)), Value::string(sep), Value::string(s.substr(p + sep.size()))};
    }
    return Value::make_list(std::move(parts), Seq::tuple);
  }
  if (m == "removeprefix") {
    const std::string p = str_arg(bind(fn, a, {"prefix"})[0], fn);
    return Value::string(starts_with(s, p) ? s.substr(p.size()) : s);
  }
  if (m == "removesuffix") {
    const std::string p = str_arg(bind(fn, a, {"suffix"})[0], fn);
    return Value::string(!p.empty() && ends_with(s, p) ? s.substr(0, s.size() - p.size()) : s);
  }
  if (m == "format") return str_format(s, a);
  fail("'str' object has no attribute " + py_repr_str(m));
}

// str.format for "{}", "{0}", "{name}", "{{", "}}" and !r/!s conversions (no format specs).
Value str_format(const std::string& f, const CallArgs& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    const char c = f[i];
    if (c == '}' ) {
      if (i + 1 < f.size() && f[i + 1] == '}') {
        out.push_back('}');
        ++i;
        continue;
      }
      fail("Single '}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < f.size() && f[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    const size_t close = f.find('}', i);
    if (close == std::string::npos) fail("Single '{' encountered in format string");
    std::string field = f.substr(i + 1, close - i - 1);
    i = close;
    char conv = 0;
    if (const size_t bang = field.find('!'); bang != std::string::npos) {
      conv = bang + 1 < field.size() ? field[bang + 1] : 0;
      field.resize(bang);
    }
    if (field.find(':') != std::string::npos) fail("format specs in str.format are not supported");
    Value v;
    if (field.empty() || std::all_of(field.begin(), field.end(), is_digit)) {
      const size_t k = field.empty() ? auto_index++ : static_cast<size_t>(std::stoul(field));
      if (k >= a.pos.size()) fail(fmt::format("Replacement index {} out of range for positional args tuple", k));
      v = a.pos[k];
    } else {
      auto it = std::find_if(a.kw.begin(), a.kw.end(), [&](const auto& kw) { return kw.first == field; });
      if (it == a.kw.end()) fail("KeyError: " + py_repr_str(field));
      v = it->second;
    }
    out += conv == 'r' ? repr(v) : to_str(v);
  }
  return Value::string(out);
}

const std::set<std::string>& str_methods() {
  static const std::set<std::string> k = {
      "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith", "endswith", "upper", "lower",
      "casefold", "title", "capitalize", "swapcase", "replace", "find", "rfind", "index", "rindex", "count", "join",
      "isdigit", "isdecimal", "isnumeric", "isalpha", "isalnum", "isspace", "isupper", "islower", "zfill", "ljust",
      "rjust", "center", "partition", "rpartition", "removeprefix", "removesuffix", "format"};
  return k;
}

Value dict_method(const Value& self, const std::string& m, CallArgs& a) {
  const std::string fn = "dict." + m;
  if (m == "items" || m == "keys" || m == "values") {
    bind(fn, a, {});
    ValueList out;
    for (const auto& kv : self.dict->items) {
      if (m == "items") out.push_back(Value::make_list({kv.first, kv.second}, Seq::tuple));
      else out.push_back(m == "keys" ? kv.first : kv.second);
    }
    return Value::make_list(std::move(out), m == "items" ? Seq::dict_items : m == "keys" ? Seq::dict_keys : Seq::dict_values);
  }
  if (m == "get") {
    const auto v = bind(fn, a, {"key", "default"}, {Value::none()});
    const Value* found = self.dict->find(v[0]);
    return found ? *found : v[1];
  }
  if (m == "copy") return self;
  fail("'dict' object has no attribute " + py_repr_str(m));
}

Value list_method(const Value& self, const std::string& m, CallArgs& a) {
  const std::string fn = type_name(self) + "." + m;
  if (m == "index" || m == "count") {
    if (a.pos.empty()) fail(fn + "() takes at least 1 argument (0 given)");
    const auto sp = span_args(a, 1, self.list->size());
    int64_t n = 0;
    for (size_t k = sp.first; k < sp.second; ++k) {
      if (!py_equal((*self.list)[k], a.pos[0])) continue;
      if (m == "index") return Value::integer(static_cast<int64_t>(k));
      ++n;
    }
    if (m == "index") fail(repr(a.pos[0]) + " is not in " + type_name(self));
    return Value::integer(n);
  }
  if (m == "copy" && self.is_seq(Seq::list)) return Value::make_list(*self.list);
  fail("'" + type_name(self) + "' object has no attribute " + py_repr_str(m));
}

Value bound(const Value& self, const std::string& name, Value (*impl)(const Value&, const std::string&, CallArgs&)) {
  return Value::function(name, [self, name, impl](Interp&, CallArgs& a) { return impl(self, name, a); });
}

Value unsafe(const Value& obj, const std::string& name) {
  return Value::undefined("access to attribute " + py_repr_str(name) + " of " + py_repr_str(type_name(obj)) + " object is unsafe.");
}

bool is_dict_method(const std::string& n) { return n == "items" || n == "keys" || n == "values" || n == "get" || n == "copy"; }
bool is_dict_unsafe(const std::string& n) {
  return n == "pop" || n == "popitem" || n == "setdefault" || n == "update" || n == "clear" || n == "fromkeys";
}
bool is_list_method(const Value& l, const std::string& n) {
  if (!l.is_sequence() && !l.is_seq(Seq::range)) return false;
  return n == "index" || n == "count" || (n == "copy" && l.is_seq(Seq::list));
}
bool is_list_unsafe(const Value& l, const std::string& n) {
  return l.is_seq(Seq::list) && (n == "append" || n == "extend" || n == "insert" || n == "pop" || n == "remove" || n == "reverse" ||
                      n == "sort" || n == "clear");
}

Value loop_attr(const Value& obj, const std::string& name) {
  const LoopState& l = *obj.loop;
  if (name == "index") return Value::integer(l.index0 + 1);
  if (name == "index0") return Value::integer(l.index0);
  if (name == "revindex") return Value::integer(l.length - l.index0);
  if (name == "revindex0") return Value::integer(l.length - l.index0 - 1);
  if (name == "first") return Value::boolean(l.index0 == 0);
  if (name == "last") return Value::boolean(l.index0 == l.length - 1);
  if (name == "length") return Value::integer(l.length);
  if (name == "depth") return Value::integer(1);
  if (name == "depth0") return Value::integer(0);
  if (name == "previtem") return l.index0 > 0 ? (*l.items)[static_cast<size_t>(l.index0 - 1)] : Value::undefined("there is no previous item");
  if (name == "nextitem") {
    return l.index0 + 1 < l.length ? (*l.items)[static_cast<size_t>(l.index0 + 1)] : Value::undefined("there is no next item");
  }
  if (name == "cycle") {
    const int64_t index0 = l.index0;
    return Value::function("cycle", [index0](Interp&, CallArgs& a) {
      if (a.pos.empty()) fail("no items for cycling given");
      return a.pos[static_cast<size_t>(index0 % static_cast<int64_t>(a.pos.size()))];
    });
  }
  return undefined_member(obj, Value::string(name));
}

// environment.getattr(obj, name) of the sandbox: a Python attribute first, then obj[name].
Value get_attr(const Value& obj, const std::string& name) {
  switch (obj.kind) {
    case Kind::undefined: fail_undefined(obj);
    case Kind::dict:
      if (is_dict_method(name)) return bound(obj, name, dict_method);
      if (is_dict_unsafe(name)) return unsafe(obj, name);
      if (const Value* v = obj.dict->find(std::string_view(name))) return *v;
      break;
    case Kind::string:
      if (str_methods().count(name)) return bound(obj, name, str_method);
      break;
    case Kind::list:
      if (is_list_method(obj, name)) return bound(obj, name, list_method);
      if (is_list_unsafe(obj, name)) return unsafe(obj, name);
      break;
    case Kind::ns:
      if (const Value* v = obj.ns->attrs.find(std::string_view(name))) return *v;
      break;
    case Kind::loop: return loop_attr(obj, name);
    default: break;
  }
  return undefined_member(obj, Value::string(name));
}

// environment.getitem(obj, key) of the sandbox: obj[key] first, then a Python attribute.
Value get_item(const Value& obj, const Value& key) {
  switch (obj.kind) {
    case Kind::undefined: fail_undefined(obj);
    case Kind::dict: {
      if ((key.kind == Kind::list && !key.is_seq(Seq::tuple) && !key.one_shot()) || key.kind == Kind::dict) return undefined_member(obj, key);
      if (const Value* v = obj.dict->find(key)) return *v;
      if (key.kind == Kind::string) return get_attr(obj, key.s);
      return undefined_member(obj, key);
    }
    case Kind::list: case Kind::string: {
      if (key.is_int() && (obj.kind == Kind::string || obj.is_sequence() || obj.is_seq(Seq::range))) {
        const int64_t len = obj.kind == Kind::list ? static_cast<int64_t>(obj.list->size()) : static_cast<int64_t>(cp_length(obj.s));
        int64_t k = key.as_int();
        if (k < 0) k += len;
        if (k < 0 || k >= len) return undefined_member(obj, key);
        if (obj.kind == Kind::list) return (*obj.list)[static_cast<size_t>(k)];
        std::string ch;
        encode(to_u32(obj.s)[static_cast<size_t>(k)], ch);
        Value v = Value::string(std::move(ch));
        v.markup = obj.markup;
        return v;
      }
      if (key.kind == Kind::string) return get_attr(obj, key.s);
      return undefined_member(obj, key);
    }
    case Kind::ns: case Kind::loop:
      if (key.kind == Kind::string) return get_attr(obj, key.s);
      return undefined_member(obj, key);
    default: return undefined_member(obj, key);
  }
}

// ---------------------------------------------------------------------------------------------
// Filters (jinja2.filters, plus transformers' tojson)

// make_attrgetter: "a.b.0" looked up item by item; `dflt` replaces an undefined step.
Value attr_path(const Value& item, const Value& attribute, const Value* dflt = nullptr) {
  std::vector<Value> parts;
  if (attribute.kind == Kind::string) {
    static const std::string kDot = ".";
    for (const auto& p : py_split(attribute.s, &kDot, -1, /*from_right=*/false)) {
      const bool digits = !p.s.empty() && std::all_of(p.s.begin(), p.s.end(), is_digit);
      parts.push_back(digits ? Value::integer(std::stoll(p.s)) : p);
    }
  } else {
    parts.push_back(attribute);
  }
  Value v = item;
  for (const auto& p : parts) {
    v = get_item(v, p);
    if (dflt != nullptr && dflt->kind != Kind::none && v.is_undefined()) v = *dflt;
  }
  return v;
}

Value lower_if_str(const Value& v) { return v.kind == Kind::string ? Value::string(py_lower(v.s)) : v; }

// Sorts with Python's `<`, stable; `key` maps each element first.
void py_sort(ValueList& items, const std::function<Value(const Value&)>& key, bool reverse) {
  std::vector<std::pair<Value, Value>> keyed;
  keyed.reserve(items.size());
  for (auto& x : items) keyed.emplace_back(key(x), std::move(x));
  std::stable_sort(keyed.begin(), keyed.end(), [reverse](const auto& a, const auto& b) {
    return reverse ? py_less(b.first, a.first) : py_less(a.first, b.first);
  });
  items.clear();
  for (auto& kv : keyed) items.push_back(std::move(kv.second));
}

using FilterFn = Value (*)(Interp&, Value&, CallArgs&);

Value f_abs(Interp&, Value& v, CallArgs& a) {
  bind("abs", a, {});
  if (v.is_undefined()) fail_undefined(v);
  if (v.kind == Kind::floating) return Value::floating(std::fabs(v.f));
  if (v.is_int()) return Value::integer(std::llabs(v.as_int()));
  fail("bad operand type for abs(): '" + type_name(v) + "'");
}

Value f_attr(Interp&, Value& v, CallArgs& a) {
  const std::string name = to_str(bind("attr", a, {"name"})[0]);
  if (v.kind == Kind::dict && !is_dict_method(name)) return is_dict_unsafe(name) ? unsafe(v, name) : undefined_member(v, Value::string(name));
  return get_attr(v, name);
}

// A filter result computed from soft_str(v): Markup stays Markup.
Value like(const Value& v, std::string s) {
  Value out = Value::string(std::move(s));
  out.markup = v.kind == Kind::string && v.markup;
  return out;
}

Value f_capitalize(Interp&, Value& v, CallArgs& a) { bind("capitalize", a, {}); return like(v, py_capitalize(to_str(v))); }
Value f_upper(Interp&, Value& v, CallArgs& a) { bind("upper", a, {}); return like(v, py_upper(to_str(v))); }
Value f_lower(Interp&, Value& v, CallArgs& a) { bind("lower", a, {}); return like(v, py_lower(to_str(v))); }

// do_title: words start after runs of `-`, whitespace, `(`, `{`, `[`, `<`; each run (word or
// separator) gets its first character upper-cased and the rest lower-cased.
Value f_title(Interp&, Value& v, CallArgs& a) {
  bind("title", a, {});
  const U32 u = to_u32(to_str(v));
  auto sep = [](char32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_isspace(c); };
  std::string out;
  for (size_t k = 0; k < u.size(); ++k) {
    const bool first = k == 0 || sep(u[k]) != sep(u[k - 1]);
    encode(first ? to_upper_cp(u[k]) : to_lower_cp(u[k]), out);
  }
  return Value::string(out);
}

Value f_length(Interp&, Value& v, CallArgs& a) { bind("length", a, {}); return Value::integer(py_len(v)); }

Value f_default(Interp&, Value& v, CallArgs& a) {
  const auto p = bind("default", a, {"default_value", "boolean"}, {Value::string(""), Value::boolean(false)});
  if (v.is_undefined() || (truthy(p[1]) && !truthy(v))) return p[0];
  return v;
}

Value f_dictsort(Interp&, Value& v, CallArgs& a) {
  const auto p = bind("dictsort", a, {"case_sensitive", "by", "reverse"}, {Value::boolean(false), Value::string("key"), Value::boolean(false)});
  if (v.kind != Kind::dict) fail("'" + type_name(v) + "' object has no attribute 'items'");
  const std::string by = to_str(p[1]);
  if (by != "key" && by != "value") fail("You can only sort by either \"key\" or \"value\"");
  ValueList items;
  for (const auto& kv : v.dict->items) items.push_back(Value::make_list({kv.first, kv.second}, Seq::tuple));
  const bool cs = truthy(p[0]);
  const size_t pos = by == "key" ? 0 : 1;
  py_sort(items, [&](const Value& x) { return cs ? (*x.list)[pos] : lower_if_str((*x.list)[pos]); }, truthy(p[2]));
  return Value::make_list(std::move(items));
}

Value f_escape(Interp&, Value& v, CallArgs& a) {
  bind("escape", a, {});
  if (v.kind == Kind::string && v.markup) return v;
  Value out = Value::string(html_escape(to_str(v)));
  out.markup = true;
  return out;
}

Value f_forceescape(Interp&, Value& v, CallArgs& a) {
  bind("forceescape", a, {});
  Value out = Value::string(html_escape(to_str(v)));
  out.markup = true;
  return out;
}

Value f_first(Interp&, Value& v, CallArgs& a) {
  bind("first", a, {});
  const ValueList items = iterate(v);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_last(Interp&, Value& v, CallArgs& a) {
  bind("last", a, {});
  if (v.is_seq(Seq::generator)) fail("'generator' object is not reversible");
  if (v.kind == Kind::string && v.markup) {
    const U32 u = to_u32(v.s);
    if (u.empty()) return Value::undefined("No last item, sequence was empty.");
    return Value::string(to_utf8(u.substr(u.size() - 1)));
  }
  const ValueList items = iterate(v);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

Value f_float(Interp&, Value& v, CallArgs& a) {
  const auto p = bind("float", a, {"default"}, {Value::floating(0.0)});
  if (v.is_undefined()) fail_undefined(v);  // Undefined.__float__ raises
  if (v.kind == Kind::floating) return v;
  if (v.is_int()) return Value::floating(static_cast<double>(v.as_int()));
  double d = 0;
  if (v.kind == Kind::string && parse_py_float(v.s, d)) return Value::floating(d);
  return p[0];
}

Value f_int(Interp&, Value& v, CallArgs& a) {
  const auto p = bind("int", a, {"default", "base"}, {Value::integer(0), Value::integer(10)});
  if (v.is_undefined()) fail_undefined(v);  // Undefined.__int__ raises
  if (v.is_int()) return Value::integer(v.as_int());
  if (v.kind == Kind::floating) {
    if (!std::isfinite(v.f)) fail("cannot convert float infinity or NaN to integer");
    return Value::integer(static_cast<int64_t>(v.f));
  }
  if (v.kind == Kind::string) {
    int64_t i = 0;
    if (parse_py_int(v.s, static_cast<int>(int_arg(p[1], "base")), i)) return Value::integer(i);
    double d = 0;
    if (parse_py_float(v.s, d) && std::isfinite(d)) return Value::integer(static_cast<int64_t>(d));
  }
  return p[0];
}

Value f_format(Interp&, Value& v, CallArgs& a) {
  if (!a.kw.empty() && !a.pos.empty()) fail("can't handle positional and keyword arguments at the same time");
  if (!a.kw.empty()) {
    Dict d;
    for (auto& kw : a.kw) d.set(Value::string(kw.first), kw.second);
    return Value::string(percent_format(to_str(v), Value::make_dict(std::move(d))));
  }
  return Value::string(percent_format(to_str(v), Value::make_list(a.pos, Seq::tuple)));
}

Value f_indent(Interp&, Value& v, CallArgs& a) {
  const auto p = bind("indent", a, {"width", "first", "blank"}, {Value::integer(4), Value::boolean(false), Value::boolean(false)});
  const std::string ind = p[0].kind == Kind::string ? p[0].s : std::string(static_cast<size_t>(std::max<int64_t>(0, int_arg(p[0], "width"))), ' ');
  if (v.is_undefined()) fail_undefined(v);
  if (v.kind != Kind::string) fail("unsupported operand type(s) for +=: '" + type_name(v) + "' and 'str'");
  const ValueList lines = splitlines(v.s + "\n", false);
  std::string rv;
  if (truthy(p[2])) {
    for (size_t k = 0; k < lines.size(); ++k) rv += (k ? "\n" + ind : "") + lines[k].s;
  } else {
    rv = lines.empty() ? "" : lines[0].s;
    for (size_t k = 1; k < lines.size(); ++k) rv += "\n" + (lines[k].s.empty() ? "" : ind + lines[k].s);
  }
  if (truthy(p[1])) rv = ind + rv;
  return like(v, rv);
}

Value f_items(Interp&, Value& v, CallArgs& a) {
  bind("items", a, {});
  if (v.is_undefined()) return Value::generator({}, "do_items");
  if (v.kind != Kind::dict) fail("Can only get item pairs from a mapping.");
  ValueList out;
  for (const auto& kv : v.dict->items) out.push_back(Value::make_list({kv.first, kv.second}, Seq::tuple));
  return Value::generator(std::move(out), "do_items");
}

Value f_join(Interp&, Value& v, CallArgs& a) {
  const auto p = bind("join", a, {"d", "attribute"}, {Value::string(""), Value::none()});
  const std::string sep = to_str(p[0]);
  std::string out;
  const ValueList items = iterate(v);
  for (size_t k = 0; k < items.size(); ++k) {
    if (k) out += sep;
    out += to_str(p[1].kind == Kind::none ? items[k] : attr_path(items[k], p[1]));
  }
  return Value::string(out);
}

Value f_list(Interp&, Value& v, CallArgs& a) { bind("list", a, {}); return Value::make_list(iterate(v)); }

Value f_map(Interp& in, Value& v, CallArgs& a) {
  ValueList out;
  if (!truthy(v)) return Value::generator(std::move(out), "do_map");  // `if value:` comes first
  const ValueList items = iterate(v);
  auto attr = std::find_if(a.kw.begin(), a.kw.end(), [](const auto& kw) { return kw.first == "attribute"; });
  if (a.pos.empty() && attr != a.kw.end()) {
    Value dflt = Value::none();
    for (const auto& kw : a.kw) {
      if (kw.first == "default") dflt = kw.second;
      else if (kw.first != "attribute") fail("Unexpected keyword argument " + py_repr_str(kw.first));
    }
    for (const auto& x : items) out.push_back(attr_path(x, attr->second, &dflt));
    return Value::generator(std::move(out), "do_map");
  }
  if (a.pos.empty()) fail("map requires a filter argument");
  const std::string name = to_str(a.pos[0]);
  if (!is_known_filter(name)) fail("No filter named '" + name + "'.");
  CallArgs rest{ValueList(a.pos.begin() + 1, a.pos.end()), a.kw};
  for (const auto& x : items) {
    Value item = x;
    CallArgs args = rest;
    out.push_back(apply_filter(in, name, std::move(item), args));
  }
  return Value::generator(std::move(out), "do_map");
}

Value min_max(Interp&, Value& v, CallArgs& a, bool want_max, const char* fn) {
  const auto p = bind(fn, a, {"case_sensitive", "attribute"}, {Value::boolean(false), Value::none()});
  const ValueList items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  auto key = [&](const Value& x) {
    const Value k = p[1].kind == Kind::none ? x : attr_path(x, p[1]);
    return truthy(p[0]) ? k : lower_if_str(k);
  };
  size_t best = 0;
  Value best_key = key(items[0]);
  for (size_t k = 1; k < items.size(); ++k) {
    Value kk = key(items[k]);
    if (want_max ? py_less(best_key, kk) : py_less(kk, best_key)) best = k, best_key = std::move(kk);
  }
  return items[best];
}
Value f_max(Interp& in, Value& v, CallArgs& a) { return min_max(in, v, a, true, "max"); }
Value f_min(Interp& in, Value& v, CallArgs& a) { return min_max(in, v, a, false, "min"); }

// select/reject/selectattr/rejectattr: `if value:` then a test (or truthiness) per item.
Value select_reject(Interp& in, Value& v, CallArgs& a, bool keep_if, bool by_attr) {
  ValueList out;
  if (!truthy(v)) return Value::generator(std::move(out), "select_or_reject");
  size_t off = 0;
  Value attribute;
  if (by_attr) {
    if (a.pos.empty()) fail("Missing parameter for attribute name");
    attribute = a.pos[0];
    off = 1;
  }
  std::string test;
  CallArgs test_args;
  if (a.pos.size() > off) {
    test = to_str(a.pos[off]);
    if (!is_known_test(test)) fail("No test named '" + test + "'.");
    test_args.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(off) + 1, a.pos.end());
    test_args.kw = a.kw;
  }
  for (const auto& x : iterate(v)) {
    const Value subject = by_attr ? attr_path(x, attribute) : x;
    CallArgs args = test_args;
    const bool ok = test.empty() ? truthy(subject) : apply_test(in, test, subject, args);
    if (ok == keep_if) out.push_back(x);
  }
  return Value::generator(std::move(out), "select_or_reject");
}
Value f_select(Interp& in, Value& v, CallArgs& a) { return select_reject(in, v, a, true, false); }
Value f_reject(Interp& in, Value& v, CallArgs& a) { return select_reject(in, v, a, false, false); }
Value f_selectattr(Interp& in, Value& v, CallArgs& a) { return select_reject(in, v, a, true, true); }
Value f_rejectattr(Interp& in, Value& v, CallArgs& a) { return select_reject(in, v, a, false, true); }

Value f_replace(Interp&, Value& v, CallArgs& a) {
  const auto p = bind("replace", a, {"old", "new", "count"}, {Value::none()});
  return Value::string(py_replace(to_str(v), to_str(p[0]), to_str(p[1]), p[2].kind == Kind::none ? -1 : int_arg(p[2], "count")));
}

Value f_reverse(Interp&, Value& v, CallArgs& a) {
  bind("reverse", a, {});
  if (v.kind == Kind::string) {
    U32 u = to_u32(v.s);
    std::reverse(u.begin(), u.end());
    return like(v, to_utf8(u));
  }
  // reversed(value) where Python has it; a generator falls back to a reversed list.
  const bool reversible = v.kind == Kind::dict || (v.kind == Kind::list && !v.is_seq(Seq::generator));
  ValueList items = iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::make_list(std::move(items), reversible ? Seq::reversed : Seq::list);
}

Value f_round(Interp&, Value& v, CallArgs& a) {
  const auto p = bind("round", a, {"precision", "method"}, {Value::integer(0), Value::string("common")});
  const std::string method = to_str(p[1]);
  if (method != "common" && method != "ceil" && method != "floor") fail("method must be common, ceil or floor");
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_number()) fail("type " + type_name(v) + " doesn't define __round__ method");
  const int64_t precision = int_arg(p[0], "precision");
  if (method == "common") {
    if (v.is_int() && precision >= 0) return Value::integer(v.as_int());
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(std::clamp<int64_t>(precision, 0, 300)), v.as_double());
    double r = std::strtod(buf, nullptr);
    if (precision < 0) {
      const double scale = std::pow(10.0, static_cast<double>(-precision));
      r = std::nearbyint(v.as_double() / scale) * scale;
    }
    return Value::floating(r);
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = v.as_double() * scale;
  return Value::floating((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

Value f_safe(Interp&, Value& v, CallArgs& a) {
  bind("safe", a, {});
  Value out = Value::string(to_str(v));
  out.markup = true;
  return out;
}
Value f_string(Interp&, Value& v, CallArgs& a) {
  bind("string", a, {});
  return v.kind == Kind::string ? v : Value::string(to_str(v));
}

Value f_sort(Interp&, Value& v, CallArgs& a) {
  const auto p = bind("sort", a, {"reverse", "case_sensitive", "attribute"}, {Value::boolean(false), Value::boolean(false), Value::none()});
  ValueList items = iterate(v);
  const bool cs = truthy(p[1]);
  py_sort(items, [&](const Value& x) {
    const Value k = p[2].kind == Kind::none ? x : attr_path(x, p[2]);
    return cs ? k : lower_if_str(k);
  }, truthy(p[0]));
  return Value::make_list(std::move(items));
}

Value f_sum(Interp&, Value& v, CallArgs& a) {
  const auto p = bind("sum", a, {"attribute", "start"}, {Value::none(), Value::integer(0)});
  Value total = p[1];
  for (const auto& x : iterate(v)) total = binary_op("+", total, p[0].kind == Kind::none ? x : attr_path(x, p[0]));
  return total;
}

// transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
Value f_tojson(Interp&, Value& v, CallArgs& a) {
  const auto p = bind("tojson", a, {"ensure_ascii", "indent", "separators", "sort_keys"},
                      {Value::boolean(false), Value::none(), Value::none(), Value::boolean(false)});
  JsonStyle st;
  st.ensure_ascii = truthy(p[0]);
  if (p[1].kind != Kind::none) {
    st.indented = true;
    st.indent = p[1].kind == Kind::string ? p[1].s : std::string(static_cast<size_t>(std::max<int64_t>(0, int_arg(p[1], "indent"))), ' ');
    st.item_sep = ",";
  }
  if (p[2].kind != Kind::none) {
    const ValueList seps = iterate(p[2]);
    if (seps.size() != 2) fail(fmt::format("too many values to unpack (expected 2)"));
    st.item_sep = str_arg(seps[0], "tojson");
    st.key_sep = str_arg(seps[1], "tojson");
  }
  st.sort_keys = truthy(p[3]);
  std::string out;
  to_json(v, st, 0, out);
  return Value::string(out);
}

Value f_trim(Interp&, Value& v, CallArgs& a) {
  const auto p = bind("trim", a, {"chars"}, {Value::none()});
  const std::string chars = p[0].kind == Kind::none ? "" : to_str(p[0]);
  return like(v, py_strip(to_str(v), p[0].kind == Kind::none ? nullptr : &chars, true, true));
}

Value f_unique(Interp&, Value& v, CallArgs& a) {
  const auto p = bind("unique", a, {"case_sensitive", "attribute"}, {Value::boolean(false), Value::none()});
  ValueList out, seen;
  for (const auto& x : iterate(v)) {
    Value k = p[1].kind == Kind::none ? x : attr_path(x, p[1]);
    if (!truthy(p[0])) k = lower_if_str(k);
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return py_equal(s, k); })) continue;
    seen.push_back(std::move(k));
    out.push_back(x);
  }
  return Value::generator(std::move(out), "do_unique");
}

Value f_center(Interp&, Value& v, CallArgs& a) {
  const auto p = bind("center", a, {"width"}, {Value::integer(80)});
  return like(v, pad(to_str(v), int_arg(p[0], "width"), " ", 0));
}

Value f_wordcount(Interp&, Value& v, CallArgs& a) {
  bind("wordcount", a, {});
  int64_t n = 0;
  bool in_word = false;
  const std::string s = to_str(v);
  for (size_t i = 0; i < s.size();) {
    const uint32_t c = decode(s, i);
    const bool w = c == '_' || py_isalpha_cp(c) || py_isnumeric_cp(c);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}

Value f_batch(Interp&, Value& v, CallArgs& a) {
  const auto p = bind("batch", a, {"linecount", "fill_with"}, {Value::none()});
  const int64_t n = int_arg(p[0], "linecount");
  ValueList out, tmp;
  for (const auto& x : iterate(v)) {
    if (static_cast<int64_t>(tmp.size()) == n) out.push_back(Value::make_list(std::move(tmp))), tmp.clear();
    tmp.push_back(x);
  }
  if (!tmp.empty()) {
    if (p[1].kind != Kind::none) while (static_cast<int64_t>(tmp.size()) < n) tmp.push_back(p[1]);
    out.push_back(Value::make_list(std::move(tmp)));
  }
  return Value::generator(std::move(out), "do_batch");
}

Value f_slice(Interp&, Value& v, CallArgs& a) {
  const auto p = bind("slice", a, {"slices", "fill_with"}, {Value::none()});
  const ValueList seq = iterate(v);
  const int64_t slices = int_arg(p[0], "slices");
  if (slices <= 0) fail(slices == 0 ? "integer division or modulo by zero" : "slices must be positive");
  const auto length = static_cast<int64_t>(seq.size());
  const int64_t per = length / slices, extra = length % slices;
  int64_t offset = 0;
  ValueList out;
  for (int64_t k = 0; k < slices; ++k) {
    const int64_t start = offset + k * per;
    if (k < extra) ++offset;
    const int64_t end = offset + (k + 1) * per;
    ValueList tmp(seq.begin() + start, seq.begin() + end);
    if (p[1].kind != Kind::none && k >= extra) tmp.push_back(p[1]);
    out.push_back(Value::make_list(std::move(tmp)));
  }
  return Value::generator(std::move(out), "do_slice");
}

Value f_truncate(Interp&, Value& v, CallArgs& a) {
  const auto p = bind("truncate", a, {"length", "killwords", "end", "leeway"},
                      {Value::integer(255), Value::boolean(false), Value::string("..."), Value::none()});
  const U32 end = to_u32(str_arg(p[2], "truncate"));
  const int64_t length = int_arg(p[0], "length"), leeway = p[3].kind == Kind::none ? 5 : int_arg(p[3], "leeway");
  if (length < static_cast<int64_t>(end.size())) fail(fmt::format("expected length >= {}, got {}", end.size(), length));
  if (leeway < 0) fail(fmt::format("expected leeway >= 0, got {}", leeway));
  if (py_len(v) <= length + leeway) return v;  // do_truncate works on the value itself, not str(value)
  if (v.kind != Kind::string) fail("'" + type_name(v) + "' object has no attribute 'rsplit'");
  const U32 s = to_u32(v.s);
  U32 head = s.substr(0, static_cast<size_t>(length) - end.size());
  if (!truthy(p[1])) {
    const size_t sp = head.rfind(U' ');
    if (sp != U32::npos) head.resize(sp);
  }
  return Value::string(to_utf8(head + end));
}

const std::unordered_map<std::string, FilterFn>& filter_table() {
  static const std::unordered_map<std::string, FilterFn> k = {
      {"abs", f_abs}, {"attr", f_attr}, {"batch", f_batch}, {"slice", f_slice}, {"truncate", f_truncate}, {"capitalize", f_capitalize}, {"center", f_center}, {"count", f_length},
      {"d", f_default}, {"default", f_default}, {"dictsort", f_dictsort}, {"e", f_escape}, {"escape", f_escape},
      {"first", f_first}, {"float", f_float}, {"forceescape", f_forceescape}, {"format", f_format}, {"indent", f_indent},
      {"int", f_int}, {"items", f_items}, {"join", f_join}, {"last", f_last}, {"length", f_length}, {"list", f_list},
      {"lower", f_lower}, {"map", f_map}, {"max", f_max}, {"min", f_min}, {"reject", f_reject},
      {"rejectattr", f_rejectattr}, {"replace", f_replace}, {"reverse", f_reverse}, {"round", f_round},
      {"safe", f_safe}, {"select", f_select}, {"selectattr", f_selectattr}, {"sort", f_sort}, {"string", f_string},
      {"sum", f_sum}, {"title", f_title}, {"tojson", f_tojson}, {"trim", f_trim}, {"unique", f_unique},
      {"upper", f_upper}, {"wordcount", f_wordcount}};
  return k;
}

bool is_known_filter(std::string_view name) { return filter_table().count(std::string(name)) > 0; }

Value apply_filter(Interp& in, const std::string& name, Value v, CallArgs& args) {
  return filter_table().at(name)(in, v, args);
}

// ---------------------------------------------------------------------------------------------
// Tests (jinja2.tests)

bool apply_test(Interp&, const std::string& name, const Value& v, CallArgs& a) {
  auto one = [&](const char* param) { return bind(name, a, {param})[0]; };
  if (name == "defined") return bind(name, a, {}), !v.is_undefined();
  if (name == "undefined") return bind(name, a, {}), v.is_undefined();
  if (name == "none") return bind(name, a, {}), v.kind == Kind::none;
  if (name == "boolean") return bind(name, a, {}), v.kind == Kind::boolean;
  if (name == "true") return bind(name, a, {}), v.kind == Kind::boolean && v.b;
  if (name == "false") return bind(name, a, {}), v.kind == Kind::boolean && !v.b;
  if (name == "integer") return bind(name, a, {}), v.kind == Kind::integer;
  if (name == "float") return bind(name, a, {}), v.kind == Kind::floating;
  if (name == "number") return bind(name, a, {}), v.is_number();
  if (name == "string") return bind(name, a, {}), v.kind == Kind::string;
  if (name == "mapping") return bind(name, a, {}), v.kind == Kind::dict;
  if (name == "iterable") {
    bind(name, a, {});
    return v.kind == Kind::undefined || v.kind == Kind::string || v.kind == Kind::list || v.kind == Kind::dict || v.kind == Kind::loop;
  }
  if (name == "sequence") {
    bind(name, a, {});
    return v.kind == Kind::undefined || v.kind == Kind::string || v.is_sequence() || v.is_seq(Seq::range) || v.kind == Kind::dict;
  }
  // Undefined defines __call__ (to raise), so callable() is true for it.
  if (name == "callable") return bind(name, a, {}), v.kind == Kind::function || v.kind == Kind::loop || v.is_undefined();
  if (name == "escaped") return bind(name, a, {}), false;
  if (name == "sameas") {
    const Value o = one("other");
    if (v.kind != o.kind) return false;
    switch (v.kind) {
      case Kind::list: return v.list == o.list && v.seq == o.seq;
      case Kind::dict: return v.dict == o.dict;
      case Kind::floating: return false;
      case Kind::integer: return v.i == o.i && v.i >= -5 && v.i <= 256;  // CPython's cached small ints
      default: return py_equal(v, o);
    }
  }
  if (name == "even" || name == "odd") {
    bind(name, a, {});
    return py_equal(binary_op("%", v, Value::integer(2)), Value::integer(name == "even" ? 0 : 1));
  }
  if (name == "divisibleby") return py_equal(binary_op("%", v, one("num")), Value::integer(0));
  if (name == "in") return contains(one("seq"), v);
  if (name == "lower" || name == "upper") return bind(name, a, {}), py_case_is(to_str(v), name == "upper");
  if (name == "filter") return bind(name, a, {}), v.kind == Kind::string && is_known_filter(v.s);
  if (name == "test") return bind(name, a, {}), v.kind == Kind::string && is_known_test(v.s);
  static const std::map<std::string, std::string> kCompare = {
      {"eq", "=="}, {"equalto", "=="}, {"==", "=="}, {"ne", "!="}, {"!=", "!="}, {"lt", "<"}, {"lessthan", "<"},
      {"<", "<"}, {"le", "<="}, {"<=", "<="}, {"gt", ">"}, {"greaterthan", ">"}, {">", ">"}, {"ge", ">="}, {">=", ">="}};
  const auto it = kCompare.find(name);
  if (it != kCompare.end()) return compare_op(it->second, v, one("other"));
  fail("No test named '" + name + "'.");
}

bool is_known_test(std::string_view name) {
  static const std::set<std::string, std::less<>> k = {
      "defined", "undefined", "none", "boolean", "true", "false", "integer", "float", "number", "string", "mapping",
      "iterable", "sequence", "callable", "escaped", "sameas", "even", "odd", "divisibleby", "in", "lower", "upper",
      "filter", "test", "eq", "equalto", "==", "ne", "!=", "lt", "lessthan", "<", "le", "<=", "gt", "greaterthan",
      ">", "ge", ">="};
  return k.count(name) > 0;
}

// ---------------------------------------------------------------------------------------------
// Globals: jinja2's range/dict/namespace and transformers' raise_exception/strftime_now

Dict dict_from_args(const char* fn, const CallArgs& a) {
  Dict d;
  if (a.pos.size() > 1) fail(fmt::format("{} expected at most 1 argument, got {}", fn, a.pos.size()));
  if (!a.pos.empty()) {
    const Value& src = a.pos[0];
    if (src.kind == Kind::dict) {
      d = *src.dict;
    } else {
      for (const auto& pair : iterate(src)) {
        const ValueList kv = iterate(pair);
        if (kv.size() != 2) fail("dictionary update sequence element has length " + std::to_string(kv.size()) + "; 2 is required");
        d.set(kv[0], kv[1]);
      }
    }
  }
  for (const auto& kw : a.kw) d.set(Value::string(kw.first), kw.second);
  return d;
}

std::string strftime_now(const std::string& format) {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  const time_t now = ts.tv_sec;
  std::tm tm{};
  localtime_r(&now, &tm);
  std::string f;  // datetime.strftime handles %f itself
  for (size_t k = 0; k < format.size(); ++k) {
    if (format[k] == '%' && k + 1 < format.size() && format[k + 1] == 'f') {
      char us[24];
      std::snprintf(us, sizeof us, "%06ld", static_cast<long>(ts.tv_nsec / 1000));
      f += us;
      ++k;
    } else if (format[k] == '%' && k + 1 < format.size() && format[k + 1] == '%') {
      f += "%%";
      ++k;
    } else {
      f.push_back(format[k]);
    }
  }
  if (f.empty()) return "";
  std::vector<char> buf(256 + f.size() * 4);
  while (true) {
    const size_t n = std::strftime(buf.data(), buf.size(), f.c_str(), &tm);
    if (n > 0 || buf.size() > 65536) return std::string(buf.data(), n);
    buf.resize(buf.size() * 4);
  }
}

void add_globals(Scope& g) {
  g.set("range", Value::function("range", [](Interp&, CallArgs& a) {
    if (!a.kw.empty()) fail("range() takes no keyword arguments");
    if (a.pos.empty() || a.pos.size() > 3) fail(fmt::format("range expected at most 3 arguments, got {}", a.pos.size()));
    int64_t start = 0, stop = 0, step = 1;
    if (a.pos.size() == 1) stop = int_arg(a.pos[0], "range");
    else start = int_arg(a.pos[0], "range"), stop = int_arg(a.pos[1], "range");
    if (a.pos.size() == 3) step = int_arg(a.pos[2], "range");
    if (step == 0) fail("range() arg 3 must not be zero");
    return make_range(start, stop, step);
  }));
  g.set("dict", Value::function("dict", [](Interp&, CallArgs& a) { return Value::make_dict(dict_from_args("dict", a)); }));
  g.set("namespace", Value::function("namespace", [](Interp& in, CallArgs& a) {
    Value v;
    v.kind = Kind::ns;
    v.ns = std::make_shared<Namespace>();
    in.track(v.ns);
    v.ns->attrs = dict_from_args("dict", a);
    for (const auto& kv : v.ns->attrs.items) if (kv.first.kind == Kind::string) Interp::check_namespace_name(kv.first.s);
    return v;
  }));
  g.set("raise_exception", Value::function("raise_exception", [](Interp&, CallArgs& a) -> Value {
    fail(to_str(bind("raise_exception", a, {"message"})[0]));
  }));
  g.set("strftime_now", Value::function("strftime_now", [](Interp&, CallArgs& a) {
    return Value::string(strftime_now(str_arg(bind("strftime_now", a, {"format"})[0], "strftime")));
  }));
}

}  // namespace internal

// ---------------------------------------------------------------------------------------------
// Public API

namespace {

// One line: newlines inside the message (a raise_exception text, say) are written as "\n".
Status template_error(const std::string& source, const internal::Error& e) {
  std::string message;
  for (char c : e.message) {
    if (c == '\n') message += "\\n";
    else if (c != '\r') message.push_back(c);
  }
  if (e.line > 0) return make_error(ErrorCode::invalid_argument, "{}:{}: {}", source, e.line, message);
  return make_error(ErrorCode::invalid_argument, "{}: {}", source, message);
}

}  // namespace

Result<Template> Template::parse(std::string_view text, std::string source_name) {
  auto program = std::make_shared<internal::Program>();
  program->source_name = std::move(source_name);
  try {
    internal::Lexer lexer(text);
    internal::Parser parser(lexer.run());
    program->body = parser.parse_template();
    internal::Checker().body(program->body, /*soft=*/false, /*in_loop=*/false);
  } catch (const internal::Error& e) {
    return template_error(program->source_name, e);
  }
  return Template(std::move(program));
}

Result<std::string> Template::render(const nlohmann::ordered_json& context) const {
  if (!context.is_object()) {
    return make_error(ErrorCode::invalid_argument, "{}: the render context must be a JSON object, not {}", program_->source_name,
                      context.type_name());
  }
  try {
    const internal::Value vars = internal::from_json(context);
    internal::Interp interp;
    return interp.render(*program_, vars);
  } catch (const internal::Error& e) {
    return template_error(program_->source_name, e);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, "{}: rendering failed: {}", program_->source_name, e.what());
  }
}

Result<std::string> Template::render(const nlohmann::json& context) const { return render(nlohmann::ordered_json(context)); }

const std::string& Template::source_name() const { return program_->source_name; }

}  // namespace tessera::tokenizer::jinja
