// filters_text.cpp: jinja2's filters over strings and numbers, plus transformers' tojson.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "workers/tokenizer/jinja/internal/builtins.hpp"
#include "workers/tokenizer/jinja/internal/filters.hpp"
#include "workers/tokenizer/jinja/internal/ops.hpp"

namespace tessera::jinja::internal {

// A filter result computed from soft_str(v): Markup stays Markup.
Value like(const Value& v, std::string s) {
  Value out = Value::string(std::move(s));
  out.markup = v.kind == Kind::string && v.markup;
  return out;
}

Value f_abs(Interp&, Value& v, CallArgs& a) {
  bind("abs", a, {});
  if (v.is_undefined()) fail_undefined(v);
  if (v.kind == Kind::floating) return Value::floating(std::fabs(v.f));
  if (v.is_int()) return Value::integer(std::llabs(v.as_int()));
  fail("bad operand type for abs(): '" + type_name(v) + "'");
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

Value f_replace(Interp&, Value& v, CallArgs& a) {
  const auto p = bind("replace", a, {"old", "new", "count"}, {Value::none()});
  return Value::string(py_replace(to_str(v), to_str(p[0]), to_str(p[1]), p[2].kind == Kind::none ? -1 : int_arg(p[2], "count")));
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

// do_wordwrap: each line of s.splitlines() is a paragraph wrapped by textwrap.wrap (textwrap.cpp);
// the wrapped lines, and then the paragraphs, are joined by `wrapstring` (the environment's
// newline_sequence by default). A Markup wrapstring escapes what it joins, as Markup.join does.
Value f_wordwrap(Interp&, Value& v, CallArgs& a) {
  const auto p = bind("wordwrap", a, {"width", "break_long_words", "wrapstring", "break_on_hyphens"},
                      {Value::integer(79), Value::boolean(true), Value::none(), Value::boolean(true)});
  const Value wrapstring = p[2].kind == Kind::none ? Value::string("\n") : p[2];
  if (wrapstring.is_undefined()) fail_undefined(wrapstring);
  if (wrapstring.kind != Kind::string) fail("'" + type_name(wrapstring) + "' object has no attribute 'join'");
  if (v.is_undefined()) fail_undefined(v);
  if (v.kind != Kind::string) fail("'" + type_name(v) + "' object has no attribute 'splitlines'");
  WrapOptions options;
  options.width = int_arg(p[0], "width");
  options.break_long_words = truthy(p[1]);
  options.break_on_hyphens = truthy(p[3]);
  options.split_on_hyphens = p[3].kind == Kind::boolean && p[3].b;
  const ValueList paragraphs = splitlines(v.s, /*keepends=*/false);
  std::string out;
  for (size_t k = 0; k < paragraphs.size(); ++k) {
    if (k) out += wrapstring.s;
    if (options.width <= 0) fail("invalid width " + repr(p[0]) + " (must be > 0)");
    const std::vector<std::string> lines = text_wrap(paragraphs[k].s, options);
    for (size_t j = 0; j < lines.size(); ++j) {
      if (j) out += wrapstring.s;
      out += wrapstring.markup ? html_escape(lines[j]) : lines[j];
    }
  }
  return like(wrapstring, out);
}

}  // namespace tessera::jinja::internal
