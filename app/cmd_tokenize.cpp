// cmd_tokenize.cpp: `tessera tokenize`, a thin shell over tessera::tokenizer::Tokenizer.
//
//   tessera tokenize --tokenizer DIR [--chat [--chat-template auto|chatml|plain|JINJA]] TEXT
//       prints the ids of TEXT as a JSON list (with --chat, TEXT is one user message rendered
//       through the chat template with the generation prompt).
//   tessera tokenize --tokenizer DIR --decode IDS [--skip-special-tokens]
//       prints the text of IDS (a JSON list or comma-separated integers) and a newline.
#include <CLI/CLI.hpp>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "app/commands.hpp"
#include "workers/tokenizer/chat_template.hpp"
#include "workers/tokenizer/tokenizer.hpp"

namespace tessera::app {
namespace {

struct TokenizeOptions {
  std::string dir;
  std::string text;
  bool chat = false;
  std::string chat_template = "auto";
  bool add_special_tokens = false;
  std::string decode_ids;
  bool skip_special_tokens = false;
};

Result<int32_t> parse_id(const std::string& s) {
  const auto first = s.find_first_not_of(" \t\n");
  const auto last = s.find_last_not_of(" \t\n");
  const std::string t = first == std::string::npos ? "" : s.substr(first, last - first + 1);
  size_t used = 0;
  long long v = -1;
  try {
    v = std::stoll(t, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (t.empty() || used != t.size() || v < 0 || v > INT32_MAX) {
    return make_error(ErrorCode::invalid_argument, "--decode: '{}' is not a token id", t);
  }
  return static_cast<int32_t>(v);
}

// IDS as "[1, 2, 3]" or "1,2,3".
Result<std::vector<int32_t>> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  if (text.find('[') != std::string::npos) {
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_array()) return make_error(ErrorCode::invalid_argument, "--decode: '{}' is not a JSON list of ids", text);
    for (const auto& v : j) {
      if (!v.is_number_integer()) return make_error(ErrorCode::invalid_argument, "--decode: {} is not a token id", v.dump());
      TESSERA_ASSIGN_OR_RETURN(int32_t id, parse_id(v.dump()));
      ids.push_back(id);
    }
    return ids;
  }
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string part = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    TESSERA_ASSIGN_OR_RETURN(int32_t id, parse_id(part));
    ids.push_back(id);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return ids;
}

Status run_decode(const tokenizer::Tokenizer& tok, const TokenizeOptions& o) {
  TESSERA_ASSIGN_OR_RETURN(std::vector<int32_t> ids, parse_ids(o.decode_ids));
  tokenizer::DecodeOptions options;
  options.skip_special_tokens = o.skip_special_tokens;
  TESSERA_ASSIGN_OR_RETURN(std::string text, tok.decode(ids, options));
  std::cout << text << "\n";
  return Status();
}

Status run_encode(const tokenizer::Tokenizer& tok, const TokenizeOptions& o) {
  std::string text = o.text;
  if (o.chat) {
    TESSERA_ASSIGN_OR_RETURN(auto tmpl, tokenizer::ChatTemplate::from_name(o.chat_template, tok.config()));
    TESSERA_ASSIGN_OR_RETURN(text, tmpl.render({tokenizer::ChatMessage{"user", o.text}}, /*add_generation_prompt=*/true));
  }
  tokenizer::EncodeOptions options;
  options.add_special_tokens = o.add_special_tokens;
  TESSERA_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok.encode(text, options));
  std::cout << nlohmann::json(ids).dump() << "\n";
  return Status();
}

Status run_tokenize(const TokenizeOptions& o) {
  TESSERA_ASSIGN_OR_RETURN(tokenizer::Tokenizer tok, tokenizer::Tokenizer::from_dir(o.dir));
  if (!o.decode_ids.empty()) {
    if (!o.text.empty() || o.chat) return make_error(ErrorCode::invalid_argument, "--decode takes no TEXT and no --chat");
    return run_decode(tok, o);
  }
  return run_encode(tok, o);
}

}  // namespace

void add_tokenizer_commands(CLI::App& app) {
  auto opts = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Encode TEXT to token ids, or --decode ids to text");
  cmd->add_option("--tokenizer", opts->dir, "Directory holding tokenizer.json (and tokenizer_config.json)")->required();
  cmd->add_flag("--chat", opts->chat, "Render TEXT as a user message through the chat template, with generation prompt");
  cmd->add_option("--chat-template", opts->chat_template, "Chat template: auto (the tokenizer's Jinja template), chatml, plain, or Jinja text")->capture_default_str();
  cmd->add_flag("--add-special-tokens", opts->add_special_tokens, "Apply tokenizer.json's post_processor (e.g. BOS)");
  cmd->add_option("--decode", opts->decode_ids, "Ids to decode: a JSON list or comma-separated integers");
  cmd->add_flag("--skip-special-tokens", opts->skip_special_tokens, "When decoding, drop special tokens");
  cmd->add_option("text", opts->text, "Text to encode");
  cmd->callback([opts] {
    const Status st = run_tokenize(*opts);
    if (!st.ok()) {
      std::fprintf(stderr, "tessera tokenize: %s\n", st.to_string().c_str());
      exit_code() = 1;
    }
  });
}

}  // namespace tessera::app
