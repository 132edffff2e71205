// tokenizer_regex.hpp: the PCRE2 wrapper behind `Split`, `ByteLevel` and `Replace`.
// Private to workers/tokenizer.
//
// Note [Regex dialect]
// HF tokenizers compiles tokenizer.json patterns with Oniguruma; Tessera uses PCRE2 10.42 with
// PCRE2_UTF | PCRE2_UCP, whose \p{L}, \p{N}, (?i:…), lookahead and leftmost-first alternation
// agree with Oniguruma on the patterns GPT-2, Llama-3 and Qwen2/3 ship. The one class that
// differs is \s: PCRE2 also counts U+180E as space, Oniguruma uses Unicode White_Space. We
// therefore rewrite \s and \S to \p{White_Space} and \P{White_Space} before compiling.
// PCRE2_MATCH_INVALID_UTF lets ill-formed bytes through: they match nothing, so a Split leaves
// them in the gaps between matches rather than failing the whole encode.
// Empty matches follow Oniguruma's find_iter: after one, the search resumes one character on.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "proto/status.hpp"

namespace tessera::tokenizer {

/// A compiled pattern, shareable across threads (matching allocates its own scratch space).
class TokenizerRegex {
 public:
  /// Compiles `pattern` (a regex, or a literal string when `literal`). Errors name the offset.
  static Result<TokenizerRegex> compile(std::string_view pattern, bool literal);

  /// Appends the [begin, end) byte ranges of successive non-empty, non-overlapping matches.
  Status find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

  /// `text` with every match find_all reports replaced by `content` (HF Replace).
  Result<std::string> replace_all(std::string_view text, std::string_view content) const;

  /// True when the pattern matches at exactly byte `pos` of `text` (anchored there).
  Result<bool> matches_at(std::string_view text, size_t pos) const;

 private:
  struct Code;
  std::shared_ptr<const Code> code_;
};

/// `pattern` with \s / \S rewritten to Unicode White_Space (see Note [Regex dialect]).
std::string to_pcre2_dialect(std::string_view pattern);

}  // namespace tessera::tokenizer
