// chat_template.cpp: ChatML and plain rendering, and `auto` detection from Jinja text.
#include "workers/tokenizer/chat_template.hpp"

namespace tessera::tokenizer {

namespace {

// Per-format pieces: message text and generation prompt.
struct FormatRules {
  std::string (*message)(const ChatMessage&);
  const char* generation_prompt;
};

std::string chatml_message(const ChatMessage& m) { return "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n"; }
std::string plain_message(const ChatMessage& m) { return m.role + ": " + m.content + "\n"; }

const FormatRules& rules_for(ChatFormat format) {
  static const FormatRules kChatml{chatml_message, "<|im_start|>assistant\n"};
  static const FormatRules kPlain{plain_message, "assistant: "};
  return format == ChatFormat::chatml ? kChatml : kPlain;
}

// Jinja string-literal escapes that occur in default system messages.
std::string unescape_jinja(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      const char next = s[++i];
      out.push_back(next == 'n' ? '\n' : next == 't' ? '\t' : next);
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

std::string template_file(const TokenizerConfig& config) {
  if (!config.chat_template_file.empty()) return config.chat_template_file;
  return config.source.empty() ? std::string("tokenizer_config.json") : config.source;
}

}  // namespace

std::optional<std::string> find_default_system_message(std::string_view jinja) {
  // Qwen2 / Qwen2.5: {{- '<|im_start|>system\nYou are ...<|im_end|>\n' }} as one literal.
  static constexpr std::string_view kOpen = "'<|im_start|>system\\n";
  static constexpr std::string_view kClose = "<|im_end|>\\n'";
  for (size_t at = jinja.find(kOpen); at != std::string_view::npos; at = jinja.find(kOpen, at + 1)) {
    const size_t begin = at + kOpen.size();
    const size_t end = jinja.find(kClose, begin);
    if (end == std::string_view::npos) break;
    const std::string_view body = jinja.substr(begin, end - begin);
    if (body.find_first_of("'+") == std::string_view::npos) return unescape_jinja(body);
  }
  return std::nullopt;
}

Result<ChatTemplate> ChatTemplate::from_name(std::string_view name, const TokenizerConfig& config) {
  if (name == "chatml") return chatml();
  if (name == "plain") return plain();
  if (name != "auto") {
    return make_error(ErrorCode::invalid_argument, "chat template '{}' is unknown (chatml, plain, auto)", name);
  }
  if (!config.chat_template) {
    return make_error(ErrorCode::invalid_argument,
                      "{}: no chat_template, so 'auto' cannot choose; use chat template 'chatml' or 'plain'",
                      template_file(config));
  }
  if (config.chat_template->find("<|im_start|>") == std::string::npos) {
    return make_error(ErrorCode::unimplemented,
                      "{}: chat_template is a Jinja template Tessera cannot render (not ChatML); "
                      "use chat template 'chatml' or 'plain' explicitly",
                      template_file(config));
  }
  return chatml(find_default_system_message(*config.chat_template));
}

ChatTemplate ChatTemplate::chatml(std::optional<std::string> default_system) {
  return ChatTemplate(ChatFormat::chatml, std::move(default_system));
}

ChatTemplate ChatTemplate::plain() { return ChatTemplate(ChatFormat::plain, std::nullopt); }

Result<std::string> ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  const FormatRules& rules = rules_for(format_);
  std::string text;
  if (default_system_ && (messages.empty() || messages.front().role != "system")) {
    text += rules.message(ChatMessage{"system", *default_system_});
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role.empty() || role.find_first_of("\r\n") != std::string::npos) {
      return make_error(ErrorCode::invalid_argument, "chat message {}: role must be a non-empty single line", i);
    }
    text += rules.message(messages[i]);
  }
  if (add_generation_prompt) text += rules.generation_prompt;
  return text;
}

}  // namespace tessera::tokenizer
