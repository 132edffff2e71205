// lexer.cpp: jinja2.lexer.Lexer.tokeniter with trim_blocks and lstrip_blocks on, newline_sequence
// "\n" and keep_trailing_newline off.
#include "workers/tokenizer/jinja/internal/lexer.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "workers/tokenizer/jinja/internal/text.hpp"
#include "workers/tokenizer/jinja/internal/value.hpp"

namespace tessera::jinja::internal {
namespace {

bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || static_cast<unsigned char>(c) >= 0x80; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }
int count_newlines(std::string_view s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

// The value of a string literal: Python's "unicode-escape" decoding, as jinja applies it.
std::string unescape_literal(std::string_view raw) {
  std::string out;
  for (size_t i = 0; i < raw.size();) {
    if (raw[i] != '\\' || i + 1 >= raw.size()) {
      out.push_back(raw[i++]);
      continue;
    }
    const char c = raw[i + 1];
    i += 2;
    auto hex = [&](int n, const char* what) {
      uint32_t v = 0;
      for (int k = 0; k < n; ++k, ++i) {
        if (i >= raw.size() || !std::isxdigit(static_cast<unsigned char>(raw[i]))) fail(std::string("truncated ") + what + " escape");
        v = v * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(raw[i])) ? raw[i] - '0' : (std::tolower(raw[i]) - 'a' + 10));
      }
      return v;
    };
    switch (c) {
      case '\n': break;
      case '\\': out.push_back('\\'); break;
      case '\'': out.push_back('\''); break;
      case '"': out.push_back('"'); break;
      case 'a': out.push_back('\a'); break;
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'n': out.push_back('\n'); break;
      case 'r': out.push_back('\r'); break;
      case 't': out.push_back('\t'); break;
      case 'v': out.push_back('\v'); break;
      case 'x': encode(hex(2, "\\xXX"), out); break;
      case 'u': encode(hex(4, "\\uXXXX"), out); break;
      case 'U': {
        const uint32_t v = hex(8, "\\UXXXXXXXX");
        if (v > 0x10FFFF) fail("illegal Unicode character");
        encode(v, out);
        break;
      }
      default:
        if (c >= '0' && c <= '7') {
          uint32_t v = static_cast<uint32_t>(c - '0');
          for (int k = 0; k < 2 && i < raw.size() && raw[i] >= '0' && raw[i] <= '7'; ++k) v = v * 8 + static_cast<uint32_t>(raw[i++] - '0');
          encode(v, out);
        } else if (c == 'N') {
          fail("\\N{...} escapes are not supported");
        } else {
          out.push_back('\\');
          out.push_back(c);
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) : src_(normalize(source)) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      const size_t start = find_tag(pos_);
      if (start == std::string::npos) {
        push(Tok::data, src_.substr(pos_), line_);
        break;
      }
      std::string text = src_.substr(pos_, start - pos_);
      const int text_line = line_;
      line_ += count_newlines(text);
      const char kind = src_[start + 1];
      size_t raw_end = 0;
      char sign = 0;
      const bool raw = kind == '%' && match_raw_begin(start, raw_end, sign);
      if (!raw && start + 2 < src_.size() && (src_[start + 2] == '-' || src_[start + 2] == '+')) sign = src_[start + 2];
      text = strip_before_tag(std::move(text), sign, /*lstrip_allowed=*/kind != '{');
      if (!text.empty()) push(Tok::data, std::move(text), text_line);
      line_starting_ = false;
      if (raw) {
        line_ += count_newlines(std::string_view(src_).substr(start, raw_end - start));
        line_starting_ = src_[raw_end - 1] == '\n';
        pos_ = raw_end;
        lex_raw_body();
        continue;
      }
      pos_ = start + 2 + (sign ? 1 : 0);
      if (kind == '#') lex_comment();
      else lex_tag(kind == '%');
    }
    push(Tok::eof, "", line_);
    return std::move(out_);
  }

 private:
  static std::string normalize(std::string_view in) {
    std::string out;
    out.reserve(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      if (in[i] == '\r') {
        out.push_back('\n');
        if (i + 1 < in.size() && in[i + 1] == '\n') ++i;
      } else {
        out.push_back(in[i]);
      }
    }
    if (!out.empty() && out.back() == '\n') out.pop_back();  // keep_trailing_newline=False
    return out;
  }

  [[noreturn]] void error(std::string message) const { throw Error{std::move(message), line_}; }

  void push(Tok type, std::string text, int line) {
    Token t;
    t.type = type;
    t.text = std::move(text);
    t.line = line;
    out_.push_back(std::move(t));
  }

  bool at(size_t p, std::string_view s) const { return src_.compare(p, s.size(), s) == 0; }

