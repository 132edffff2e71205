// internal/ast.hpp: the syntax tree the parser builds and the interpreter walks, and Program, the
// parsed form a Template shares between its copies.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "workers/tokenizer/jinja/internal/value.hpp"

namespace tessera::jinja::internal {

enum class EK : uint8_t {
  literal, name, getattr, getitem, slice, call, filter, test, neg, pos, binop, concat, compare, and_, or_, not_,
  cond, list, tuple, dict
};

struct Expr;
using ExprP = std::unique_ptr<Expr>;

struct Expr {
  EK k = EK::literal;
  int line = 1;
  Value value;       // literal
  std::string name;  // variable, attribute, filter or test name, binary operator
  ExprP a, b, c;     // operands; slice: start/stop/step; cond: a if b else c
  std::vector<ExprP> items;  // call/filter/test args, list/tuple items, dict key,value,..., concat parts, compare operands
  std::vector<std::string> ops;  // compare operators, one per items[k]
  std::vector<std::pair<std::string, ExprP>> kwargs;
  ExprP dyn_args, dyn_kwargs;
  bool known = true;  // filter/test exists (an unknown one only fails when reached, in soft frames)
};

enum class SK : uint8_t {
  text, output, if_, for_, set, set_attr, set_block, macro, call_block, filter_block, with, break_, continue_, scope
};

struct Stmt;
using StmtP = std::unique_ptr<Stmt>;
using Body = std::vector<StmtP>;

struct Target {
  std::vector<std::string> names;
  bool tuple = false;
};

struct Stmt {
  SK k = SK::text;
  int line = 1;
  std::string text;  // text; set_attr: the namespace variable; macro: its name
  std::string attr;  // set_attr: the attribute
  ExprP expr;        // output/set value, for iterable, call of a call block, filter chain of a filter block
  ExprP cond;        // for ... if cond
  Target target;
  std::vector<std::pair<ExprP, Body>> branches;  // if/elif/else (else: null condition)
  Body body, else_body;
  std::vector<std::pair<std::string, ExprP>> params;  // macro/caller parameters with defaults; with assignments
  bool uses_caller = false, uses_varargs = false, uses_kwargs = false;
};

// The name a filter block or filtered set block binds its rendered body to.
constexpr const char* kBlockValue = "\x01block";

struct Program {
  std::string source_name;
  Body body;
};

}  // namespace tessera::jinja::internal
