// value.cpp: the Value constructors that need complete types, and str(), repr(), ==, truthiness,
// iteration and len() with Python's semantics.
#include "workers/tokenizer/jinja/internal/value.hpp"

#include "workers/tokenizer/jinja/internal/text.hpp"

namespace tessera::jinja::internal {

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

}  // namespace tessera::jinja::internal
