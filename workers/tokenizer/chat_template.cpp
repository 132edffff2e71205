// chat_template.cpp: Jinja, ChatML and plain rendering (see chat_template.hpp).
#include "workers/tokenizer/chat_template.hpp"

#include <nlohmann/json.hpp>

#include "workers/tokenizer/jinja/jinja.hpp"

namespace tessera::tokenizer {

struct ChatTemplate::JinjaState {
  jinja::Template tmpl;
  nlohmann::ordered_json fixed;  ///< Special tokens, then the extra variables, in that order.
};

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

std::string template_file(const TokenizerConfig& config) {
  if (!config.chat_template_file.empty()) return config.chat_template_file;
  return config.source.empty() ? std::string("tokenizer_config.json") : config.source;
}

// transformers' apply_chat_template: render(messages, tools, documents, add_generation_prompt,
// **special_tokens_map, **kwargs).
Result<std::string> render_with(const ChatTemplate::JinjaState& state, nlohmann::ordered_json messages,
                                bool add_generation_prompt, nlohmann::ordered_json tools = nullptr) {
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  context["messages"] = std::move(messages);
  context["tools"] = std::move(tools);
  context["documents"] = nullptr;
  context["add_generation_prompt"] = add_generation_prompt;
  for (const auto& [k, v] : state.fixed.items()) context[k] = v;
  return state.tmpl.render(context);
}

Status check_roles(const std::vector<ChatMessage>& messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role.empty() || role.find_first_of("\r\n") != std::string::npos) {
      return make_error(ErrorCode::invalid_argument, "chat message {}: role must be a non-empty single line", i);
    }
  }
  return Status();
}

}  // namespace

Result<ChatTemplate> ChatTemplate::from_name(std::string_view name, const TokenizerConfig& config) {
  return from_name(name, config, nlohmann::json::object());
}

Result<ChatTemplate> ChatTemplate::from_name(std::string_view name, const TokenizerConfig& config,
                                             const nlohmann::json& variables) {
  if (!variables.is_null() && !variables.is_object()) {
    return make_error(ErrorCode::invalid_argument, "chat template variables must be a mapping, got {}", variables.dump());
  }
  const bool has_variables = variables.is_object() && !variables.empty();
  if (name == "chatml" || name == "plain") {
    if (has_variables) {
      std::string keys;
      for (const auto& [k, v] : variables.items()) keys += (keys.empty() ? "" : ", ") + k;
      return make_error(ErrorCode::invalid_argument,
                        "chat template variables ({}) need a Jinja chat template; '{}' takes none", keys, name);
    }
    return name == "chatml" ? chatml() : plain();
  }
  std::string text, source;
  if (name == "auto") {
    if (!config.chat_template) {
      return make_error(ErrorCode::invalid_argument,
                        "{}: no chat_template, so 'auto' has nothing to render; use chat template 'chatml' or 'plain'",
                        template_file(config));
    }
    text = *config.chat_template;
    source = template_file(config);
  } else if (name.find("{{") != std::string_view::npos || name.find("{%") != std::string_view::npos) {
    text = std::string(name);
    source = "custom chat template";
  } else {
    return make_error(ErrorCode::invalid_argument, "chat template '{}' is unknown (chatml, plain, auto, or Jinja text)",
                      name);
  }
  TESSERA_ASSIGN_OR_RETURN(jinja::Template tmpl, jinja::Template::parse(text, source));
  auto state = std::make_shared<JinjaState>(JinjaState{std::move(tmpl), nlohmann::ordered_json::object()});
  // transformers: render(messages, tools, documents, add_generation_prompt, **special_tokens_map, **kwargs).
  for (const auto& [key, value] : {std::pair{"bos_token", &config.bos_token}, std::pair{"eos_token", &config.eos_token},
                                   std::pair{"unk_token", &config.unk_token}, std::pair{"pad_token", &config.pad_token}}) {
    if (*value) state->fixed[key] = **value;
  }
  if (has_variables) {
    for (const auto& [k, v] : variables.items()) state->fixed[k] = nlohmann::ordered_json::parse(v.dump());
  }
  return ChatTemplate(ChatFormat::jinja, std::nullopt, std::move(state));
}

ChatTemplate ChatTemplate::chatml(std::optional<std::string> default_system) {
  return ChatTemplate(ChatFormat::chatml, std::move(default_system));
}

ChatTemplate ChatTemplate::plain() { return ChatTemplate(ChatFormat::plain, std::nullopt); }

Result<std::string> ChatTemplate::render_json(const nlohmann::json& messages, bool add_generation_prompt) const {
  return render_json(nlohmann::ordered_json(messages), add_generation_prompt);
}

Result<std::string> ChatTemplate::render_json(const nlohmann::ordered_json& messages, bool add_generation_prompt) const {
  return render_json(messages, nullptr, add_generation_prompt);
}

Result<std::string> ChatTemplate::preamble() const {
  if (!jinja_) return render({}, false);
  return render_with(*jinja_, nlohmann::ordered_json::array({nlohmann::ordered_json::object()}), false);
}

Result<std::string> ChatTemplate::render_json(const nlohmann::ordered_json& messages,
                                              const nlohmann::ordered_json& tools, bool add_generation_prompt) const {
  if (!tools.is_null() && !tools.is_array()) return make_error(ErrorCode::invalid_argument, "chat tools must be a list");
  if (!jinja_ && !tools.is_null() && !tools.empty()) {
    return make_error(ErrorCode::invalid_argument,
                      "tool schemas need a Jinja chat template (the tokenizer's, or a custom_chat_template); the "
                      "'{}' format has no place for them",
                      format_ == ChatFormat::chatml ? "chatml" : "plain");
  }
  if (!messages.is_array()) return make_error(ErrorCode::invalid_argument, "chat messages must be a list");
  std::vector<ChatMessage> plain;
  for (size_t i = 0; i < messages.size(); ++i) {
    const nlohmann::ordered_json& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string()) {
      return make_error(ErrorCode::invalid_argument, "chat message {} must be an object with string 'role' and 'content'",
                        i);
    }
    plain.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  if (!jinja_) return render(plain, add_generation_prompt);
  TESSERA_RETURN_IF_ERROR(check_roles(plain));
  return render_with(*jinja_, messages, add_generation_prompt, tools);
}

Result<std::string> ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  TESSERA_RETURN_IF_ERROR(check_roles(messages));
  if (jinja_) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& m : messages) list.push_back({{"role", m.role}, {"content", m.content}});
    return render_with(*jinja_, std::move(list), add_generation_prompt);
  }
  const FormatRules& rules = rules_for(format_);
  std::string text;
  if (default_system_ && (messages.empty() || messages.front().role != "system")) {
    text += rules.message(ChatMessage{"system", *default_system_});
  }
  for (const auto& m : messages) text += rules.message(m);
  if (add_generation_prompt) text += rules.generation_prompt;
  return text;
}

}  // namespace tessera::tokenizer
