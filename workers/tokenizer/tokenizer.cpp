// tokenizer.cpp: loading tokenizer.json into its stages and running encode/decode through them
// in HF's order (added tokens -> normalizer -> normalized added tokens -> pre-tokenizer -> BPE).
#include "workers/tokenizer/tokenizer.hpp"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "workers/tokenizer/tokenizer_added.hpp"
#include "workers/tokenizer/tokenizer_bpe.hpp"
#include "workers/tokenizer/tokenizer_json.hpp"
#include "workers/tokenizer/tokenizer_pipeline.hpp"
#include "workers/tokenizer/unicode.hpp"

namespace tessera::tokenizer {

using tokenizer_json::JsonPath;
using tokenizer_json::unsupported_error;

/// Everything a loaded Tokenizer holds.
class TokenizerImpl {
 public:
  explicit TokenizerImpl(BpeModel m) : model(std::move(m)) {}

  std::string source;
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  BpeModel model;
  AddedVocabulary added;
  TokenDecoder decoder;
  PostProcessor post_processor;
  TokenizerConfig config;
  std::optional<int32_t> bos_id, eos_id, pad_id;
  int32_t vocab_size = 0;
};

namespace {

// Resolves a config token ("eos_token" -> id); an error when the vocabulary lacks it.
Result<std::optional<int32_t>> resolve_config_token(const Tokenizer& tok, const std::optional<std::string>& token,
                                                    const char* field) {
  if (!token) return std::optional<int32_t>();
  auto id = tok.token_to_id(*token);
  if (!id) {
    return make_error(ErrorCode::corrupt_data, "{}: {} '{}' is not in the vocabulary of {}",
                      tok.config().source.empty() ? "tokenizer config" : tok.config().source, field, *token,
                      tok.source());
  }
  return id;
}

Status check_no_truncation_or_padding(const nlohmann::json& j, const JsonPath& root) {
  for (const char* key : {"truncation", "padding"}) {
    if (tokenizer_json::optional_member(j, key) != nullptr) {
      return unsupported_error(root / key, "must be null (Tessera truncates and pads outside the tokenizer)");
    }
  }
  return Status();
}

// HF transformers' clean_up_tokenization.
std::string clean_up_tokenization(std::string text) {
  static const std::pair<const char*, const char*> kRules[] = {
      {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kRules) {
    std::string out;
    const std::string_view f(from);
    size_t prev = 0;
    for (size_t at = text.find(f); at != std::string::npos; at = text.find(f, prev)) {
      out.append(text, prev, at - prev).append(to);
      prev = at + f.size();
    }
    out.append(text, prev, std::string::npos);
    text = std::move(out);
  }
  return text;
}

}  // namespace

Result<Tokenizer> Tokenizer::from_json(const nlohmann::json& j, const std::string& source, TokenizerConfig config) {
  const JsonPath root{source, ""};
  if (!j.is_object()) return make_error(ErrorCode::corrupt_data, "{}: expected a JSON object", source);
  TESSERA_RETURN_IF_ERROR(check_no_truncation_or_padding(j, root));
  TESSERA_ASSIGN_OR_RETURN(const nlohmann::json* model_json, tokenizer_json::member(j, root, "model"));
  TESSERA_ASSIGN_OR_RETURN(BpeModel model, BpeModel::from_json(*model_json, root / "model"));
  auto impl = std::make_shared<TokenizerImpl>(std::move(model));
  impl->source = source;
  TESSERA_ASSIGN_OR_RETURN(impl->normalizer, parse_normalizer(tokenizer_json::optional_member(j, "normalizer"), root / "normalizer"));
  const nlohmann::json empty = nlohmann::json::array();
  const nlohmann::json* added = tokenizer_json::optional_member(j, "added_tokens");
  TESSERA_ASSIGN_OR_RETURN(impl->added, AddedVocabulary::from_json(added ? *added : empty, root / "added_tokens", impl->normalizer));
  TESSERA_ASSIGN_OR_RETURN(impl->pre_tokenizer, PreTokenizer::from_json(tokenizer_json::optional_member(j, "pre_tokenizer"), root / "pre_tokenizer"));
  TESSERA_ASSIGN_OR_RETURN(impl->decoder, TokenDecoder::from_json(tokenizer_json::optional_member(j, "decoder"), root / "decoder"));
  TESSERA_ASSIGN_OR_RETURN(impl->post_processor, PostProcessor::from_json(tokenizer_json::optional_member(j, "post_processor"), root / "post_processor"));
  impl->vocab_size = impl->model.max_id() + 1;
  for (const auto& t : impl->added.tokens()) impl->vocab_size = std::max(impl->vocab_size, t.id + 1);
  impl->config = std::move(config);
  Tokenizer tok(impl);
  TESSERA_ASSIGN_OR_RETURN(impl->bos_id, resolve_config_token(tok, impl->config.bos_token, "bos_token"));
  TESSERA_ASSIGN_OR_RETURN(impl->eos_id, resolve_config_token(tok, impl->config.eos_token, "eos_token"));
  TESSERA_ASSIGN_OR_RETURN(impl->pad_id, resolve_config_token(tok, impl->config.pad_token, "pad_token"));
  TESSERA_ASSIGN_OR_RETURN(auto unk_id, resolve_config_token(tok, impl->config.unk_token, "unk_token"));
  (void)unk_id;  // checked for existence only; BPE's own unk_token is what encode uses
  return tok;
}

Result<Tokenizer> Tokenizer::from_file(const std::filesystem::path& tokenizer_json) {
  TESSERA_ASSIGN_OR_RETURN(nlohmann::json j, tokenizer_json::read_json_file(tokenizer_json.string()));
  return from_json(j, tokenizer_json.string());
}

Result<Tokenizer> Tokenizer::from_dir(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    const std::string d = dir.string();
    const bool repo_id = std::count(d.begin(), d.end(), '/') == 1 && d.front() != '/' && d.front() != '.';
    return make_error(ErrorCode::not_found, "{}: no such directory{}", d,
                      repo_id ? fmt::format(" (a Hugging Face repo id is read from the local cache, never downloaded: "
                                            "fetch it with `huggingface-cli download {}`)", d)
                              : std::string());
  }
  const std::string file = (dir / "tokenizer.json").string();
  TESSERA_ASSIGN_OR_RETURN(nlohmann::json j, tokenizer_json::read_json_file(file));
  TESSERA_ASSIGN_OR_RETURN(TokenizerConfig config, read_tokenizer_config(dir));
  return from_json(j, file, std::move(config));
}

Result<Tokenizer> Tokenizer::from_dir_as_verl(const std::filesystem::path& dir, bool* corrected) {
  if (corrected != nullptr) *corrected = false;
  if (dir.string().find("gemma-2-2b-it") == std::string::npos) return from_dir(dir);
  TESSERA_ASSIGN_OR_RETURN(Tokenizer loaded, from_dir(dir));  // the same checks and errors first
  TokenizerConfig config = loaded.config();
  config.eos_token = "<end_of_turn>";
  const std::string file = (dir / "tokenizer.json").string();
  TESSERA_ASSIGN_OR_RETURN(nlohmann::json j, tokenizer_json::read_json_file(file));
  TESSERA_ASSIGN_OR_RETURN(Tokenizer fixed, from_json(j, file, std::move(config)));
  if (corrected != nullptr) *corrected = true;
  return fixed;
}

// HF's order: added tokens (raw text), normalizer, normalized added tokens, pre-tokenizer, BPE.
// The normalizer runs per stretch between added tokens. Only the first stretch of the input
// starts at byte 0 (Metaspace's prepend_scheme "first" reads that).
Result<std::vector<int32_t>> Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  const TokenizerImpl& t = *impl_;
  std::vector<int32_t> ids;
  std::vector<TextSegment> raw, normalized;
  std::vector<std::string> pieces;
  TESSERA_RETURN_IF_ERROR(t.added.split(text, /*normalized=*/false, raw));
  for (size_t r = 0; r < raw.size(); ++r) {
    const TextSegment& seg = raw[r];
    if (seg.token_id >= 0) {
      ids.push_back(seg.token_id);
      continue;
    }
    normalized.clear();
    std::string norm = seg.text;
    if (t.normalizer) {
      TESSERA_ASSIGN_OR_RETURN(norm, t.normalizer(seg.text));
    }
    TESSERA_RETURN_IF_ERROR(t.added.split(norm, /*normalized=*/true, normalized));
    for (size_t n = 0; n < normalized.size(); ++n) {
      const TextSegment& part = normalized[n];
      if (part.token_id >= 0) {
        ids.push_back(part.token_id);
        continue;
      }
      TESSERA_RETURN_IF_ERROR(t.pre_tokenizer.run(part.text, /*at_start=*/r == 0 && n == 0, pieces));
      for (const auto& piece : pieces) TESSERA_RETURN_IF_ERROR(t.model.encode_word(piece, ids));
    }
  }
  if (options.add_special_tokens) ids = t.post_processor.apply(std::move(ids));
  return ids;
}

