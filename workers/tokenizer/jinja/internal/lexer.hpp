// internal/lexer.hpp: the tokens of a template (lexer.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::jinja::internal {

enum class Tok : uint8_t { data, var_begin, var_end, block_begin, block_end, name, string, integer, floating, op, eof };

struct Token {
  Tok type = Tok::eof;
  std::string text;  // data text, name, decoded string literal, or operator
  int line = 1;
  int64_t ival = 0;
  double fval = 0;
};

// jinja2.lexer.Lexer.tokeniter with trim_blocks and lstrip_blocks on, newline_sequence "\n" and
// keep_trailing_newline off. Ends with a Tok::eof token; a lexical error throws Error.
std::vector<Token> lex(std::string_view source);

}  // namespace tessera::jinja::internal
