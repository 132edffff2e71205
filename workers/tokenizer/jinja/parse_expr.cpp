// parse_expr.cpp: the expression half of jinja2.parser.Parser (parser.hpp), same grammar and
// precedence.
#include "workers/tokenizer/jinja/internal/builtins.hpp"
#include "workers/tokenizer/jinja/internal/parser.hpp"

namespace tessera::jinja::internal {

// --- expressions (highest call first: tuple > condexpr > or > and > not > compare > math1 >
// concat > math2 > pow > unary > primary/postfix/filter)

ExprP Parser::parse_tuple(bool simplified, bool with_condexpr, const std::vector<std::string>& extra_end, bool explicit_parens) {
  const int line = cur().line;
  std::vector<ExprP> args;
  bool is_tuple = false;
  while (true) {
    if (!args.empty()) expect_op(",");
    if (is_end(extra_end)) break;
    args.push_back(simplified ? parse_primary() : parse_expression(with_condexpr));
    if (at_op(",")) is_tuple = true;
    else break;
  }
  if (!is_tuple) {
    if (!args.empty()) return std::move(args[0]);
    if (!explicit_parens) error(fmt::format("Expected an expression, got {}", describe(cur())), cur().line);
  }
  auto e = node(EK::tuple, line);
  e->items = std::move(args);
  return e;
}

ExprP Parser::parse_condexpr() {
  const int line = cur().line;
  ExprP expr1 = parse_or();
  while (skip_name("if")) {
    auto e = node(EK::cond, line);
    e->b = parse_or();
    if (skip_name("else")) e->c = parse_condexpr();
    e->a = std::move(expr1);
    expr1 = std::move(e);
  }
  return expr1;
}

ExprP Parser::parse_or() {
  ExprP left = parse_and();
  while (at_name("or")) {
    auto e = node(EK::or_, take().line);
    e->a = std::move(left);
    e->b = parse_and();
    left = std::move(e);
  }
  return left;
}

ExprP Parser::parse_and() {
  ExprP left = parse_not();
  while (at_name("and")) {
    auto e = node(EK::and_, take().line);
    e->a = std::move(left);
    e->b = parse_not();
    left = std::move(e);
  }
  return left;
}

ExprP Parser::parse_not() {
  const Nest nest(nesting_, cur().line);
  if (at_name("not")) {
    auto e = node(EK::not_, take().line);
    e->a = parse_not();
    return e;
  }
  return parse_compare();
}

ExprP Parser::parse_compare() {
  const int line = cur().line;
  ExprP expr = parse_math1();
  auto e = node(EK::compare, line);
  while (true) {
    std::string op;
    if (cur().type == Tok::op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
                                  cur().text == ">" || cur().text == ">=")) {
      op = take().text;
    } else if (skip_name("in")) {
      op = "in";
    } else if (at_name("not") && look().type == Tok::name && look().text == "in") {
      take();
      take();
      op = "notin";
    } else {
      break;
    }
    e->ops.push_back(op);
    e->items.push_back(parse_math1());
  }
  if (e->ops.empty()) return expr;
  e->a = std::move(expr);
  return e;
}

ExprP Parser::binop(std::string op, ExprP l, ExprP r, int line) {
  auto e = node(EK::binop, line);
  e->name = std::move(op);
  e->a = std::move(l);
  e->b = std::move(r);
  return e;
}

ExprP Parser::parse_math1() {
  ExprP left = parse_concat();
  while (at_op("+") || at_op("-")) {
    const Token t = take();
    left = binop(t.text, std::move(left), parse_concat(), t.line);
  }
  return left;
}

ExprP Parser::parse_concat() {
  const int line = cur().line;
  ExprP first = parse_math2();
  if (!at_op("~")) return first;
  auto e = node(EK::concat, line);
  e->items.push_back(std::move(first));
  while (skip_op("~")) e->items.push_back(parse_math2());
  return e;
}