Result<std::string> Tokenizer::decode(const std::vector<int32_t>& ids, const DecodeOptions& options) const {
  const TokenizerImpl& t = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (const AddedToken* added = t.added.find_id(id)) {
      if (!(options.skip_special_tokens && added->special)) tokens.push_back(added->content);
    } else if (const std::string* token = t.model.id_to_token(id)) {
      tokens.push_back(*token);
    } else if (id < 0) {
      return make_error(ErrorCode::out_of_range, "{}: id {} is negative", t.source, id);
    }  // else a padding row of the model's embedding: no text (HF's decode skips it too)
  }
  std::string text = t.decoder.decode(std::move(tokens));
  if (options.lossy_utf8) text = unicode::to_valid_utf8_lossy(text);
  if (t.config.clean_up_tokenization_spaces) text = clean_up_tokenization(std::move(text));
  return text;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto id = impl_->added.find_content(token)) return id;
  return impl_->model.token_to_id(token);
}

Result<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (const AddedToken* added = impl_->added.find_id(id)) return added->content;
  if (const std::string* token = impl_->model.id_to_token(id)) return *token;
  return make_error(ErrorCode::not_found, "{}: id {} is not in the vocabulary", impl_->source, id);
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

bool Tokenizer::is_special(int32_t id) const {
  const AddedToken* added = impl_->added.find_id(id);
  return added != nullptr && added->special;
}

std::optional<int32_t> Tokenizer::bos_token_id() const { return impl_->bos_id; }
std::optional<int32_t> Tokenizer::eos_token_id() const { return impl_->eos_id; }
std::optional<int32_t> Tokenizer::pad_token_id() const { return impl_->pad_id; }
const TokenizerConfig& Tokenizer::config() const { return impl_->config; }
const std::string& Tokenizer::source() const { return impl_->source; }

}  // namespace tessera::tokenizer
