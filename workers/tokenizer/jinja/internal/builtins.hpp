// internal/builtins.hpp: the built-in library a template calls into, and the helpers its files
// share: argument binding and Python's int()/float()/% (builtins.cpp), str methods and the str
// operations filters reuse (methods_str.cpp), the sandbox's attribute and item access with the
// dict/list methods (methods.cpp), filters (filters.cpp, filters_text.cpp), tests (tests.cpp) and
// globals (globals.cpp).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "workers/tokenizer/jinja/internal/value.hpp"

namespace tessera::jinja::internal {

class Interp;
struct Scope;

// --- builtins.cpp

// Binds positional and keyword arguments to `names` like a Python signature; parameters without
// a value take `defaults`, which cover the last defaults.size() names.
std::vector<Value> bind(std::string_view fn, const CallArgs& a, std::initializer_list<const char*> names,
                        std::vector<Value> defaults = {});
int64_t int_arg(const Value& v, std::string_view what);
std::string str_arg(const Value& v, std::string_view fn);

// Python int(str): optional whitespace and sign, digits with single underscores.
bool parse_py_int(std::string_view s, int base, int64_t& out);
bool parse_py_float(std::string_view s, double& out);  // Python float(str)

// printf-style `fmt % args` for %s %r %d %i %f %e %g %x %o %c %% with flags, width, precision.
std::string percent_format(const std::string& f, const Value& args);

// --- methods_str.cpp

// Splits `s` like str.split/str.rsplit; `sep` null splits on runs of whitespace.
ValueList py_split(const std::string& s, const std::string* sep, int64_t maxsplit, bool from_right);
std::string py_replace(const std::string& s, const std::string& old, const std::string& repl, int64_t count);
ValueList splitlines(const std::string& s, bool keepends);  // str.splitlines
// Resolves Python's optional [start[, end]] arguments (a.pos[first], a.pos[first + 1]) against a length.
std::pair<size_t, size_t> span_args(const CallArgs& a, size_t first, size_t len);
bool py_isalpha_cp(uint32_t c);
bool py_isnumeric_cp(uint32_t c);
// str.islower/isupper: at least one cased character, and no cased character of the other case.
bool py_case_is(const std::string& s, bool upper);
std::string pad(const std::string& s, int64_t width, const std::string& fill, int mode);  // mode: -1 ljust, 0 center, 1 rjust

// self.<m>(a) for a str (or Markup) `self`; `m` is one of str_methods().
Value str_method(const Value& self, const std::string& m, CallArgs& a);
const std::set<std::string>& str_methods();

// --- methods.cpp

// environment.getattr(obj, name) of the sandbox: a Python attribute first, then obj[name].
Value get_attr(const Value& obj, const std::string& name);
// environment.getitem(obj, key) of the sandbox: obj[key] first, then a Python attribute.
Value get_item(const Value& obj, const Value& key);
// The undefined value the sandbox gives for a blocked attribute.
Value unsafe(const Value& obj, const std::string& name);
bool is_dict_method(const std::string& n);
bool is_dict_unsafe(const std::string& n);

// --- filters.cpp, tests.cpp, globals.cpp

bool is_known_filter(std::string_view name);
Value apply_filter(Interp& in, const std::string& name, Value v, CallArgs& args);
bool is_known_test(std::string_view name);
bool apply_test(Interp& in, const std::string& name, const Value& v, CallArgs& args);
void add_globals(Scope& globals);

}  // namespace tessera::jinja::internal
