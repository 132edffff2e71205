// tokenizer_writer.cpp: the tokenizer files `tessera init-model` writes. They are ordinary HF
// tokenizer.json / tokenizer_config.json files, read back through the one loading path.
#include <system_error>

#include "proto/atomic_file.hpp"
#include "workers/tokenizer/tokenizer.hpp"
#include "workers/tokenizer/tokenizer_pipeline.hpp"
#include "workers/tokenizer/unicode.hpp"

namespace tessera::tokenizer {

const char kChatmlJinjaTemplate[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

namespace {

nlohmann::json added_token_json(int32_t id, const std::string& content) {
  return {{"id", id},           {"content", content}, {"single_word", false}, {"lstrip", false},
          {"rstrip", false},    {"normalized", false}, {"special", true}};
}

nlohmann::json byte_level_json() {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
}

// The tokenizer.json skeleton around a BPE vocab with no merges.
nlohmann::json tokenizer_json_with(nlohmann::json vocab, nlohmann::json added, const nlohmann::json& unk) {
  nlohmann::json model = {{"type", "BPE"},          {"dropout", nullptr},     {"unk_token", unk},
                          {"continuing_subword_prefix", nullptr},           {"end_of_word_suffix", nullptr},
                          {"fuse_unk", false},      {"byte_fallback", false}, {"ignore_merges", false},
                          {"vocab", std::move(vocab)}, {"merges", nlohmann::json::array()}};
  return {{"version", "1.0"},     {"truncation", nullptr},     {"padding", nullptr},
          {"added_tokens", std::move(added)}, {"normalizer", nullptr}, {"pre_tokenizer", nullptr},
          {"post_processor", nullptr}, {"decoder", nullptr}, {"model", std::move(model)}};
}

// Appends kWrittenSpecialTokens from `first_id` on.
int32_t append_specials(nlohmann::json& added, int32_t first_id) {
  int32_t id = first_id;
  for (const char* token : kWrittenSpecialTokens) added.push_back(added_token_json(id++, token));
  return id;
}

bool is_written_special(const std::string& token) {
  for (const char* t : kWrittenSpecialTokens) {
    if (token == t) return true;
  }
  return false;
}

}  // namespace

Result<nlohmann::json> make_byte_tokenizer_json() {
  nlohmann::json vocab = nlohmann::json::object();
  const auto& symbols = byte_to_unicode();
  for (int32_t b = 0; b < 256; ++b) vocab[symbols[b]] = b;
  nlohmann::json added = nlohmann::json::array();
  append_specials(added, 256);
  nlohmann::json j = tokenizer_json_with(std::move(vocab), std::move(added), nullptr);
  j["pre_tokenizer"] = byte_level_json();
  j["decoder"] = byte_level_json();
  return j;
}

Result<nlohmann::json> make_char_tokenizer_json(const std::string& alphabet) {
  if (alphabet.empty()) return make_error(ErrorCode::invalid_argument, "character tokenizer: empty alphabet");
  if (!unicode::is_valid_utf8(alphabet)) {
    return make_error(ErrorCode::invalid_argument, "character tokenizer: alphabet is not valid UTF-8");
  }
  nlohmann::json vocab = nlohmann::json::object();
  int32_t id = 0;
  for (size_t pos = 0; pos < alphabet.size();) {
    const uint32_t len = unicode::decode_utf8(alphabet, pos).len;
    const std::string ch = alphabet.substr(pos, len);
    if (!vocab.contains(ch)) vocab[ch] = id++;
    pos += len;
  }
  nlohmann::json added = nlohmann::json::array();
  const int32_t unk_id = append_specials(added, id);
  added.push_back(added_token_json(unk_id, kWrittenUnkToken));
  vocab[kWrittenUnkToken] = unk_id;
  nlohmann::json j = tokenizer_json_with(std::move(vocab), std::move(added), kWrittenUnkToken);
  j["decoder"] = {{"type", "Fuse"}};
  return j;
}

Result<nlohmann::json> make_tokenizer_config_json(const TokenizerSpec& spec) {
  for (const std::string* token : {&spec.eos_token, &spec.pad_token}) {
    if (!is_written_special(*token)) {
      return make_error(ErrorCode::invalid_argument, "tokenizer spec: '{}' is not one of the written special tokens", *token);
    }
  }
  if (spec.model_max_length <= 0) {
    return make_error(ErrorCode::invalid_argument, "tokenizer spec: model_max_length {} must be positive", spec.model_max_length);
  }
  nlohmann::json c = {{"add_bos_token", false},
                      {"add_eos_token", false},
                      {"bos_token", nullptr},
                      {"eos_token", spec.eos_token},
                      {"pad_token", spec.pad_token},
                      {"unk_token", spec.kind == TokenizerSpec::Kind::chars ? nlohmann::json(kWrittenUnkToken) : nlohmann::json()},
                      {"model_max_length", spec.model_max_length},
                      {"clean_up_tokenization_spaces", false},
                      {"tokenizer_class", "PreTrainedTokenizerFast"}};
  if (spec.chatml_template) c["chat_template"] = kChatmlJinjaTemplate;
  return c;
}

Status write_tokenizer_files(const TokenizerSpec& spec, const std::filesystem::path& dir) {
  Result<nlohmann::json> tok = spec.kind == TokenizerSpec::Kind::byte ? make_byte_tokenizer_json()
                                                                      : make_char_tokenizer_json(spec.alphabet);
  if (!tok.ok()) return tok.status();
  TESSERA_ASSIGN_OR_RETURN(nlohmann::json config, make_tokenizer_config_json(spec));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return make_error(ErrorCode::io_error, "{}: cannot create directory: {}", dir.string(), ec.message());
  TESSERA_RETURN_IF_ERROR(proto::write_file_atomic((dir / "tokenizer.json").string(), tok->dump(2) + "\n"));
  TESSERA_RETURN_IF_ERROR(proto::write_file_atomic((dir / "tokenizer_config.json").string(), config.dump(2) + "\n"));
  auto check = Tokenizer::from_dir(dir);
  if (!check.ok()) return check.status().with_context("written tokenizer does not load");
  return Status();
}

}  // namespace tessera::tokenizer