ExprP Parser::parse_math2() {
  ExprP left = parse_pow();
  while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
    const Token t = take();
    left = binop(t.text, std::move(left), parse_pow(), t.line);
  }
  return left;
}

ExprP Parser::parse_pow() {
  ExprP left = parse_unary(true);
  while (at_op("**")) {
    const Token t = take();
    left = binop("**", std::move(left), parse_unary(true), t.line);
  }
  return left;
}

ExprP Parser::parse_unary(bool with_filter) {
  const Nest nest(nesting_, cur().line);
  ExprP e;
  if (at_op("-") || at_op("+")) {
    const Token t = take();
    e = node(t.text == "-" ? EK::neg : EK::pos, t.line);
    e->a = parse_unary(false);
  } else {
    e = parse_primary();
  }
  e = parse_postfix(std::move(e));
  if (with_filter) e = parse_filter_expr(std::move(e));
  return e;
}

ExprP Parser::parse_primary() {
  const Token& t = cur();
  ExprP e;
  if (t.type == Tok::name) {
    e = node(EK::literal, t.line);
    if (t.text == "true" || t.text == "True") e->value = Value::boolean(true);
    else if (t.text == "false" || t.text == "False") e->value = Value::boolean(false);
    else if (t.text == "none" || t.text == "None") e->value = Value::none();
    else e->k = EK::name, e->name = t.text;
    take();
  } else if (t.type == Tok::string) {
    e = node(EK::literal, t.line);
    std::string s;
    while (cur().type == Tok::string) s += take().text;  // adjacent literals concatenate
    e->value = Value::string(std::move(s));
  } else if (t.type == Tok::integer) {
    e = node(EK::literal, t.line);
    e->value = Value::integer(take().ival);
  } else if (t.type == Tok::floating) {
    e = node(EK::literal, t.line);
    e->value = Value::floating(take().fval);
  } else if (at_op("(")) {
    take();
    e = parse_tuple(/*simplified=*/false, /*with_condexpr=*/true, {}, /*explicit_parens=*/true);
    expect_op(")");
  } else if (at_op("[")) {
    e = node(EK::list, take().line);
    while (!at_op("]")) {
      if (!e->items.empty()) expect_op(",");
      if (at_op("]")) break;
      e->items.push_back(parse_expression(/*with_condexpr=*/true));
    }
    expect_op("]");
  } else if (at_op("{")) {
    e = node(EK::dict, take().line);
    while (!at_op("}")) {
      if (!e->items.empty()) expect_op(",");
      if (at_op("}")) break;
      e->items.push_back(parse_expression(/*with_condexpr=*/true));
      expect_op(":");
      e->items.push_back(parse_expression(/*with_condexpr=*/true));
    }
    expect_op("}");
  } else {
    error(fmt::format("unexpected {}", describe(t)), t.line);
  }
  return e;
}

ExprP Parser::parse_postfix(ExprP e) {
  while (true) {
    if (at_op(".") || at_op("[")) e = parse_subscript(std::move(e));
    else if (at_op("(")) e = parse_call(std::move(e));
    else return e;
  }
}

ExprP Parser::parse_filter_expr(ExprP e) {
  while (true) {
    if (at_op("|")) e = parse_filter(std::move(e), false);
    else if (at_name("is")) e = parse_test(std::move(e));
    else if (at_op("(")) e = parse_call(std::move(e));
    else return e;
  }
}

ExprP Parser::parse_subscript(ExprP obj) {
  const Token t = take();
  if (t.text == ".") {
    const Token attr = take();
    if (attr.type == Tok::name) {
      auto e = node(EK::getattr, t.line);
      e->a = std::move(obj);
      e->name = attr.text;
      return e;
    }
    if (attr.type != Tok::integer) error("expected name or number", attr.line);
    auto e = node(EK::getitem, t.line);
    e->a = std::move(obj);
    e->b = node(EK::literal, attr.line);
    e->b->value = Value::integer(attr.ival);
    return e;
  }
  std::vector<ExprP> args;
  while (!at_op("]")) {
    if (!args.empty()) expect_op(",");
    args.push_back(parse_subscribed());
  }
  expect_op("]");
  auto e = node(EK::getitem, t.line);
  e->a = std::move(obj);
  if (args.size() == 1) {
    e->b = std::move(args[0]);
  } else {
    e->b = node(EK::tuple, t.line);
    e->b->items = std::move(args);
  }
  return e;
}

