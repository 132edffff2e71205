// parser.cpp: jinja2.parser.Parser, same grammar and precedence: the token helpers and the
// statements (tags). The expressions are in parse_expr.cpp.
#include <algorithm>

#include "workers/tokenizer/jinja/internal/parser.hpp"

namespace tessera::jinja::internal {

Body Parser::parse_template() {
  Body body = subparse({});
  if (cur().type != Tok::eof) error(fmt::format("unexpected {}", describe(cur())), cur().line);
  return body;
}

Token Parser::take() {
  Token t = toks_[p_];
  if (p_ + 1 < toks_.size()) ++p_;
  return t;
}

bool Parser::skip_op(std::string_view op) {
  if (!at_op(op)) return false;
  take();
  return true;
}

bool Parser::skip_name(std::string_view n) {
  if (!at_name(n)) return false;
  take();
  return true;
}

std::string Parser::describe_type(Tok t) {
  switch (t) {
    case Tok::data: return "template data / text";
    case Tok::var_begin: return "begin of print statement";
    case Tok::var_end: return "end of print statement";
    case Tok::block_begin: return "begin of statement block";
    case Tok::block_end: return "end of statement block";
    case Tok::name: return "name";
    case Tok::string: return "string";
    case Tok::integer: return "integer";
    case Tok::floating: return "float";
    case Tok::op: return "operator";
    case Tok::eof: return "end of template";
  }
  return "token";
}

std::string Parser::describe(const Token& t) {
  if (t.type == Tok::name || t.type == Tok::op) return "'" + t.text + "'";
  return "'" + describe_type(t.type) + "'";
}

void Parser::expect(Tok type) {
  if (cur().type != type) {
    if (cur().type == Tok::eof) error(fmt::format("unexpected end of template, expected '{}'.", describe_type(type)), cur().line);
    error(fmt::format("expected token '{}', got {}", describe_type(type), describe(cur())), cur().line);
  }
  take();
}

void Parser::expect_op(std::string_view op) {
  if (!at_op(op)) {
    if (cur().type == Tok::eof) error(fmt::format("unexpected end of template, expected '{}'.", op), cur().line);
    error(fmt::format("expected token '{}', got {}", op, describe(cur())), cur().line);
  }
  take();
}

std::string Parser::expect_name() {
  if (cur().type != Tok::name) {
    if (cur().type == Tok::eof) error("unexpected end of template, expected 'name'.", cur().line);
    error(fmt::format("expected token 'name', got {}", describe(cur())), cur().line);
  }
  return take().text;
}

void Parser::expect_name(std::string_view n) {
  if (!at_name(n)) error(fmt::format("expected token '{}', got {}", n, describe(cur())), cur().line);
  take();
}

ExprP Parser::node(EK k, int line) {
  auto e = std::make_unique<Expr>();
  e->k = k;
  e->line = line;
  return e;
}

StmtP Parser::stmt(SK k, int line) {
  auto s = std::make_unique<Stmt>();
  s->k = k;
  s->line = line;
  return s;
}

// --- statements

Body Parser::subparse(const std::vector<std::string>& end_tags) {
  Body body;
  while (true) {
    const Token& t = cur();
    if (t.type == Tok::data) {
      auto s = stmt(SK::text, t.line);
      s->text = take().text;
      body.push_back(std::move(s));
    } else if (t.type == Tok::var_begin) {
      const int line = take().line;
      auto s = stmt(SK::output, line);
      s->expr = parse_tuple(/*simplified=*/false, /*with_condexpr=*/true, {}, /*explicit_parens=*/false);
      expect(Tok::var_end);
      body.push_back(std::move(s));
    } else if (t.type == Tok::block_begin) {
      take();
      if (cur().type == Tok::name && std::find(end_tags.begin(), end_tags.end(), cur().text) != end_tags.end()) return body;
      body.push_back(parse_statement());
      expect(Tok::block_end);
    } else if (t.type == Tok::eof) {
      return body;
    } else {
      error(fmt::format("unexpected {}", describe(t)), t.line);
    }
  }
}

// parse_statements: the block_end after a tag header, then the body up to one of `end_tags`.
Body Parser::statements(const std::vector<std::string>& end_tags, bool drop_needle) {
  skip_op(":");
  expect(Tok::block_end);
  Body body = subparse(end_tags);
  if (cur().type == Tok::eof) {
    std::string wanted;
    for (size_t k = 0; k < end_tags.size(); ++k) wanted += (k ? " or '" : "'") + end_tags[k] + "'";
    error(fmt::format("Unexpected end of template. Jinja was looking for the following tags: {}. The innermost "
                      "block that needs to be closed is '{}'.", wanted, tag_stack_.empty() ? "" : tag_stack_.back()),
          cur().line);
  }
  if (drop_needle) take();
  return body;
}

StmtP Parser::parse_statement() {
  const Nest nest(nesting_, cur().line);
  const Token& t = cur();
  if (t.type != Tok::name) error("tag name expected", t.line);
  const std::string tag = t.text;
  const int line = t.line;
  tag_stack_.push_back(tag);
  StmtP s;
  if (tag == "if") s = parse_if();
  else if (tag == "for") s = parse_for();
  else if (tag == "set") s = parse_set();
  else if (tag == "macro") s = parse_macro();
  else if (tag == "call") s = parse_call_block();
  else if (tag == "filter") s = parse_filter_block();
  else if (tag == "with") s = parse_with();
  else if (tag == "print") {
    take();
    s = stmt(SK::output, line);
    s->expr = parse_tuple(/*simplified=*/false, /*with_condexpr=*/true, {}, /*explicit_parens=*/false);
  } else if (tag == "break" || tag == "continue") {
    take();
    s = stmt(tag == "break" ? SK::break_ : SK::continue_, line);
  } else if (tag == "generation") {  // transformers' AssistantTracker: renders its body
    take();
    s = stmt(SK::scope, line);
    s->body = statements({"endgeneration"}, true);
  } else if (tag == "block" || tag == "extends" || tag == "include" || tag == "import" || tag == "from" ||
             tag == "autoescape") {
    error(fmt::format("the '{}' tag is not supported (templates are rendered standalone)", tag), line);
  } else {
    error(fmt::format("Encountered unknown tag '{}'.", tag), line);
  }
  tag_stack_.pop_back();
  return s;
}

StmtP Parser::parse_if() {
  auto s = stmt(SK::if_, take().line);
  while (true) {
    ExprP test = parse_tuple(/*simplified=*/false, /*with_condexpr=*/false, {}, /*explicit_parens=*/false);
    Body body = statements({"elif", "else", "endif"}, false);
    s->branches.emplace_back(std::move(test), std::move(body));
    const Token t = take();
    if (t.text == "elif") continue;
    if (t.text == "else") s->branches.emplace_back(nullptr, statements({"endif"}, true));
    break;
  }
  return s;
}

StmtP Parser::parse_for() {
  auto s = stmt(SK::for_, take().line);
  s->target = parse_assign_target({"in"});
  expect_name("in");
  s->expr = parse_tuple(/*simplified=*/false, /*with_condexpr=*/false, {"recursive"}, /*explicit_parens=*/false);
  if (skip_name("if")) s->cond = parse_expression(/*with_condexpr=*/true);
  if (at_name("recursive")) error("recursive for loops are not supported", cur().line);
  s->body = statements({"endfor", "else"}, false);
  if (take().text == "else") s->else_body = statements({"endfor"}, true);
  return s;
}

Target Parser::parse_assign_target(const std::vector<std::string>& extra_end) {
  Target t;
  const bool paren = skip_op("(");
  while (true) {
    if (!t.names.empty()) {
      if (!skip_op(",")) break;
      t.tuple = true;
      if (cur().type != Tok::name || is_end(extra_end)) break;
    }
    if (cur().type != Tok::name) error(fmt::format("expected token 'name', got {}", describe(cur())), cur().line);
    const std::string n = take().text;
    if (n == "true" || n == "false" || n == "none" || n == "True" || n == "False" || n == "None") {
      error("can't assign to 'const'", cur().line);
    }
    t.names.push_back(n);
    if (!at_op(",")) break;
  }
  if (paren) {
    expect_op(")");
    t.tuple = true;
  }
  return t;
}

bool Parser::is_end(const std::vector<std::string>& extra_end) const {
  if (cur().type == Tok::var_end || cur().type == Tok::block_end || at_op(")")) return true;
  return cur().type == Tok::name && std::find(extra_end.begin(), extra_end.end(), cur().text) != extra_end.end();
}

StmtP Parser::parse_set() {
  const int line = take().line;
  if (cur().type == Tok::name && look().type == Tok::op && look().text == ".") {
    auto s = stmt(SK::set_attr, line);
    s->text = take().text;
    take();
    s->attr = expect_name();
    expect_op("=");
    s->expr = parse_tuple(/*simplified=*/false, /*with_condexpr=*/true, {}, /*explicit_parens=*/false);
    return s;
  }
  Target target = parse_assign_target({});
  if (skip_op("=")) {
    auto s = stmt(SK::set, line);
    s->target = std::move(target);
    s->expr = parse_tuple(/*simplified=*/false, /*with_condexpr=*/true, {}, /*explicit_parens=*/false);
    return s;
  }
  auto s = stmt(SK::set_block, line);
  if (target.tuple) error("can't assign a block to a tuple", line);
  s->target = std::move(target);
  if (at_op("|")) s->expr = parse_filter(block_value(line), false);
  s->body = statements({"endset"}, true);
  return s;
}

ExprP Parser::block_value(int line) {
  auto e = node(EK::name, line);
  e->name = kBlockValue;
  return e;
}

void Parser::parse_signature(Stmt& s) {
  expect_op("(");
  while (!at_op(")")) {
    if (!s.params.empty()) expect_op(",");
    if (at_op(")")) break;
    std::string n = expect_name();
    ExprP dflt;
    if (skip_op("=")) dflt = parse_expression(/*with_condexpr=*/true);
    else if (!s.params.empty() && s.params.back().second) error("non-default argument follows default argument", cur().line);
    s.params.emplace_back(std::move(n), std::move(dflt));
  }
  expect_op(")");
}

StmtP Parser::parse_macro() {
  auto s = stmt(SK::macro, take().line);
  s->text = expect_name();
  parse_signature(*s);
  s->body = statements({"endmacro"}, true);
  return s;
}

StmtP Parser::parse_call_block() {
  auto s = stmt(SK::call_block, take().line);
  if (at_op("(")) parse_signature(*s);
  s->expr = parse_expression(/*with_condexpr=*/true);
  if (s->expr->k != EK::call) error("expected call", s->line);
  s->body = statements({"endcall"}, true);
  return s;
}

StmtP Parser::parse_filter_block() {
  auto s = stmt(SK::filter_block, take().line);
  s->expr = parse_filter(block_value(s->line), true);
  s->body = statements({"endfilter"}, true);
  return s;
}

StmtP Parser::parse_with() {
  auto s = stmt(SK::with, take().line);
  while (cur().type != Tok::block_end) {
    if (!s->params.empty()) expect_op(",");
    std::string n = expect_name();
    expect_op("=");
    s->params.emplace_back(std::move(n), parse_expression(/*with_condexpr=*/true));
  }
  s->body = statements({"endwith"}, true);
  return s;
}

}  // namespace tessera::jinja::internal
