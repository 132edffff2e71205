// tokenizer.hpp: Tessera's one tokenizer: an HF `tokenizer.json` (BPE model; byte-level as in
// GPT-2 / Llama-3 / Qwen2 / Qwen3, SentencePiece-converted with byte_fallback as in Llama-2 /
// Mistral / Gemma, or plain characters) plus `tokenizer_config.json`.
//
// There is ONE loading path. Real checkpoints ship these two files; `tessera init-model` writes
// them with the writers at the bottom of this header (a 256-byte tokenizer or a character
// tokenizer), so built-in tasks load exactly like Qwen3 does.
//
// encode(text) follows HF `tokenizers` step by step: added tokens are cut out first
// (leftmost-longest; see tokenizer_added.hpp), the rest is normalised (NFC / Prepend / Replace),
// pre-tokenised (Split regex / ByteLevel / Metaspace), and each pre-token goes through BPE (with
// a word cache). Every
// stage type Tessera does not implement is refused when the file is loaded, naming the file
// and field, rather than ignored. Decoding returns raw bytes: a byte-level tokenizer can round
// trip arbitrary bytes, and DecodeOptions::lossy_utf8 gives HF's U+FFFD repair instead.
//
// Thread safety: a loaded Tokenizer is immutable apart from an internal, locked word cache;
// copies share state, and all const methods may be called from any thread.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "proto/status.hpp"

namespace tessera::tokenizer {

/// The fields of `tokenizer_config.json` Tessera uses. Absent fields keep these defaults.
struct TokenizerConfig {
  std::optional<std::string> bos_token;  ///< String, or the `content` of an AddedToken object.
  std::optional<std::string> eos_token;
  std::optional<std::string> pad_token;
  std::optional<std::string> unk_token;
  bool add_bos_token = false;  ///< Reported only: encode() adds what tokenizer.json's post_processor says.
  bool add_eos_token = false;  ///< Reported only, like add_bos_token.
  std::optional<std::string> chat_template;  ///< Jinja text (the "default" one when a list is given).
  std::string chat_template_file;            ///< The file chat_template came from (for errors).
  std::optional<int64_t> model_max_length;   ///< Clamped to int64 (HF writes 1e30 for "unlimited").
  bool clean_up_tokenization_spaces = false; ///< When true, decode() applies HF's clean-up.
  std::string source;                        ///< Path of the file read ("" when defaulted).
};

/// Parses a tokenizer_config.json object; `source` names the file in errors.
Result<TokenizerConfig> parse_tokenizer_config(const nlohmann::json& j, const std::string& source);

/// Reads `dir`/tokenizer_config.json (all defaults when absent) and, if present,
/// `dir`/chat_template.jinja, which takes precedence over the JSON's chat_template. Without an
/// added_tokens_decoder in the JSON (older checkpoints), `dir`/special_tokens_map.json's bos, eos,
/// pad and unk tokens override its own, as transformers' from_pretrained reads them.
Result<TokenizerConfig> read_tokenizer_config(const std::filesystem::path& dir);

/// Options for Tokenizer::encode.
struct EncodeOptions {
  bool add_special_tokens = false;  ///< Apply tokenizer.json's post_processor (e.g. Llama-3's BOS).
};

/// Options for Tokenizer::decode.
struct DecodeOptions {
  bool skip_special_tokens = false;  ///< Drop added tokens marked `special`.
  bool lossy_utf8 = false;           ///< Replace ill-formed UTF-8 with U+FFFD (HF behaviour).
};

class TokenizerImpl;

/// A loaded tokenizer.json (+ tokenizer_config.json).
class Tokenizer {
 public:
  /// Loads `dir`/tokenizer.json and the config files beside it (see read_tokenizer_config).
  /// The config's bos/eos/pad/unk tokens must exist in the vocabulary.
  static Result<Tokenizer> from_dir(const std::filesystem::path& dir);

  /// verl's hf_tokenizer (verl/utils/tokenizer.py): from_dir, and for a path naming gemma-2-2b-it
  /// the eos token <end_of_turn> (verl's correction: that model's <eos> is ambiguous in chats).
  /// `corrected` (optional) says whether the correction applied, for the caller to report it.
  static Result<Tokenizer> from_dir_as_verl(const std::filesystem::path& dir, bool* corrected = nullptr);

