// operators.cpp: Python's operators as jinja2 compiles them (ops.hpp).
#include "workers/tokenizer/jinja/internal/ops.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "workers/tokenizer/jinja/internal/builtins.hpp"
#include "workers/tokenizer/jinja/internal/text.hpp"

namespace tessera::jinja::internal {
namespace {

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

}  // namespace

int64_t sub64(int64_t a, int64_t b) {
  int64_t r = 0;
  const bool overflowed = __builtin_sub_overflow(a, b, &r);
  return checked(overflowed, r);
}

// markupsafe.escape(v) for a string argument of a Markup operation (other values pass).
Value escape_arg(const Value& v) {
  if (v.kind != Kind::string || v.markup) return v;
  Value out = Value::string(html_escape(v.s));
  out.markup = true;
  return out;
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
bool py_less(const Value& a, const Value& b, std::string_view op) {
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

}  // namespace tessera::jinja::internal
