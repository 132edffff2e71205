// internal/parser.hpp: jinja2.parser.Parser, same grammar and precedence (statements in
// parser.cpp, expressions in parse_expr.cpp), and the checks jinja2's code generator makes after
// parsing (checker.cpp). Both throw Error with the line of the offending token.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "workers/tokenizer/jinja/internal/ast.hpp"
#include "workers/tokenizer/jinja/internal/lexer.hpp"

namespace tessera::jinja::internal {

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  Body parse_template();

 private:
  const Token& cur() const { return toks_[p_]; }
  const Token& look() const { return toks_[std::min(p_ + 1, toks_.size() - 1)]; }
  Token take();
  bool at_op(std::string_view op) const { return cur().type == Tok::op && cur().text == op; }
  bool at_name(std::string_view n) const { return cur().type == Tok::name && cur().text == n; }
  bool skip_op(std::string_view op);
  bool skip_name(std::string_view n);

  [[noreturn]] static void error(std::string message, int line) { throw Error{std::move(message), line}; }

  static std::string describe_type(Tok t);
  static std::string describe(const Token& t);

  void expect(Tok type);
  void expect_op(std::string_view op);
  std::string expect_name();
  void expect_name(std::string_view n);

  static ExprP node(EK k, int line);
  static StmtP stmt(SK k, int line);

  // --- statements (parser.cpp)

  Body subparse(const std::vector<std::string>& end_tags);
  Body statements(const std::vector<std::string>& end_tags, bool drop_needle);
  StmtP parse_statement();
  StmtP parse_if();
  StmtP parse_for();
  Target parse_assign_target(const std::vector<std::string>& extra_end);
  bool is_end(const std::vector<std::string>& extra_end) const;
  StmtP parse_set();
  static ExprP block_value(int line);
  void parse_signature(Stmt& s);
  StmtP parse_macro();
  StmtP parse_call_block();
  StmtP parse_filter_block();
  StmtP parse_with();

  // --- expressions (parse_expr.cpp; highest call first: tuple > condexpr > or > and > not >
  // compare > math1 > concat > math2 > pow > unary > primary/postfix/filter)

  ExprP parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }
  ExprP parse_tuple(bool simplified, bool with_condexpr, const std::vector<std::string>& extra_end, bool explicit_parens);
  ExprP parse_condexpr();
  ExprP parse_or();
  ExprP parse_and();
  ExprP parse_not();
  ExprP parse_compare();
  ExprP binop(std::string op, ExprP l, ExprP r, int line);
  ExprP parse_math1();
  ExprP parse_concat();
  ExprP parse_math2();
  ExprP parse_pow();
  ExprP parse_unary(bool with_filter);
  ExprP parse_primary();
  ExprP parse_postfix(ExprP e);
  ExprP parse_filter_expr(ExprP e);
  ExprP parse_subscript(ExprP obj);
  ExprP parse_subscribed();
  void parse_call_args(Expr& e);
  ExprP parse_call(ExprP callee);
  std::string dotted_name();
  ExprP parse_filter(ExprP operand, bool start_inline);
  ExprP parse_test(ExprP operand);

  // Bounds the recursion of nested expressions and blocks (jinja2 hits Python's recursion limit).
  struct Nest {
    int& depth;
    Nest(int& d, int line) : depth(d) {
      if (++depth > 200) error("template nesting is too deep", line);
    }
    ~Nest() { --depth; }
  };

  std::vector<Token> toks_;
  size_t p_ = 0;
  std::vector<std::string> tag_stack_;
  int nesting_ = 0;
};

// After parsing, what jinja2's code generator checks: unknown filters and tests outside an `if`
// or conditional expression (a "soft frame") fail at compile time, break/continue need a loop,
// and a macro takes `caller`, extra positional (`varargs`) or keyword (`kwargs`) arguments only
// when its body names them (recorded in its Stmt's uses_* flags).
void check(Body& body);

}  // namespace tessera::jinja::internal
