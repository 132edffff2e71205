// internal/filters.hpp: what the filter files share: a filter's signature, like(), the string and
// number filters of filters_text.cpp that filters.cpp's table lists, and Python's textwrap.wrap
// (textwrap.cpp) behind the wordwrap filter.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "workers/tokenizer/jinja/internal/text.hpp"
#include "workers/tokenizer/jinja/internal/value.hpp"

namespace tessera::jinja::internal {

class Interp;

using FilterFn = Value (*)(Interp&, Value&, CallArgs&);

// A filter result computed from soft_str(v): Markup stays Markup.
Value like(const Value& v, std::string s);

// --- filters_text.cpp: strings and numbers
Value f_abs(Interp&, Value& v, CallArgs& a);
Value f_capitalize(Interp&, Value& v, CallArgs& a);
Value f_center(Interp&, Value& v, CallArgs& a);
Value f_escape(Interp&, Value& v, CallArgs& a);
Value f_float(Interp&, Value& v, CallArgs& a);
Value f_forceescape(Interp&, Value& v, CallArgs& a);
Value f_format(Interp&, Value& v, CallArgs& a);
Value f_indent(Interp&, Value& v, CallArgs& a);
Value f_int(Interp&, Value& v, CallArgs& a);
Value f_lower(Interp&, Value& v, CallArgs& a);
Value f_replace(Interp&, Value& v, CallArgs& a);
Value f_round(Interp&, Value& v, CallArgs& a);
Value f_safe(Interp&, Value& v, CallArgs& a);
Value f_string(Interp&, Value& v, CallArgs& a);
Value f_title(Interp&, Value& v, CallArgs& a);
Value f_tojson(Interp&, Value& v, CallArgs& a);
Value f_trim(Interp&, Value& v, CallArgs& a);
Value f_truncate(Interp&, Value& v, CallArgs& a);
Value f_upper(Interp&, Value& v, CallArgs& a);
Value f_wordcount(Interp&, Value& v, CallArgs& a);
Value f_wordwrap(Interp&, Value& v, CallArgs& a);

// --- textwrap.cpp

// textwrap.TextWrapper's options as jinja2's wordwrap sets them (expand_tabs, replace_whitespace
// off; drop_whitespace on; no indents, no max_lines).
struct WrapOptions {
  int64_t width = 70;            // REQUIRES: > 0
  bool break_long_words = true;
  bool break_on_hyphens = true;  // truthiness: may a long word be broken after a hyphen
  bool split_on_hyphens = true;  // `break_on_hyphens is True`: chunks split after hyphens
};

// textwrap.wrap(text, ...): the lines of `text`, each at most `width` code points where the
// options allow.
std::vector<std::string> text_wrap(std::string_view text, const WrapOptions& options);

}  // namespace tessera::jinja::internal
