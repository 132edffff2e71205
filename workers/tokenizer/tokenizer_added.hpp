// tokenizer_added.hpp: HF's AddedVocabulary: the `added_tokens` of tokenizer.json, matched in the
// input before pre-tokenisation. Private to workers/tokenizer.
//
// Matching is leftmost-longest over the token contents (HF uses Aho-Corasick with
// MatchKind::LeftmostLongest). Tokens with normalized=false are matched in the raw text first;
// the text between them is then normalised and searched for normalized=true tokens (whose
// contents were normalised at load). lstrip/rstrip widen a match over adjacent White_Space;
// single_word drops a match that touches an alphanumeric character.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "proto/status.hpp"
#include "workers/tokenizer/tokenizer_json.hpp"

namespace tessera::tokenizer {

/// One entry of tokenizer.json's `added_tokens`.
struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

/// A stretch of input after added-token extraction: an added token id, or text for the model.
struct TextSegment {
  std::string text;       ///< The text (empty for a token segment).
  int32_t token_id = -1;  ///< >= 0 when this segment is an added token.
};

/// The added tokens and their matcher.
class AddedVocabulary {
 public:
  /// Parses `added_tokens`; `normalize` is applied to the contents of normalized=true tokens.
  static Result<AddedVocabulary> from_json(const nlohmann::json& tokens, const tokenizer_json::JsonPath& where,
                                           const std::function<Result<std::string>(std::string_view)>& normalize);

  /// Splits `text`, extracting tokens whose `normalized` flag equals `normalized`.
  Status split(std::string_view text, bool normalized, std::vector<TextSegment>& out) const;

  /// The token with this id, or nullptr.
  const AddedToken* find_id(int32_t id) const;
  /// The id of the token with this content.
  std::optional<int32_t> find_content(std::string_view content) const;
  /// All tokens, in file order.
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  struct Candidate {
    std::string pattern;  // content as matched (normalised when the token is normalized)
    size_t token;         // index into tokens_
  };
  Result<bool> accept(const AddedToken& t, std::string_view text, size_t begin, size_t end) const;
  void index();

  std::vector<AddedToken> tokens_;
  std::vector<std::string> patterns_;  // parallel to tokens_
  std::unordered_map<int32_t, size_t> by_id_;
  std::unordered_map<std::string, size_t> by_content_;
  // First byte -> candidates starting with it, longest first; one table per `normalized` value.
  std::vector<Candidate> by_first_byte_[2][256];
};

}  // namespace tessera::tokenizer
