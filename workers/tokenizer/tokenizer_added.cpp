// tokenizer_added.cpp: parsing and matching added tokens (HF AddedVocabulary::find_matches).
#include "workers/tokenizer/tokenizer_added.hpp"

#include <algorithm>

#include "workers/tokenizer/tokenizer_regex.hpp"
#include "workers/tokenizer/unicode.hpp"

namespace tessera::tokenizer {

using tokenizer_json::JsonPath;
using tokenizer_json::field_error;

namespace {

// Start of the character that ends just before byte `end` (ill-formed bytes count alone).
size_t last_char_start(std::string_view s, size_t end) {
  size_t start = end - 1;
  for (int k = 0; k < 3 && start > 0 && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80; ++k) --start;
  return unicode::decode_utf8(s, start).len == end - start ? start : end - 1;
}

bool white_space_at(std::string_view s, size_t pos, uint32_t* len) {
  const unicode::Utf8Char c = unicode::decode_utf8(s, pos);
  *len = c.len;
  return c.valid && unicode::is_white_space(c.cp);
}

// Rust's char::is_alphanumeric (Alphabetic or Numeric) for the character at `pos`.
Result<bool> alphanumeric_at(std::string_view s, size_t pos) {
  static const Result<TokenizerRegex> re = TokenizerRegex::compile("[\\p{Alphabetic}\\p{N}]", false);
  if (!re.ok()) return re.status();
  return re->matches_at(s, pos);
}

// HF space_leftmost_at_end: where the trailing White_Space run of s[0, end) begins.
size_t trailing_space_start(std::string_view s, size_t end) {
  while (end > 0) {
    const size_t start = last_char_start(s, end);
    uint32_t len = 0;
    if (!white_space_at(s, start, &len)) break;
    end = start;
  }
  return end;
}

// HF space_rightmost_at_start: how many bytes of White_Space start at s[pos].
size_t leading_space_length(std::string_view s, size_t pos) {
  size_t p = pos;
  uint32_t len = 0;
  while (p < s.size() && white_space_at(s, p, &len)) p += len;
  return p - pos;
}

Result<AddedToken> parse_added_token(const nlohmann::json& j, const JsonPath& p) {
  AddedToken t;
  TESSERA_ASSIGN_OR_RETURN(const nlohmann::json* id, tokenizer_json::member(j, p, "id"));
  if (!id->is_number_integer() || id->get<int64_t>() < 0 || id->get<int64_t>() >= (int64_t{1} << 24)) {
    return field_error(p / "id", "expected an id in [0, 2^24)");
  }
  t.id = id->get<int32_t>();
  TESSERA_ASSIGN_OR_RETURN(t.content, tokenizer_json::string_member(j, p, "content"));
  if (t.content.empty()) return field_error(p / "content", "empty token");
  TESSERA_ASSIGN_OR_RETURN(t.special, tokenizer_json::bool_member(j, p, "special", false));
  TESSERA_ASSIGN_OR_RETURN(t.lstrip, tokenizer_json::bool_member(j, p, "lstrip", false));
  TESSERA_ASSIGN_OR_RETURN(t.rstrip, tokenizer_json::bool_member(j, p, "rstrip", false));
  TESSERA_ASSIGN_OR_RETURN(t.single_word, tokenizer_json::bool_member(j, p, "single_word", false));
  TESSERA_ASSIGN_OR_RETURN(t.normalized, tokenizer_json::bool_member(j, p, "normalized", !t.special));
  return t;
}

}  // namespace

Result<AddedVocabulary> AddedVocabulary::from_json(
    const nlohmann::json& tokens, const JsonPath& where,
    const std::function<Result<std::string>(std::string_view)>& normalize) {
  if (!tokens.is_array()) return field_error(where, "expected an array");
  AddedVocabulary v;
  for (size_t i = 0; i < tokens.size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(AddedToken t, parse_added_token(tokens[i], where.at(i)));
    if (v.by_id_.count(t.id) != 0) return field_error(where.at(i) / "id", fmt::format("duplicate id {}", t.id));
    v.by_id_.emplace(t.id, v.tokens_.size());
    v.by_content_.emplace(t.content, v.tokens_.size());
    std::string pattern = t.content;
    if (t.normalized && normalize) {
      TESSERA_ASSIGN_OR_RETURN(pattern, normalize(t.content));
    }
    v.patterns_.push_back(std::move(pattern));
    v.tokens_.push_back(std::move(t));
  }
  v.index();
  return v;
}

void AddedVocabulary::index() {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const std::string& pattern = patterns_[i];
    if (pattern.empty()) continue;
    by_first_byte_[tokens_[i].normalized ? 1 : 0][static_cast<uint8_t>(pattern[0])].push_back({pattern, i});
  }
  for (auto& table : by_first_byte_) {
    for (auto& list : table) {
      std::stable_sort(list.begin(), list.end(), [](const Candidate& a, const Candidate& b) {
        return a.pattern.size() > b.pattern.size();
      });
    }
  }
}

Result<bool> AddedVocabulary::accept(const AddedToken& t, std::string_view text, size_t begin, size_t end) const {
  if (!t.single_word) return true;
  if (begin > 0) {
    TESSERA_ASSIGN_OR_RETURN(bool word_before, alphanumeric_at(text, last_char_start(text, begin)));
    if (word_before) return false;
  }
  if (end < text.size()) {
    TESSERA_ASSIGN_OR_RETURN(bool word_after, alphanumeric_at(text, end));
    if (word_after) return false;
  }
  return true;
}

Status AddedVocabulary::split(std::string_view text, bool normalized, std::vector<TextSegment>& out) const {
  const auto& table = by_first_byte_[normalized ? 1 : 0];
  size_t emitted = 0;  // text before this offset is already in `out`
  size_t pos = 0;
  while (pos < text.size()) {
    const Candidate* hit = nullptr;
    for (const Candidate& c : table[static_cast<uint8_t>(text[pos])]) {
      if (text.compare(pos, c.pattern.size(), c.pattern) == 0) {
        hit = &c;
        break;
      }
    }
    if (hit == nullptr) {
      ++pos;
      continue;
    }
    const AddedToken& t = tokens_[hit->token];
    size_t begin = pos, end = pos + hit->pattern.size();
    TESSERA_ASSIGN_OR_RETURN(bool ok, accept(t, text, begin, end));
    if (!ok) {
      pos = end;
      continue;
    }
    if (t.lstrip) begin = std::max(trailing_space_start(text, begin), emitted);
    if (t.rstrip) end += leading_space_length(text, end);
    if (begin > emitted) out.push_back({std::string(text.substr(emitted, begin - emitted)), -1});
    out.push_back({std::string(), t.id});
    emitted = pos = end;
  }
  if (emitted < text.size()) out.push_back({std::string(text.substr(emitted)), -1});
  return Status();
}

const AddedToken* AddedVocabulary::find_id(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<int32_t> AddedVocabulary::find_content(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  if (it == by_content_.end()) return std::nullopt;
  return tokens_[it->second].id;
}

}  // namespace tessera::tokenizer
