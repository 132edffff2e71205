// chat_template.hpp: turning a list of chat messages into prompt text.
//
// Tessera does not interpret Jinja. It renders two formats natively and maps a tokenizer's
// Jinja `chat_template` onto one of them only when it can tell which it is:
//   chatml: "<|im_start|>{role}\n{content}<|im_end|>\n" per message; the generation prompt is
//           "<|im_start|>assistant\n". Qwen2/Qwen2.5 templates also insert a default system
//           message when the first message is not a system one; `auto` extracts that literal
//           from the template text and does the same. Qwen3's template strips <think> blocks
//           from earlier assistant turns and has tool-calling branches; we render messages
//           verbatim, which matches it for system/user/assistant turns without reasoning text.
//   plain:  "{role}: {content}\n" per message; the generation prompt is "assistant: ".
// `auto` picks chatml when the template contains "<|im_start|>"; any other template (or none)
// is refused with an error naming the file, instead of being guessed.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "proto/status.hpp"
#include "workers/tokenizer/tokenizer.hpp"

namespace tessera::tokenizer {

/// One chat turn.
struct ChatMessage {
  std::string role;     ///< "system", "user", "assistant", ...: non-empty, one line.
  std::string content;  ///< Any text.
};

/// The formats Tessera renders.
enum class ChatFormat { chatml, plain };

/// A resolved chat template. Immutable; safe from any thread.
class ChatTemplate {
 public:
  /// Resolves "chatml", "plain" or "auto" (see the header comment) against `config`.
  static Result<ChatTemplate> from_name(std::string_view name, const TokenizerConfig& config);

  /// ChatML, optionally with a default system message for conversations that lack one.
  static ChatTemplate chatml(std::optional<std::string> default_system = std::nullopt);

  /// The plain "role: content" format.
  static ChatTemplate plain();

  /// The prompt text for `messages`, ending with the generation prompt when asked.
  /// Errors on a message whose role is empty or spans lines.
  Result<std::string> render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

  ChatFormat format() const { return format_; }
  const std::optional<std::string>& default_system() const { return default_system_; }

 private:
  ChatTemplate(ChatFormat format, std::optional<std::string> default_system)
      : format_(format), default_system_(std::move(default_system)) {}

  ChatFormat format_;
  std::optional<std::string> default_system_;
};

/// The default system message a Qwen2-style ChatML Jinja template inserts, if it has one.
std::optional<std::string> find_default_system_message(std::string_view jinja);

}  // namespace tessera::tokenizer
