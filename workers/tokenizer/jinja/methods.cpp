// methods.cpp: attribute and item access as the sandbox does it (environment.getattr/getitem),
// the dict and list methods it allows, and loop.* attributes. What is not safe is "unsafe".
#include "workers/tokenizer/jinja/internal/builtins.hpp"
#include "workers/tokenizer/jinja/internal/interp.hpp"
#include "workers/tokenizer/jinja/internal/text.hpp"

namespace tessera::jinja::internal {
namespace {

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

}  // namespace

Value unsafe(const Value& obj, const std::string& name) {
  return Value::undefined("access to attribute " + py_repr_str(name) + " of " + py_repr_str(type_name(obj)) + " object is unsafe.");
}

bool is_dict_method(const std::string& n) { return n == "items" || n == "keys" || n == "values" || n == "get" || n == "copy"; }
bool is_dict_unsafe(const std::string& n) {
  return n == "pop" || n == "popitem" || n == "setdefault" || n == "update" || n == "clear" || n == "fromkeys";
}

namespace {

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

}  // namespace

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
      if (obj.is_seq(Seq::tuple) && obj.s == kGroupTuple && (name == "grouper" || name == "list")) {
        return (*obj.list)[name == "grouper" ? 0 : 1];
      }
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

}  // namespace tessera::jinja::internal
