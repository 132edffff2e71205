// tokenizer_config.cpp: the fields of HF tokenizer_config.json that Tessera reads.
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>
#include <system_error>

#include "workers/tokenizer/tokenizer.hpp"
#include "workers/tokenizer/tokenizer_json.hpp"

namespace tessera::tokenizer {

using tokenizer_json::JsonPath;
using tokenizer_json::field_error;

namespace {

// A special token given as "<s>", as {"content": "<s>", ...} (AddedToken), or null.
Result<std::optional<std::string>> parse_token_field(const nlohmann::json& j, const JsonPath& root, const char* key) {
  const nlohmann::json* v = tokenizer_json::optional_member(j, key);
  if (v == nullptr) return std::optional<std::string>();
  if (v->is_string()) return std::optional<std::string>(v->get<std::string>());
  if (v->is_object()) {
    TESSERA_ASSIGN_OR_RETURN(std::string content, tokenizer_json::string_member(*v, root / key, "content"));
    return std::optional<std::string>(content);
  }
  return field_error(root / key, "expected a string, an object with 'content', or null");
}

// chat_template as a string, or as [{"name": "default", "template": ...}, ...].
Result<std::optional<std::string>> parse_chat_template(const nlohmann::json& j, const JsonPath& root) {
  const nlohmann::json* v = tokenizer_json::optional_member(j, "chat_template");
  if (v == nullptr) return std::optional<std::string>();
  if (v->is_string()) return std::optional<std::string>(v->get<std::string>());
  if (!v->is_array()) return field_error(root / "chat_template", "expected a string or a list of named templates");
  for (size_t i = 0; i < v->size(); ++i) {
    const JsonPath p = (root / "chat_template").at(i);
    TESSERA_ASSIGN_OR_RETURN(std::string name, tokenizer_json::string_member((*v)[i], p, "name"));
    if (name == "default") {
      TESSERA_ASSIGN_OR_RETURN(std::string text, tokenizer_json::string_member((*v)[i], p, "template"));
      return std::optional<std::string>(text);
    }
  }
  return field_error(root / "chat_template", "no template named 'default'");
}

Result<std::optional<int64_t>> parse_max_length(const nlohmann::json& j, const JsonPath& root) {
  const nlohmann::json* v = tokenizer_json::optional_member(j, "model_max_length");
  if (v == nullptr) return std::optional<int64_t>();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  if (v->is_number_unsigned()) {
    const auto u = v->get<uint64_t>();
    return std::optional<int64_t>(u > static_cast<uint64_t>(kMax) ? kMax : static_cast<int64_t>(u));
  }
  if (v->is_number() && v->get<double>() > 0) {
    const double d = v->get<double>();
    return std::optional<int64_t>(d >= 9.2e18 ? kMax : static_cast<int64_t>(d));
  }
  return field_error(root / "model_max_length", "expected a positive number");
}

Result<std::string> read_text_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return make_error(ErrorCode::io_error, "{}: cannot open for reading", file.string());
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return make_error(ErrorCode::io_error, "{}: read failed", file.string());
  return text.str();
}

}  // namespace

Result<TokenizerConfig> parse_tokenizer_config(const nlohmann::json& j, const std::string& source) {
  const JsonPath root{source, ""};
  if (!j.is_object()) return make_error(ErrorCode::corrupt_data, "{}: expected a JSON object", source);
  TokenizerConfig c;
  c.source = source;
  TESSERA_ASSIGN_OR_RETURN(c.bos_token, parse_token_field(j, root, "bos_token"));
  TESSERA_ASSIGN_OR_RETURN(c.eos_token, parse_token_field(j, root, "eos_token"));
  TESSERA_ASSIGN_OR_RETURN(c.pad_token, parse_token_field(j, root, "pad_token"));
  TESSERA_ASSIGN_OR_RETURN(c.unk_token, parse_token_field(j, root, "unk_token"));
  TESSERA_ASSIGN_OR_RETURN(c.add_bos_token, tokenizer_json::bool_member(j, root, "add_bos_token", false));
  TESSERA_ASSIGN_OR_RETURN(c.add_eos_token, tokenizer_json::bool_member(j, root, "add_eos_token", false));
  TESSERA_ASSIGN_OR_RETURN(c.clean_up_tokenization_spaces,
                           tokenizer_json::bool_member(j, root, "clean_up_tokenization_spaces", false));
  TESSERA_ASSIGN_OR_RETURN(c.model_max_length, parse_max_length(j, root));
  TESSERA_ASSIGN_OR_RETURN(c.chat_template, parse_chat_template(j, root));
  if (c.chat_template) c.chat_template_file = source;
  return c;
}

Result<TokenizerConfig> read_tokenizer_config(const std::filesystem::path& dir) {
  const std::filesystem::path file = dir / "tokenizer_config.json";
  std::error_code ec;
  TokenizerConfig config;
  bool legacy = true;  // no added_tokens_decoder: transformers reads special_tokens_map.json too
  if (std::filesystem::exists(file, ec)) {
    TESSERA_ASSIGN_OR_RETURN(nlohmann::json j, tokenizer_json::read_json_file(file.string()));
    TESSERA_ASSIGN_OR_RETURN(config, parse_tokenizer_config(j, file.string()));
    legacy = !(j.is_object() && j.contains("added_tokens_decoder"));
  }
  // transformers' from_pretrained, legacy branch: special_tokens_map.json's bos/eos/pad/unk
  // override tokenizer_config.json's (older checkpoints name their eos only there).
  const std::filesystem::path map_file = dir / "special_tokens_map.json";
  if (legacy && std::filesystem::exists(map_file, ec)) {
    TESSERA_ASSIGN_OR_RETURN(nlohmann::json m, tokenizer_json::read_json_file(map_file.string()));
    if (!m.is_object()) return make_error(ErrorCode::corrupt_data, "{}: expected a JSON object", map_file.string());
    const JsonPath root{map_file.string(), ""};
    for (auto [key, field] : {std::pair{"bos_token", &config.bos_token}, std::pair{"eos_token", &config.eos_token},
                              std::pair{"pad_token", &config.pad_token}, std::pair{"unk_token", &config.unk_token}}) {
      TESSERA_ASSIGN_OR_RETURN(std::optional<std::string> token, parse_token_field(m, root, key));
      if (token) *field = std::move(token);
    }
  }
  const std::filesystem::path jinja = dir / "chat_template.jinja";
  if (std::filesystem::exists(jinja, ec)) {
    TESSERA_ASSIGN_OR_RETURN(std::string text, read_text_file(jinja));
    config.chat_template = std::move(text);
    config.chat_template_file = jinja.string();
  }
  return config;
}

}  // namespace tessera::tokenizer
