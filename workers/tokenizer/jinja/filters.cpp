// filters.cpp: jinja2's filters over sequences and mappings, and the table of every filter.
#include <algorithm>
#include <functional>
#include <unordered_map>

#include "workers/tokenizer/jinja/internal/builtins.hpp"
#include "workers/tokenizer/jinja/internal/filters.hpp"
#include "workers/tokenizer/jinja/internal/interp.hpp"
#include "workers/tokenizer/jinja/internal/ops.hpp"

namespace tessera::jinja::internal {
namespace {

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

Value f_attr(Interp&, Value& v, CallArgs& a) {
  const std::string name = to_str(bind("attr", a, {"name"})[0]);
  if (v.kind == Kind::dict && !is_dict_method(name)) return is_dict_unsafe(name) ? unsafe(v, name) : undefined_member(v, Value::string(name));
  return get_attr(v, name);
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

// sync_do_groupby: the items sorted by the attribute (lower-cased strings unless case_sensitive),
// then itertools.groupby's runs of equal keys. Each group is a _GroupTuple(grouper, list), a
// namedtuple that prints as a plain tuple; without case_sensitive its grouper is the first item's
// own value rather than the lower-cased key.
Value f_groupby(Interp&, Value& v, CallArgs& a) {
  const auto p = bind("groupby", a, {"attribute", "default", "case_sensitive"}, {Value::none(), Value::boolean(false)});
  const bool cs = truthy(p[2]);
  auto value_of = [&](const Value& x) { return p[0].kind == Kind::none ? x : attr_path(x, p[0], &p[1]); };
  auto key = [&](const Value& x) { return cs ? value_of(x) : lower_if_str(value_of(x)); };
  ValueList items = iterate(v);
  py_sort(items, key, /*reverse=*/false);
  ValueList out;
  for (size_t k = 0; k < items.size();) {
    const Value group_key = key(items[k]);
    ValueList group{items[k]};
    for (++k; k < items.size() && py_equal(group_key, key(items[k])); ++k) group.push_back(items[k]);
    Value grouper = cs ? group_key : value_of(group.front());
    Value tuple = Value::make_list({std::move(grouper), Value::make_list(std::move(group))}, Seq::tuple);
    tuple.s = kGroupTuple;
    out.push_back(std::move(tuple));
  }
  return Value::make_list(std::move(out));
}

const std::unordered_map<std::string, FilterFn>& filter_table() {
  static const std::unordered_map<std::string, FilterFn> k = {
      {"abs", f_abs}, {"attr", f_attr}, {"batch", f_batch}, {"slice", f_slice}, {"truncate", f_truncate}, {"capitalize", f_capitalize}, {"center", f_center}, {"count", f_length},
      {"d", f_default}, {"default", f_default}, {"dictsort", f_dictsort}, {"e", f_escape}, {"escape", f_escape},
      {"first", f_first}, {"float", f_float}, {"forceescape", f_forceescape}, {"format", f_format}, {"groupby", f_groupby}, {"indent", f_indent},
      {"int", f_int}, {"items", f_items}, {"join", f_join}, {"last", f_last}, {"length", f_length}, {"list", f_list},
      {"lower", f_lower}, {"map", f_map}, {"max", f_max}, {"min", f_min}, {"reject", f_reject},
      {"rejectattr", f_rejectattr}, {"replace", f_replace}, {"reverse", f_reverse}, {"round", f_round},
      {"safe", f_safe}, {"select", f_select}, {"selectattr", f_selectattr}, {"sort", f_sort}, {"string", f_string},
      {"sum", f_sum}, {"title", f_title}, {"tojson", f_tojson}, {"trim", f_trim}, {"unique", f_unique},
      {"upper", f_upper}, {"wordcount", f_wordcount}, {"wordwrap", f_wordwrap}};
  return k;
}

}  // namespace

bool is_known_filter(std::string_view name) { return filter_table().count(std::string(name)) > 0; }

Value apply_filter(Interp& in, const std::string& name, Value v, CallArgs& args) {
  return filter_table().at(name)(in, v, args);
}

}  // namespace tessera::jinja::internal
