// internal/value.hpp: a Python value as a template sees it (Value, Dict, the callables), the
// interpreter's error type, and the operations every part needs: str(), repr(), truthiness, ==,
// iteration, len() (value.cpp), and JSON in and out (json.cpp).
//
// Errors inside the interpreter are C++ exceptions of type `Error` (message + line); they never
// leave the component: Template::parse/render (template.cpp) turn them into a Status.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera::jinja::internal {

struct Error {
  std::string message;
  int line = 0;  // 0 until the innermost node that knows its line attaches it
};

[[noreturn]] inline void fail(std::string message) { throw Error{std::move(message), 0}; }

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
  std::string s;  // the string; for undefined, the error its misuse raises; for a generator, the function that
                  // made it; for a range, its repr; for a tuple, the namedtuple class it is (kGroupTuple) or ""
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

// range(start, stop, step), which prints as Python shows it.
Value make_range(int64_t start, int64_t stop, int64_t step);

// type(x).__name__ as Python error messages show it.
std::string type_name(const Value& v);

// jinja2.utils.object_type_repr, used in undefined messages.
std::string object_type_repr(const Value& v);

// The namedtuple groupby yields, (grouper, list): a tuple whose fields are also attributes.
constexpr const char* kGroupTuple = "_GroupTuple";

[[noreturn]] void fail_undefined(const Value& v);
bool truthy(const Value& v);
std::string to_str(const Value& v);  // str(x)
std::string repr(const Value& v);    // repr(x)

// The items `for` walks (Python iter()): list/tuple elements, dict keys, string characters.
ValueList iterate(const Value& v);
int64_t py_len(const Value& v);

// --- JSON in and out (json.cpp)

Value from_json(const nlohmann::ordered_json& j);

// json.dumps options (transformers' tojson filter passes all of them through).
struct JsonStyle {
  bool ensure_ascii = false;
  bool indented = false;
  std::string indent;
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool sort_keys = false;
};

void to_json(const Value& v, const JsonStyle& st, int level, std::string& out);

}  // namespace tessera::jinja::internal