  size_t find_tag(size_t from) const {
    for (size_t p = src_.find('{', from); p != std::string::npos; p = src_.find('{', p + 1)) {
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) return p;
    }
    return std::string::npos;
  }

  size_t skip_space(size_t p) const {
    while (p < src_.size()) {
      size_t q = p;
      if (!py_isspace(decode(src_, q))) break;
      p = q;
    }
    return p;
  }

  // `{%(-|+|)\s*raw\s*(-%}\s*|%})` at `start`.
  bool match_raw_begin(size_t start, size_t& end, char& sign) const {
    size_t p = start + 2;
    char s = 0;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) s = src_[p++];
    p = skip_space(p);
    if (!at(p, "raw")) return false;
    p = skip_space(p + 3);
    if (at(p, "-%}")) {
      end = skip_space(p + 3);
    } else if (at(p, "%}")) {
      end = p + 2;
    } else {
      return false;
    }
    sign = s;
    return true;
  }

  // OptionalLStrip: `-` strips all whitespace before the tag; otherwise lstrip_blocks removes
  // the spaces and tabs between a line start and a block or comment tag.
  std::string strip_before_tag(std::string text, char sign, bool lstrip_allowed) const {
    if (sign == '-') return rstrip_ws(text);
    if (sign == '+' || !lstrip_allowed) return text;
    const size_t nl = text.rfind('\n');
    const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if ((l_pos > 0 || line_starting_) && all_space(std::string_view(text).substr(l_pos))) text.resize(l_pos);
    return text;
  }

  // Consumes a block/comment end: `+%}` keeps what follows, `-%}` eats whitespace, plain `%}`
  // eats one newline (trim_blocks). Returns false when `close` is not at pos_.
  bool end_tag(std::string_view close, bool trim_newline) {
    size_t p;
    if (at(pos_, std::string("+") + std::string(close)) && close != "}}") {
      p = pos_ + 1 + close.size();
    } else if (at(pos_, std::string("-") + std::string(close))) {
      p = skip_space(pos_ + 1 + close.size());
    } else if (at(pos_, close)) {
      p = pos_ + close.size();
      if (trim_newline && p < src_.size() && src_[p] == '\n') ++p;
    } else {
      return false;
    }
    line_ += count_newlines(std::string_view(src_).substr(pos_, p - pos_));
    line_starting_ = src_[p - 1] == '\n';
    pos_ = p;
    return true;
  }

  void lex_comment() {
    for (size_t p = pos_; p < src_.size(); ++p) {
      if (src_[p] != '+' && src_[p] != '-' && src_[p] != '#') continue;
      const size_t save = pos_;
      pos_ = p;
      if ((src_[p] != '#' || at(p, "#}")) && end_tag("#}", /*trim_newline=*/true)) {
        line_ += count_newlines(std::string_view(src_).substr(save, p - save));
        return;
      }
      pos_ = save;
    }
    error("Missing end of comment tag");
  }

  void lex_raw_body() {
    for (size_t p = src_.find("{%", pos_); p != std::string::npos; p = src_.find("{%", p + 1)) {
      size_t q = p + 2;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      q = skip_space(q);
      if (!at(q, "endraw")) continue;
      q = skip_space(q + 6);
      const size_t save = pos_;
      pos_ = q;
      if (!end_tag("%}", /*trim_newline=*/true)) {
        pos_ = save;
        continue;
      }
      const size_t after = pos_;
      const bool after_starting = line_starting_;
      line_starting_ = src_[save - 1] == '\n';
      std::string text = strip_before_tag(src_.substr(save, p - save), sign, true);
      if (!text.empty()) push(Tok::data, std::move(text), line_);
      line_ += count_newlines(std::string_view(src_).substr(save, q - save));
      line_starting_ = after_starting;
      pos_ = after;
      return;
    }
    error("Missing end of raw directive");
  }

  void lex_tag(bool block) {
    push(block ? Tok::block_begin : Tok::var_begin, "", line_);
    std::vector<char> balance;
    while (pos_ < src_.size()) {
      if (balance.empty()) {
        const int line = line_;
        if (block ? end_tag("%}", /*trim_newline=*/true) : end_tag("}}", /*trim_newline=*/false)) {
          push(block ? Tok::block_end : Tok::var_end, "", line);
          return;
        }
      }
      size_t q = pos_;
      if (py_isspace(decode(src_, q))) {
        const size_t e = skip_space(pos_);
        line_ += count_newlines(std::string_view(src_).substr(pos_, e - pos_));
        pos_ = e;
        continue;
      }
      if (lex_number() || lex_name() || lex_string() || lex_operator(balance)) continue;
      error(fmt::format("unexpected char {} at {}", py_repr_str(std::string(1, src_[pos_])), pos_));
    }
  }

  size_t digits_from(size_t p) const {  // (\d+_)*\d+ ; p must be at a digit
    while (p < src_.size() && is_digit(src_[p])) ++p;
    while (p + 1 < src_.size() && src_[p] == '_' && is_digit(src_[p + 1])) {
      ++p;
      while (p < src_.size() && is_digit(src_[p])) ++p;
    }
    return p;
  }

  static std::string without_underscores(std::string_view s) {
    std::string out;
    for (char c : s) if (c != '_') out.push_back(c);
    return out;
  }

  bool lex_number() {
    const size_t n = src_.size();
    if (!is_digit(src_[pos_])) return false;
    // float_re (tried before integer_re); (?<!\.) keeps `x.0.1`-style access out of it.
    if (pos_ == 0 || src_[pos_ - 1] != '.') {
      const size_t int_end = digits_from(pos_);
      size_t p = int_end;
      bool frac = false;
      if (p + 1 < n && src_[p] == '.' && is_digit(src_[p + 1])) p = digits_from(p + 1), frac = true;
      size_t end = frac ? p : 0;
      if (p < n && (src_[p] == 'e' || src_[p] == 'E')) {
        size_t r = p + 1;
        if (r < n && (src_[r] == '+' || src_[r] == '-')) ++r;
        if (r < n && is_digit(src_[r])) end = digits_from(r);
      }
      if (end != 0) {
        Token t;
        t.type = Tok::floating;
        t.text = src_.substr(pos_, end - pos_);
        t.fval = std::strtod(without_underscores(t.text).c_str(), nullptr);
        t.line = line_;
        out_.push_back(std::move(t));
        pos_ = end;
        return true;
      }
    }
    // integer_re: 0b/0o/0x with optional single underscores, [1-9](_?\d)*, 0(_?0)*.
    size_t p = pos_;
    int base = 10;
    auto run = [&](size_t from, auto ok) {
      size_t q = from;
      while (true) {
        if (q < n && ok(src_[q])) ++q;
        else if (q + 1 < n && src_[q] == '_' && ok(src_[q + 1])) q += 2;
        else break;
      }
      return q;
    };
    const char c1 = pos_ + 1 < n ? static_cast<char>(std::tolower(src_[pos_ + 1])) : 0;
    size_t digits_begin = pos_;
    if (src_[pos_] == '0' && (c1 == 'b' || c1 == 'o' || c1 == 'x')) {
      base = c1 == 'b' ? 2 : c1 == 'o' ? 8 : 16;
      auto ok = [base](char c) {
        if (base == 2) return c == '0' || c == '1';
        if (base == 8) return c >= '0' && c <= '7';
        return std::isxdigit(static_cast<unsigned char>(c)) != 0;
      };
      const size_t q = run(pos_ + 2, ok);
      if (q > pos_ + 2) p = q, digits_begin = pos_ + 2;
    }
    if (p == pos_) {
      if (src_[pos_] == '0') p = run(pos_ + 1, [](char c) { return c == '0'; });
      else p = run(pos_ + 1, [](char c) { return is_digit(c); });
    }
    Token t;
    t.type = Tok::integer;
    t.text = src_.substr(pos_, p - pos_);
    const std::string digits = without_underscores(std::string_view(src_).substr(digits_begin, p - digits_begin));
    errno = 0;
    t.ival = static_cast<int64_t>(std::strtoull(digits.c_str(), nullptr, base));
    if (errno == ERANGE || std::strtoull(digits.c_str(), nullptr, base) > static_cast<unsigned long long>(INT64_MAX)) {
      error("integer literal " + t.text + " does not fit in 64 bits");
    }
    t.line = line_;
    out_.push_back(std::move(t));
    pos_ = p;
    return true;
  }

  bool lex_name() {
    if (!is_name_start(src_[pos_])) return false;
    size_t p = pos_;
    while (p < src_.size() && is_name_char(src_[p])) ++p;
    push(Tok::name, src_.substr(pos_, p - pos_), line_);
    pos_ = p;
    return true;
  }

  bool lex_string() {
    const char q = src_[pos_];
    if (q != '\'' && q != '"') return false;
    size_t p = pos_ + 1;
    while (p < src_.size() && src_[p] != q) p += src_[p] == '\\' ? 2 : 1;
    if (p >= src_.size()) return false;
    Token t;
    t.type = Tok::string;
    t.line = line_;
    try {
      t.text = unescape_literal(std::string_view(src_).substr(pos_ + 1, p - pos_ - 1));
    } catch (Error& e) {
      error(e.message);
    }
    out_.push_back(std::move(t));
    line_ += count_newlines(std::string_view(src_).substr(pos_, p + 1 - pos_));
    pos_ = p + 1;
    return true;
  }

  bool lex_operator(std::vector<char>& balance) {
    static const char* kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : kTwo) {
      if (at(pos_, op)) {
        push(Tok::op, op, line_);
        pos_ += 2;
        return true;
      }
    }
    const char c = src_[pos_];
    if (std::strchr("+-/*%~[](){}><=.:|,;", c) == nullptr || c == 0) return false;
    if (c == '{' || c == '(' || c == '[') balance.push_back(c == '{' ? '}' : c == '(' ? ')' : ']');
    if (c == '}' || c == ')' || c == ']') {
      if (balance.empty()) error(fmt::format("unexpected '{}'", c));
      const char expected = balance.back();
      balance.pop_back();
      if (expected != c) error(fmt::format("unexpected '{}', expected '{}'", c, expected));
    }
    push(Tok::op, std::string(1, c), line_);
    ++pos_;
    return true;
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> out_;
};

}  // namespace

std::vector<Token> lex(std::string_view source) { return Lexer(source).run(); }

}  // namespace tessera::jinja::internal
