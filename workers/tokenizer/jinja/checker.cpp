// checker.cpp: what jinja2's code generator checks after parsing (parser.hpp: check()).
#include <set>

#include "workers/tokenizer/jinja/internal/parser.hpp"

namespace tessera::jinja::internal {
namespace {

// After parsing, what jinja2's code generator checks: unknown filters and tests outside an `if`
// or conditional expression (a "soft frame") fail at compile time, break/continue need a loop,
// and a macro takes `caller`, extra positional (`varargs`) or keyword (`kwargs`) arguments only
// when its body names them.
class Checker {
 public:
  void body(const Body& b, bool soft, bool in_loop) {
    for (const auto& s : b) stmt(*s, soft, in_loop);
  }

 private:
  [[noreturn]] static void error(std::string m, int line) { throw Error{std::move(m), line}; }

  void stmt(Stmt& s, bool soft, bool in_loop) {
    switch (s.k) {
      case SK::text: case SK::break_: case SK::continue_:
        if (s.k != SK::text && !in_loop) error(fmt::format("'{}' outside loop", s.k == SK::break_ ? "break" : "continue"), s.line);
        return;
      case SK::output: case SK::set: case SK::set_attr: expr(*s.expr, soft); return;
      case SK::if_:
        for (auto& br : s.branches) {
          if (br.first) expr(*br.first, true);
          body(br.second, true, in_loop);
        }
        return;
      case SK::for_:
        expr(*s.expr, soft);
        if (s.cond) expr(*s.cond, false);
        body(s.body, false, true);
        body(s.else_body, false, in_loop);
        return;
      case SK::set_block: case SK::filter_block:
        if (s.expr) expr(*s.expr, false);
        body(s.body, false, in_loop);
        return;
      case SK::macro: case SK::call_block: {
        for (auto& p : s.params) if (p.second) expr(*p.second, false);
        if (s.k == SK::call_block) expr(*s.expr, soft);
        body(s.body, false, false);
        std::set<std::string> names;
        collect(s.body, names);
        for (auto& p : s.params) if (p.second) collect(*p.second, names);
        s.uses_caller = names.count("caller") > 0;
        s.uses_varargs = names.count("varargs") > 0;
        s.uses_kwargs = names.count("kwargs") > 0;
        return;
      }
      case SK::with:
        for (auto& p : s.params) expr(*p.second, soft);
        body(s.body, false, in_loop);
        return;
      case SK::scope: body(s.body, false, false); return;
    }
  }

  void expr(Expr& e, bool soft) {
    if ((e.k == EK::filter || e.k == EK::test) && !e.known && !soft) {
      error(fmt::format("No {} named '{}'.", e.k == EK::filter ? "filter" : "test", e.name), e.line);
    }
    const bool inner_soft = soft || e.k == EK::cond;
    for (Expr* c : {e.a.get(), e.b.get(), e.c.get(), e.dyn_args.get(), e.dyn_kwargs.get()}) if (c) expr(*c, inner_soft);
    for (auto& c : e.items) expr(*c, inner_soft);
    for (auto& kw : e.kwargs) expr(*kw.second, inner_soft);
  }

  static void collect(const Expr& e, std::set<std::string>& names) {
    if (e.k == EK::name) names.insert(e.name);
    for (const Expr* c : {e.a.get(), e.b.get(), e.c.get(), e.dyn_args.get(), e.dyn_kwargs.get()}) if (c) collect(*c, names);
    for (const auto& c : e.items) collect(*c, names);
    for (const auto& kw : e.kwargs) collect(*kw.second, names);
  }
  static void collect(const Body& b, std::set<std::string>& names) {
    for (const auto& s : b) {
      for (const Expr* c : {s->expr.get(), s->cond.get()}) if (c) collect(*c, names);
      for (const auto& br : s->branches) {
        if (br.first) collect(*br.first, names);
        collect(br.second, names);
      }
      for (const auto& p : s->params) if (p.second) collect(*p.second, names);
      if (s->k == SK::set_attr) names.insert(s->text);
      collect(s->body, names);
      collect(s->else_body, names);
    }
  }
};

}  // namespace

void check(Body& body) { Checker().body(body, /*soft=*/false, /*in_loop=*/false); }

}  // namespace tessera::jinja::internal