  /// Loads one tokenizer.json with a default TokenizerConfig.
  static Result<Tokenizer> from_file(const std::filesystem::path& tokenizer_json);

  /// Builds from parsed tokenizer.json; `source` names it in errors.
  static Result<Tokenizer> from_json(const nlohmann::json& j, const std::string& source,
                                     TokenizerConfig config = {});

  /// The ids of `text` (HF `encode(text, add_special_tokens=...)`). `text` may hold any bytes.
  Result<std::vector<int32_t>> encode(std::string_view text, const EncodeOptions& options = {}) const;

  /// The text of `ids`. An id at or above the vocabulary with no added token there contributes
  /// nothing, as in HF tokenizers: models pad their embedding past the tokenizer (Qwen2.5: 151936
  /// rows, 151669 tokens) and a sampler may draw a padding row. A negative id is an error.
  Result<std::string> decode(const std::vector<int32_t>& ids, const DecodeOptions& options = {}) const;

  /// The id of a vocab entry or added token (exact string, byte-level form for vocab entries).
  std::optional<int32_t> token_to_id(std::string_view token) const;
  /// The string of a vocab entry or added token; not_found for an unknown id.
  Result<std::string> id_to_token(int32_t id) const;
  /// Largest id + 1 over the vocab and added tokens: the smallest embedding that fits.
  int32_t vocab_size() const;
  /// True for added tokens marked `special`.
  bool is_special(int32_t id) const;

  /// Ids of the config's special tokens (nullopt when the config names none).
  std::optional<int32_t> bos_token_id() const;
  std::optional<int32_t> eos_token_id() const;
  std::optional<int32_t> pad_token_id() const;

  /// The parsed tokenizer_config.json.
  const TokenizerConfig& config() const;
  /// The tokenizer.json path (or the name given to from_json).
  const std::string& source() const;

 private:
  explicit Tokenizer(std::shared_ptr<const TokenizerImpl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const TokenizerImpl> impl_;
};

// ---- Writers (used by `tessera init-model`) ----------------------------------------------

/// The special tokens every written tokenizer gets, in id order after the base tokens.
inline constexpr const char* kWrittenSpecialTokens[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>",
                                                        "<|pad|>"};
/// The unknown-character token of written character tokenizers (the id after the specials).
inline constexpr const char* kWrittenUnkToken = "<|unk|>";

/// HF's classic ChatML Jinja template; `auto` chat templates recognise it as ChatML.
extern const char kChatmlJinjaTemplate[];

/// A tokenizer.json with the 256 GPT-2 byte symbols as ids 0..255, no merges, ByteLevel
/// pre-tokenizer (use_regex=false) and decoder, then kWrittenSpecialTokens as ids 256..259.
Result<nlohmann::json> make_byte_tokenizer_json();

/// A tokenizer.json with one id per distinct UTF-8 character of `alphabet` (in order of
/// first appearance), then kWrittenSpecialTokens, then kWrittenUnkToken as unk; no
/// pre-tokenizer, Fuse decoder. Errors on an empty or ill-formed `alphabet`.
Result<nlohmann::json> make_char_tokenizer_json(const std::string& alphabet);

/// What `write_tokenizer_files` writes.
struct TokenizerSpec {
  enum class Kind { byte, chars };
  Kind kind = Kind::byte;
  std::string alphabet;                   ///< Kind::chars only: the characters to give ids.
  std::string eos_token = "<|im_end|>";   ///< Must be one of kWrittenSpecialTokens.
  std::string pad_token = "<|pad|>";      ///< Must be one of kWrittenSpecialTokens.
  int64_t model_max_length = 2048;
  bool chatml_template = true;            ///< Write kChatmlJinjaTemplate as chat_template.
};

/// The tokenizer_config.json for `spec` (bos none, add_bos_token false, eos/pad/unk tokens,
/// model_max_length, chat_template).
Result<nlohmann::json> make_tokenizer_config_json(const TokenizerSpec& spec);

/// Writes `dir`/tokenizer.json and `dir`/tokenizer_config.json (creating `dir`), each through a
/// temporary file renamed into place, then loads them back to check they parse.
Status write_tokenizer_files(const TokenizerSpec& spec, const std::filesystem::path& dir);

}  // namespace tessera::tokenizer
