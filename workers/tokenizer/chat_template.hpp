// chat_template.hpp: turning a list of chat messages into prompt text.
//
// A tokenizer's Jinja `chat_template` (tokenizer_config.json or chat_template.jinja) is rendered
// by Tessera's Jinja interpreter (jinja.hpp) with the variables transformers' apply_chat_template
// passes: messages, tools and documents (None), add_generation_prompt, the special tokens
// (bos_token, eos_token, unk_token, pad_token) and any extra template variables (verl's
// data.apply_chat_template_kwargs, e.g. enable_thinking=false for Qwen3). The text is the one
// transformers produces, byte for byte. Two formats are also rendered natively, when asked by
// name:
//   chatml: "<|im_start|>{role}\n{content}<|im_end|>\n" per message; the generation prompt is
//           "<|im_start|>assistant\n"; optionally a default system message first.
//   plain:  "{role}: {content}\n" per message; the generation prompt is "assistant: ".
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "proto/status.hpp"
#include "workers/tokenizer/tokenizer.hpp"

namespace tessera::tokenizer {

/// One chat turn.
struct ChatMessage {
  std::string role;     ///< "system", "user", "assistant", ...: non-empty, one line.
  std::string content;  ///< Any text.
};

/// The formats Tessera renders.
enum class ChatFormat { chatml, plain, jinja };

/// A resolved chat template. Immutable; safe from any thread.
class ChatTemplate {
 public:
  /// "chatml", "plain", "auto" (the tokenizer's Jinja chat_template; an error naming the file
  /// when it has none or the template does not parse), or Jinja text itself (verl's
  /// custom_chat_template).
  static Result<ChatTemplate> from_name(std::string_view name, const TokenizerConfig& config);

  /// Same, with extra template variables (a JSON object). Only a Jinja template has variables:
  /// with chatml or plain a non-empty object is an error naming its keys.
  static Result<ChatTemplate> from_name(std::string_view name, const TokenizerConfig& config,
                                        const nlohmann::json& variables);

  /// ChatML, optionally with a default system message for conversations that lack one.
  static ChatTemplate chatml(std::optional<std::string> default_system = std::nullopt);

  /// The plain "role: content" format.
  static ChatTemplate plain();

  /// The prompt text for `messages`, ending with the generation prompt when asked.
  /// Errors on a message whose role is empty or spans lines.
  Result<std::string> render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

  /// The same for messages as a dataset holds them (a JSON list of objects with string "role"
  /// and "content"): a Jinja template also sees their other fields (name, reasoning_content,
  /// tool_calls, ...) with their keys in the order given, as Python's dicts keep them (so `tojson`
  /// prints tool-call arguments as transformers does). A nlohmann::json has its keys sorted.
  Result<std::string> render_json(const nlohmann::ordered_json& messages, bool add_generation_prompt) const;
  Result<std::string> render_json(const nlohmann::json& messages, bool add_generation_prompt) const;

  /// The same with transformers' `tools` argument: null, or a list of OpenAI function-tool
  /// schemas (as verl's tool classes dump them) that a Jinja template renders into its system
  /// turn. Tools need a Jinja template: with chatml or plain a non-empty list is an error.
  Result<std::string> render_json(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                  bool add_generation_prompt) const;

  /// What the template renders for one empty message (transformers' apply_chat_template([{}])):
  /// the text it puts before any conversation, such as Qwen2.5's default system turn. verl's
  /// tool agent loop renders tool messages alone and drops this prefix.
  Result<std::string> preamble() const;

  ChatFormat format() const { return format_; }
  const std::optional<std::string>& default_system() const { return default_system_; }

  struct JinjaState;  ///< The parsed template and its fixed variables (chat_template.cpp).

 private:
  ChatTemplate(ChatFormat format, std::optional<std::string> default_system,
               std::shared_ptr<const JinjaState> jinja = nullptr)
      : format_(format), default_system_(std::move(default_system)), jinja_(std::move(jinja)) {}

  ChatFormat format_;
  std::optional<std::string> default_system_;
  std::shared_ptr<const JinjaState> jinja_;
};

}  // namespace tessera::tokenizer
