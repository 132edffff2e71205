// tokenizer_normalizer.cpp: HF normalizers (NFC, Prepend, Replace, Sequence).
//
// SentencePiece-converted tokenizers spell spaces as "▁" here: Gemma's normalizer is
// Replace(" " -> "▁"); Llama-2 / Mistral (legacy conversion) use Sequence[Prepend("▁"),
// Replace(" " -> "▁")]. The normalizer runs once per stretch of text between added tokens
// (tokenizer.cpp), so Prepend puts a "▁" after every special token too, exactly as HF does.
#include <map>
#include <memory>
#include <utility>

#include "workers/tokenizer/tokenizer_pipeline.hpp"
#include "workers/tokenizer/unicode.hpp"

namespace tessera::tokenizer {

using tokenizer_json::JsonPath;
using tokenizer_json::field_error;
using tokenizer_json::unsupported_error;

namespace {

using NormalizerParser = Result<Normalizer> (*)(const nlohmann::json&, const JsonPath&);

Result<Normalizer> parse_nfc(const nlohmann::json&, const JsonPath&) {
  return Normalizer([](std::string_view s) -> Result<std::string> { return unicode::nfc(s); });
}

// HF Prepend: adds `prepend` in front of non-empty text.
Result<Normalizer> parse_prepend(const nlohmann::json& j, const JsonPath& where) {
  TESSERA_ASSIGN_OR_RETURN(std::string prepend, tokenizer_json::string_member(j, where, "prepend"));
  return Normalizer([prepend](std::string_view s) -> Result<std::string> {
    if (s.empty()) return std::string();
    return prepend + std::string(s);
  });
}

// HF Replace: every match of `pattern` (a literal String or a Regex) becomes `content`.
Result<Normalizer> parse_replace(const nlohmann::json& j, const JsonPath& where) {
  TESSERA_ASSIGN_OR_RETURN(TokenizerRegex re, parse_regex_pattern(j, where));
  TESSERA_ASSIGN_OR_RETURN(std::string content, tokenizer_json::string_member(j, where, "content"));
  auto shared = std::make_shared<const TokenizerRegex>(std::move(re));
  return Normalizer([shared, content](std::string_view s) { return shared->replace_all(s, content); });
}

Result<Normalizer> parse_normalizer_sequence(const nlohmann::json& j, const JsonPath& where) {
  TESSERA_ASSIGN_OR_RETURN(const nlohmann::json* list, tokenizer_json::member(j, where, "normalizers"));
  if (!list->is_array()) return field_error(where / "normalizers", "expected an array");
  std::vector<Normalizer> chain;
  for (size_t i = 0; i < list->size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(Normalizer n, parse_normalizer(&(*list)[i], (where / "normalizers").at(i)));
    if (n) chain.push_back(std::move(n));
  }
  return Normalizer([chain](std::string_view s) -> Result<std::string> {
    std::string text(s);
    for (const auto& n : chain) {
      TESSERA_ASSIGN_OR_RETURN(text, n(text));
    }
    return text;
  });
}

const std::map<std::string, NormalizerParser>& normalizer_parsers() {
  static const std::map<std::string, NormalizerParser> table = {
      {"NFC", parse_nfc},
      {"Prepend", parse_prepend},
      {"Replace", parse_replace},
      {"Sequence", parse_normalizer_sequence},
  };
  return table;
}

}  // namespace

Result<Normalizer> parse_normalizer(const nlohmann::json* j, const JsonPath& where) {
  if (j == nullptr || j->is_null()) return Normalizer();
  TESSERA_ASSIGN_OR_RETURN(std::string type, tokenizer_json::string_member(*j, where, "type"));
  auto it = normalizer_parsers().find(type);
  if (it == normalizer_parsers().end()) {
    return unsupported_error(where / "type",
                             fmt::format("normalizer '{}' is not supported (NFC, Prepend, Replace, Sequence)", type));
  }
  return it->second(*j, where);
}

}  // namespace tessera::tokenizer
