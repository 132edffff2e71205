// textwrap.cpp: Python's textwrap.wrap (CPython 3.11 Lib/textwrap.py) as jinja2's wordwrap filter
// calls it: the text split into chunks (words, hyphenated word parts, whitespace runs) by
// TextWrapper.wordsep_re, then packed greedily into lines of at most `width` code points.
#include <utf8proc.h>

#include <algorithm>

#include "workers/tokenizer/jinja/internal/builtins.hpp"
#include "workers/tokenizer/jinja/internal/filters.hpp"

namespace tessera::jinja::internal {
namespace {

// textwrap's _whitespace, '\t\n\x0b\x0c\r ': ASCII only, not what str.isspace() accepts.
bool wrap_space(char32_t c) { return c == '\t' || c == '\n' || c == 0x0B || c == 0x0C || c == '\r' || c == ' '; }

// `\w` and `\d` of a str pattern: str.isalnum() or '_', and str.isdecimal().
bool re_word(char32_t c) { return c == '_' || py_isalpha_cp(c) || py_isnumeric_cp(c); }
bool re_digit(char32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_ND; }

// wordsep_re's classes: letter = [^\d\W], word_punct = [\w!"'&.,?].
bool letter(char32_t c) { return re_word(c) && !re_digit(c); }
bool word_punct(char32_t c) { return re_word(c) || c == '!' || c == '"' || c == '\'' || c == '&' || c == '.' || c == ',' || c == '?'; }

// The chunker works on the whole text because wordsep_re's lookbehinds see before a match.
class Chunker {
 public:
  explicit Chunker(const U32& t) : t_(t) {}

  // wordsep_re.split(text) without the empty strings: since every position starts a match, the
  // chunks are the successive matches.
  std::vector<U32> split(bool on_hyphens) const {
    std::vector<U32> chunks;
    for (size_t p = 0; p < t_.size();) {
      size_t e = p;
      if (wrap_space(t_[p])) {
        while (e < t_.size() && wrap_space(t_[e])) ++e;  // whitespace+
      } else if (!on_hyphens) {
        while (e < t_.size() && !wrap_space(t_[e])) ++e;  // wordsep_simple_re splits on whitespace only
      } else {
        e = word_end(p);
      }
      chunks.push_back(t_.substr(p, e - p));
      p = e;
    }
    return chunks;
  }

 private:
  bool is(size_t k, bool (*cls)(char32_t)) const { return k < t_.size() && cls(t_[k]); }
  bool is(size_t k, char32_t c) const { return k < t_.size() && t_[k] == c; }

  size_t dashes(size_t k) const {
    size_t e = k;
    while (is(e, U'-')) ++e;
    return e - k;
  }

  // `-{2,}(?=\w)` at k (a shorter run than the longest is followed by '-', never by \w).
  bool em_dash(size_t k) const {
    const size_t n = dashes(k);
    return n >= 2 && is(k + n, re_word);
  }

  // `-(?: (?<=lt{2}-) | (?<=lt-lt-)) (?= lt -? lt)` at k.
  bool hyphen_break(size_t k) const {
    if (!is(k, U'-')) return false;
    const bool behind = (k >= 2 && letter(t_[k - 2]) && letter(t_[k - 1])) ||
                        (k >= 3 && letter(t_[k - 3]) && t_[k - 2] == U'-' && letter(t_[k - 1]));
    const bool ahead = is(k + 1, letter) && (is(k + 2, letter) || (is(k + 2, U'-') && is(k + 3, letter)));
    return behind && ahead;
  }

  // The end of the match at p, a non-space: an em-dash between words, or `nws+?` up to the
  // first place where a hyphenated word breaks, the word ends, or an em-dash follows.
  size_t word_end(size_t p) const {
    if (p > 0 && word_punct(t_[p - 1]) && em_dash(p)) return p + dashes(p);
    for (size_t q = p + 1;; ++q) {
      if (hyphen_break(q)) return q + 1;
      if (q == t_.size() || wrap_space(t_[q])) return q;
      if (word_punct(t_[q - 1]) && em_dash(q)) return q;
    }
  }

  const U32& t_;
};

// chunk.strip() == '' (str.strip's whitespace; true for an empty chunk).
bool blank(const U32& chunk) {
  return std::all_of(chunk.begin(), chunk.end(), [](char32_t c) { return py_isspace(c); });
}

int64_t length(const U32& chunk) { return static_cast<int64_t>(chunk.size()); }

// TextWrapper._handle_long_word: `chunks` is reversed, its back the word too long for any line.
void handle_long_word(std::vector<U32>& chunks, std::vector<U32>& cur_line, int64_t cur_len, int64_t width,
                      const WrapOptions& o) {
  const int64_t space_left = width < 1 ? 1 : width - cur_len;
  if (o.break_long_words) {
    int64_t end = space_left;
    const U32 chunk = chunks.back();
    if (o.break_on_hyphens && length(chunk) > space_left) {
      // break after the last hyphen, but only if there are non-hyphens before it
      const size_t hyphen = chunk.substr(0, static_cast<size_t>(space_left)).rfind(U'-');
      if (hyphen != U32::npos && hyphen > 0 &&
          std::any_of(chunk.begin(), chunk.begin() + static_cast<std::ptrdiff_t>(hyphen), [](char32_t c) { return c != U'-'; })) {
        end = static_cast<int64_t>(hyphen) + 1;
      }
    }
    cur_line.push_back(chunk.substr(0, static_cast<size_t>(end)));
    chunks.back() = chunk.substr(static_cast<size_t>(end));
  } else if (cur_line.empty()) {
    cur_line.push_back(std::move(chunks.back()));
    chunks.pop_back();
  }
}

}  // namespace

// TextWrapper._wrap_chunks with no indents and max_lines None.
std::vector<std::string> text_wrap(std::string_view text, const WrapOptions& o) {
  const U32 t = to_u32(text);
  std::vector<U32> chunks = Chunker(t).split(o.split_on_hyphens);
  std::reverse(chunks.begin(), chunks.end());
  const int64_t width = o.width;
  std::vector<std::string> lines;
  while (!chunks.empty()) {
    std::vector<U32> cur_line;
    int64_t cur_len = 0;
    // First chunk on a line is whitespace: drop it, unless this is the very beginning.
    if (blank(chunks.back()) && !lines.empty()) chunks.pop_back();
    while (!chunks.empty() && cur_len + length(chunks.back()) <= width) {
      cur_len += length(chunks.back());
      cur_line.push_back(std::move(chunks.back()));
      chunks.pop_back();
    }
    if (!chunks.empty() && length(chunks.back()) > width) {
      handle_long_word(chunks, cur_line, cur_len, width, o);
      cur_len = 0;
      for (const U32& c : cur_line) cur_len += length(c);
    }
    if (!cur_line.empty() && blank(cur_line.back())) {
      cur_len -= length(cur_line.back());
      cur_line.pop_back();
    }
    if (!cur_line.empty()) {
      U32 line;
      for (const U32& c : cur_line) line += c;
      lines.push_back(to_utf8(line));
    }
  }
  return lines;
}

}  // namespace tessera::jinja::internal