ExprP Parser::parse_subscribed() {
  const int line = cur().line;
  ExprP start;
  if (!at_op(":")) {
    start = parse_expression(/*with_condexpr=*/true);
    if (!at_op(":")) return start;
  }
  take();  // ':'
  auto e = node(EK::slice, line);
  e->a = std::move(start);
  if (!at_op(":") && !at_op("]") && !at_op(",")) e->b = parse_expression(/*with_condexpr=*/true);
  if (skip_op(":")) {
    if (!at_op("]") && !at_op(",")) e->c = parse_expression(/*with_condexpr=*/true);
  }
  return e;
}

void Parser::parse_call_args(Expr& e) {
  const int line = cur().line;
  expect_op("(");
  bool require_comma = false;
  auto ensure = [&](bool ok) {
    if (!ok) error("invalid syntax for function call expression", line);
  };
  while (!at_op(")")) {
    if (require_comma) {
      expect_op(",");
      if (at_op(")")) break;
    }
    if (skip_op("*")) {
      ensure(!e.dyn_args && !e.dyn_kwargs);
      e.dyn_args = parse_expression(/*with_condexpr=*/true);
    } else if (skip_op("**")) {
      ensure(!e.dyn_kwargs);
      e.dyn_kwargs = parse_expression(/*with_condexpr=*/true);
    } else if (cur().type == Tok::name && look().type == Tok::op && look().text == "=") {
      ensure(!e.dyn_kwargs);
      std::string key = take().text;
      take();
      e.kwargs.emplace_back(std::move(key), parse_expression(/*with_condexpr=*/true));
    } else {
      ensure(!e.dyn_args && !e.dyn_kwargs && e.kwargs.empty());
      e.items.push_back(parse_expression(/*with_condexpr=*/true));
    }
    require_comma = true;
  }
  expect_op(")");
}

ExprP Parser::parse_call(ExprP callee) {
  auto e = node(EK::call, cur().line);
  e->a = std::move(callee);
  parse_call_args(*e);
  return e;
}

std::string Parser::dotted_name() {
  std::string n = expect_name();
  while (skip_op(".")) n += "." + expect_name();
  return n;
}

ExprP Parser::parse_filter(ExprP operand, bool start_inline) {
  while (at_op("|") || start_inline) {
    if (!start_inline) take();
    start_inline = false;
    const int line = cur().line;
    auto e = node(EK::filter, line);
    e->name = dotted_name();
    e->known = is_known_filter(e->name);
    e->a = std::move(operand);
    if (at_op("(")) parse_call_args(*e);
    operand = std::move(e);
  }
  return operand;
}

ExprP Parser::parse_test(ExprP operand) {
  const int line = take().line;  // 'is'
  const bool negated = skip_name("not");
  auto e = node(EK::test, line);
  e->name = dotted_name();
  e->known = is_known_test(e->name);
  e->a = std::move(operand);
  const Token& t = cur();
  if (at_op("(")) {
    parse_call_args(*e);
  } else if ((t.type == Tok::name || t.type == Tok::string || t.type == Tok::integer || t.type == Tok::floating ||
              at_op("(") || at_op("[") || at_op("{")) &&
             !(t.type == Tok::name && (t.text == "else" || t.text == "or" || t.text == "and"))) {
    if (at_name("is")) error("You cannot chain multiple tests with is", t.line);
    e->items.push_back(parse_postfix(parse_primary()));
  }
  if (!negated) return e;
  auto n = node(EK::not_, line);
  n->a = std::move(e);
  return n;
}

}  // namespace tessera::jinja::internal
