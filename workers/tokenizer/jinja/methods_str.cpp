// methods_str.cpp: the methods of str the sandbox allows (Markup's overrides included), and the
// Python str operations filters share with them.
#include <utf8proc.h>

#include <algorithm>

#include "workers/tokenizer/jinja/internal/builtins.hpp"
#include "workers/tokenizer/jinja/internal/ops.hpp"
#include "workers/tokenizer/jinja/internal/text.hpp"

namespace tessera::jinja::internal {
namespace {

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

Value str_format(const std::string& f, const CallArgs& a);

Value str_method_plain(const Value& self, const std::string& m, CallArgs& a);

}  // namespace

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

namespace {

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

}  // namespace

const std::set<std::string>& str_methods() {
  static const std::set<std::string> k = {
      "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith", "endswith", "upper", "lower",
      "casefold", "title", "capitalize", "swapcase", "replace", "find", "rfind", "index", "rindex", "count", "join",
      "isdigit", "isdecimal", "isnumeric", "isalpha", "isalnum", "isspace", "isupper", "islower", "zfill", "ljust",
      "rjust", "center", "partition", "rpartition", "removeprefix", "removesuffix", "format"};
  return k;
}

}  // namespace tessera::jinja::internal
