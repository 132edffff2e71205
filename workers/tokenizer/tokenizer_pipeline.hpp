// tokenizer_pipeline.hpp: the text-side stages of an HF tokenizer.json, as small functions built
// from JSON: normalizer (NFC, Prepend, Replace, Sequence; tokenizer_normalizer.cpp),
// pre-tokenizer (Split / ByteLevel / Metaspace / Sequence), decoder (ByteLevel, ByteFallback,
// Metaspace, Fuse, Replace, Strip, Sequence; tokenizer_decoder.cpp) and post-processor.
// Private to workers/tokenizer; Tokenizer (tokenizer.hpp) composes them.
//
// Each stage type is one entry in a table of parse functions; a type not in the table is an
// `unimplemented` error naming the file and field, never a silent skip. Offsets are not tracked
// (Tessera needs ids only), so ByteLevel's trim_offsets has no effect; the one offset HF reads
// while encoding, "does this piece start at byte 0 of the input" (Metaspace's prepend_scheme
// "first"), travels with each piece as PreToken::at_start.
//
// Known difference: HF's Replace (normalizer and decoder) also replaces empty regex matches;
// Tessera's TokenizerRegex skips them. No shipped tokenizer uses a pattern that can match empty.
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
#include "workers/tokenizer/tokenizer_regex.hpp"

namespace tessera::tokenizer {

/// GPT-2's byte -> printable character table, each entry a UTF-8 string (`bytes_to_unicode`).
const std::array<std::string, 256>& byte_to_unicode();

/// The byte whose GPT-2 character is `cp`, or -1 when `cp` is not one of the 256.
int unicode_to_byte(uint32_t cp);

/// The `pattern` member of a Split or Replace ({"Regex": ...} or {"String": ...}), compiled.
Result<TokenizerRegex> parse_regex_pattern(const nlohmann::json& j, const tokenizer_json::JsonPath& where);

/// A normalizer: text -> text (fails only when a regex match fails). Empty means "none".
using Normalizer = std::function<Result<std::string>(std::string_view)>;

/// Parses `normalizer` (nullptr or JSON null -> none): NFC, Prepend, Replace, Sequence.
Result<Normalizer> parse_normalizer(const nlohmann::json* j, const tokenizer_json::JsonPath& where);

/// One piece between pre-tokenizer steps.
struct PreToken {
  std::string text;
  bool at_start = false;  ///< Starts at byte 0 of the input (HF `offsets_original().0 == 0`).
};

/// One pre-tokenizer: splits a piece into pieces (ByteLevel also maps bytes to characters).
using PreTokenizeStep = std::function<Status(const PreToken& piece, std::vector<PreToken>& out)>;

/// HF Metaspace's settings; the pre-tokenizer and the decoder share one JSON form.
struct MetaspaceOptions {
  enum class Prepend { always, first, never };
  std::string replacement;                    ///< One character, as UTF-8 ("▁").
  Prepend prepend_scheme = Prepend::always;   ///< "always" / "first" / "never".
  bool split = true;                          ///< Pre-tokenizer only: split before each replacement.
};

/// Parses a Metaspace object: `replacement`, `prepend_scheme` (default "always"), `split`
/// (default true) and the legacy `add_prefix_space` (false means "never"; false with another
/// declared scheme is an error, as in HF) and `str_rep` (ignored).
Result<MetaspaceOptions> parse_metaspace_options(const nlohmann::json& j, const tokenizer_json::JsonPath& where);

/// A chain of pre-tokenizers applied to every piece in turn.
class PreTokenizer {
 public:
  /// Parses `pre_tokenizer` (nullptr or null -> the whole text is one piece).
  static Result<PreTokenizer> from_json(const nlohmann::json* j, const tokenizer_json::JsonPath& where);

  /// Replaces `pieces` with the pre-tokens of `text` (empty pieces are dropped). `at_start`:
  /// `text` begins at byte 0 of the whole input (not after an added token).
  Status run(std::string_view text, bool at_start, std::vector<std::string>& pieces) const;
  /// run() for a text that is the whole input.
  Status run(std::string_view text, std::vector<std::string>& pieces) const {
    return run(text, /*at_start=*/true, pieces);
  }

 private:
  std::vector<PreTokenizeStep> steps_;
};

/// A decoder chain: tokens -> tokens; the results are concatenated.
using TokenDecodeStep = std::function<std::vector<std::string>(std::vector<std::string>)>;

/// HF decoders: ByteLevel, ByteFallback, Metaspace, Fuse, Replace, Strip, Sequence; none joins
/// tokens with spaces.
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
