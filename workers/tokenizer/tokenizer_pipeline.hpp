// tokenizer_pipeline.hpp: the text-side stages of an HF tokenizer.json, as small functions built
// from JSON: normalizer, pre-tokenizer (Split / ByteLevel / Sequence), decoder and
// post-processor. Private to workers/models; Tokenizer (tokenizer.hpp) composes them.
//
// Each stage type is one entry in a table of parse functions (tokenizer_pipeline.cpp); a type
// not in the table is an `unimplemented` error naming the file and field, never a silent skip.
// Offsets are not tracked (Tessera needs ids only), so ByteLevel's trim_offsets has no effect.
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "proto/status.hpp"
#include "workers/tokenizer/tokenizer_json.hpp"

namespace tessera::tokenizer {

/// GPT-2's byte -> printable character table, each entry a UTF-8 string (`bytes_to_unicode`).
const std::array<std::string, 256>& byte_to_unicode();

/// The byte whose GPT-2 character is `cp`, or -1 when `cp` is not one of the 256.
int unicode_to_byte(uint32_t cp);

/// A normalizer: text -> text. An empty function means "none".
using Normalizer = std::function<std::string(std::string_view)>;

/// Parses `normalizer` (nullptr or JSON null -> none). Supports NFC and Sequence.
Result<Normalizer> parse_normalizer(const nlohmann::json* j, const tokenizer_json::JsonPath& where);

/// One pre-tokenizer: splits a piece into pieces (ByteLevel also maps bytes to characters).
using PreTokenizeStep = std::function<Status(std::string_view piece, std::vector<std::string>& out)>;

/// A chain of pre-tokenizers applied to every piece in turn.
class PreTokenizer {
 public:
  /// Parses `pre_tokenizer` (nullptr or null -> the whole text is one piece).
  static Result<PreTokenizer> from_json(const nlohmann::json* j, const tokenizer_json::JsonPath& where);

  /// Replaces `pieces` with the pre-tokens of `text` (empty pieces are dropped).
  Status run(std::string_view text, std::vector<std::string>& pieces) const;

 private:
  std::vector<PreTokenizeStep> steps_;
};

/// A decoder chain: tokens -> tokens; the results are concatenated.
using TokenDecodeStep = std::function<std::vector<std::string>(std::vector<std::string>)>;

/// HF decoders: ByteLevel, Fuse, Replace, Strip, Sequence; none joins tokens with spaces.
class TokenDecoder {
 public:
  /// Parses `decoder` (nullptr or null -> join with " ", as HF does without a decoder).
  static Result<TokenDecoder> from_json(const nlohmann::json* j, const tokenizer_json::JsonPath& where);

  /// The text of `tokens` (raw bytes; ByteLevel output may be ill-formed UTF-8).
  std::string decode(std::vector<std::string> tokens) const;

 private:
  bool has_decoder_ = false;
  std::vector<TokenDecodeStep> steps_;
};

/// What `add_special_tokens` adds around a single sequence: ByteLevel (nothing),
/// TemplateProcessing (`single` template) or a Sequence of them.
class PostProcessor {
 public:
  /// Parses `post_processor` (nullptr or null -> nothing added).
  static Result<PostProcessor> from_json(const nlohmann::json* j, const tokenizer_json::JsonPath& where);

  /// `ids` wrapped by the template(s).
  std::vector<int32_t> apply(std::vector<int32_t> ids) const;

 private:
  // Each template item is a list of special ids, or the sequence itself when `is_sequence`.
  struct Item {
    bool is_sequence = false;
    std::vector<int32_t> ids;
  };
  std::vector<std::vector<Item>> templates_;
  friend struct PostProcessorParser;
};

}  // namespace tessera::tokenizer
