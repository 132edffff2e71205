// chat_template_test.cpp: rendered prompts against the formats' definitions (ChatML as Qwen
// documents it; plain "role: content"), and `auto` detection from tokenizer_config.json.
#include <gtest/gtest.h>

#include "workers/tokenizer/chat_template.hpp"

namespace tessera::tokenizer {
namespace {

const std::vector<ChatMessage> kConversation = {
    {"system", "Be brief."}, {"user", "Hi!"}, {"assistant", "Hello."}, {"user", "2+2?"}};

TEST(ChatTemplate, ChatmlRendersEveryTurnAndTheGenerationPrompt) {
  auto text = ChatTemplate::chatml().render(kConversation, /*add_generation_prompt=*/true);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text,
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\nHi!<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n"
            "<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(*ChatTemplate::chatml().render({{"user", "x"}}, /*add_generation_prompt=*/false),
            "<|im_start|>user\nx<|im_end|>\n");
}

TEST(ChatTemplate, PlainRendersRoleColonContent) {
  EXPECT_EQ(*ChatTemplate::plain().render(kConversation, /*add_generation_prompt=*/true),
            "system: Be brief.\nuser: Hi!\nassistant: Hello.\nuser: 2+2?\nassistant: ");
  EXPECT_EQ(*ChatTemplate::plain().render({}, /*add_generation_prompt=*/true), "assistant: ");
}

TEST(ChatTemplate, DefaultSystemMessageOnlyWhenNoneIsGiven) {
  const ChatTemplate t = ChatTemplate::chatml("You are helpful.");
  EXPECT_EQ(*t.render({{"user", "Hi"}}, true),
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(*t.render({{"system", "S"}, {"user", "Hi"}}, false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplate, RejectsBadRoles) {
  EXPECT_FALSE(ChatTemplate::chatml().render({{"", "x"}}, true).ok());
  EXPECT_FALSE(ChatTemplate::chatml().render({{"user\nsystem", "x"}}, true).ok());
}

TokenizerConfig config_with(std::optional<std::string> tmpl) {
  TokenizerConfig c;
  c.source = "/models/x/tokenizer_config.json";
  c.chat_template = std::move(tmpl);
  if (c.chat_template) c.chat_template_file = c.source;
  return c;
}

TEST(ChatTemplate, AutoDetectsChatmlAndQwen25DefaultSystem) {
  // The Qwen2.5 template fragment that inserts its default system message.
  const std::string qwen25 =
      "{%- if messages[0]['role'] == 'system' %}\n"
      "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
      "    {%- else %}\n"
      "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
      "assistant.<|im_end|>\\n' }}\n"
      "    {%- endif %}";
  auto t = ChatTemplate::from_name("auto", config_with(qwen25));
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->format(), ChatFormat::chatml);
  EXPECT_EQ(t->default_system(), "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");

  auto classic = ChatTemplate::from_name("auto", config_with(kChatmlJinjaTemplate));
  ASSERT_TRUE(classic.ok());
  EXPECT_EQ(classic->format(), ChatFormat::chatml);
  EXPECT_FALSE(classic->default_system().has_value());
}

TEST(ChatTemplate, AutoRefusesUnknownOrMissingTemplatesNamingTheFile) {
  const std::string llama3 = "{{- bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}{% endfor %}";
  auto t = ChatTemplate::from_name("auto", config_with(llama3));
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("/models/x/tokenizer_config.json"), std::string::npos);
  EXPECT_NE(t.status().message().find("cannot render"), std::string::npos);
  auto none = ChatTemplate::from_name("auto", config_with(std::nullopt));
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("/models/x/tokenizer_config.json"), std::string::npos);
  EXPECT_FALSE(ChatTemplate::from_name("jinja", config_with(std::nullopt)).ok());
  EXPECT_TRUE(ChatTemplate::from_name("plain", config_with(llama3)).ok());  // explicit choice wins
}

}  // namespace
}  // namespace tessera::tokenizer
