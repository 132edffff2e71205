// tokenizer_regex.cpp: PCRE2 (8-bit, JIT when available). See Note [Regex dialect].
#define PCRE2_CODE_UNIT_WIDTH 8
#include "workers/tokenizer/tokenizer_regex.hpp"

#include <pcre2.h>

#include "workers/tokenizer/unicode.hpp"

namespace tessera::tokenizer {

struct TokenizerRegex::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

namespace {

std::string pcre2_message(int rc) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(rc, buffer, sizeof(buffer)) < 0) return "error " + std::to_string(rc);
  return reinterpret_cast<const char*>(buffer);
}

struct MatchData {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  ~MatchData() { pcre2_match_data_free(data); }
};

// Runs one match from `start`; returns the PCRE2 code (>= 0 on a match). Falls back from JIT to
// the interpreter when the JIT stack is too small for a long subject.
int run_match(const pcre2_code* code, std::string_view text, size_t start, uint32_t options,
              pcre2_match_data* md) {
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  int rc = pcre2_match(code, subject, text.size(), start, options, md, nullptr);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
    rc = pcre2_match(code, subject, text.size(), start, options | PCRE2_NO_JIT, md, nullptr);
  }
  return rc;
}

}  // namespace

std::string to_pcre2_dialect(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 32);
  bool quoted = false;  // inside \Q ... \E everything is literal
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c != '\\' || i + 1 == pattern.size()) {
      out.push_back(c);
      continue;
    }
    const char next = pattern[++i];
    if (quoted && next != 'E') {
      out.push_back(c);
      out.push_back(next);
      continue;
    }
    if (next == 'Q') quoted = true;
    if (next == 'E') quoted = false;
    if (!quoted && next == 's') {
      out += "\\p{White_Space}";
    } else if (!quoted && next == 'S') {
      out += "\\P{White_Space}";
    } else {
      out.push_back(c);
      out.push_back(next);
    }
  }
  return out;
}

Result<TokenizerRegex> TokenizerRegex::compile(std::string_view pattern, bool literal) {
  const std::string source = literal ? std::string(pattern) : to_pcre2_dialect(pattern);
  const uint32_t options = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF |
                           (literal ? PCRE2_LITERAL : PCRE2_UCP);
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source.data()), source.size(),
                                   options, &error, &offset, nullptr);
  if (code == nullptr) {
    return make_error(ErrorCode::corrupt_data, "bad regex /{}/ at offset {}: {}", pattern, offset,
                      pcre2_message(error));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional: failure leaves the interpreter
  auto holder = std::make_shared<Code>();
  holder->code = code;
  TokenizerRegex re;
  re.code_ = std::move(holder);
  return re;
}

Status TokenizerRegex::find_all(std::string_view text,
                                std::vector<std::pair<size_t, size_t>>& out) const {
  MatchData md;
  if (md.data == nullptr) return make_error(ErrorCode::internal, "regex: out of memory");
  size_t start = 0;
  while (start <= text.size()) {
    const int rc = run_match(code_->code, text, start, 0, md.data);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) return make_error(ErrorCode::internal, "regex match failed: {}", pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.data);
    const size_t begin = ov[0], end = ov[1];
    if (end > begin) {
      out.emplace_back(begin, end);
      start = end;
    } else {
      if (begin >= text.size()) break;
      start = begin + unicode::decode_utf8(text, begin).len;
    }
  }
  return Status();
}

Result<std::string> TokenizerRegex::replace_all(std::string_view text, std::string_view content) const {
  std::vector<std::pair<size_t, size_t>> matches;
  TESSERA_RETURN_IF_ERROR(find_all(text, matches));
  if (matches.empty()) return std::string(text);
  std::string out;
  out.reserve(text.size() + matches.size() * content.size());
  size_t prev = 0;
  for (const auto& [b, e] : matches) {
    out.append(text.substr(prev, b - prev)).append(content);
    prev = e;
  }
  out.append(text.substr(prev));
  return out;
}

Result<bool> TokenizerRegex::matches_at(std::string_view text, size_t pos) const {
  MatchData md;
  if (md.data == nullptr) return make_error(ErrorCode::internal, "regex: out of memory");
  const int rc = run_match(code_->code, text, pos, PCRE2_ANCHORED, md.data);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) return make_error(ErrorCode::internal, "regex match failed: {}", pcre2_message(rc));
  return true;
}

}  // namespace tessera::tokenizer
