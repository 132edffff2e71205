// tokenizer_bpe.hpp: the `BPE` model of HF tokenizer.json (vocab + ranked merges), with a word
// cache. Private to workers/tokenizer; Tokenizer (tokenizer.hpp) is the public face.
//
// A word (one pre-token) is split into characters, each looked up in the vocab (with
// continuing_subword_prefix / end_of_word_suffix as configured); then adjacent pairs are merged
// lowest rank first, leftmost on ties, exactly as HF's `Word::merge_all`. For byte-level
// tokenizers the "characters" are the GPT-2 byte-to-unicode symbols, so none is ever unknown.
// With `byte_fallback` (SentencePiece conversions: Llama-2, Mistral, Gemma) a character missing
// from the vocab becomes one "<0xXX>" token per UTF-8 byte, when all of those exist. Otherwise
// it becomes unk_token (runs fused when fuse_unk); unlike HF (which silently drops it) a model
// without unk_token returns an error naming the character. `dropout` must be null (or 0).
//
// Thread safety: const methods may be called concurrently; the cache takes a mutex.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "proto/status.hpp"
#include "workers/tokenizer/tokenizer_json.hpp"

namespace tessera::tokenizer {

class BpeWordCache;

/// HF `BPE` model: vocab, merges and the per-word algorithm.
class BpeModel {
 public:
  /// Words longer than this many bytes are not cached (HF's MAX_LENGTH).
  static constexpr size_t kMaxCachedWordBytes = 256;
  /// Default number of cached words.
  static constexpr size_t kDefaultCacheCapacity = 10000;

  /// Parses tokenizer.json's `model` object (type "BPE"). Merges may be "a b" strings or
  /// ["a", "b"] pairs; every merge part and result must be in the vocab.
  static Result<BpeModel> from_json(const nlohmann::json& model, const tokenizer_json::JsonPath& where);

  BpeModel(BpeModel&&) noexcept;
  BpeModel& operator=(BpeModel&&) noexcept;
  ~BpeModel();

  /// Appends the ids of one pre-token. Fails only on a character with no vocab entry and no unk.
  Status encode_word(std::string_view word, std::vector<int32_t>& out) const;

  /// The id of a vocab token.
  std::optional<int32_t> token_to_id(std::string_view token) const;
  /// The vocab token of `id`, or nullptr.
  const std::string* id_to_token(int32_t id) const;
  /// Largest id in the vocab, or -1 when empty.
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  BpeModel();
  Status build_word(std::string_view word, std::vector<int32_t>& symbols) const;
  void index_byte_tokens();
  // Appends the byte tokens of `key` when byte_fallback is on and all of them exist.
  bool append_byte_tokens(std::string_view key, std::vector<int32_t>& symbols) const;
  void merge_all(std::vector<int32_t>& symbols) const;
  Status add_merge(const std::string& a, const std::string& b, int32_t rank,
                   const tokenizer_json::JsonPath& where);

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::vector<int32_t> byte_ids_;  // byte -> id of "<0xXX>" (-1: absent); empty without byte_fallback
  std::optional<int32_t> unk_id_;
  std::string unk_token_;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  std::string source_;
  std::unique_ptr<BpeWordCache> cache_;
};

}  // namespace tessera::tokenizer
