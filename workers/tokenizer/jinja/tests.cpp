// tests.cpp: jinja2's tests (`x is defined`, `x is divisibleby 3`, ...).
#include <map>
#include <set>

#include "workers/tokenizer/jinja/internal/builtins.hpp"
#include "workers/tokenizer/jinja/internal/ops.hpp"

namespace tessera::jinja::internal {

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

}  // namespace tessera::jinja::internal
