// chat_template_test.cpp: rendered prompts against the formats' definitions (ChatML as Qwen
// documents it; plain "role: content"), and the tokenizer's Jinja template rendered as
// transformers renders it (jinja_test.cpp checks the interpreter against transformers itself).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

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

// A real template from tests/workers/tokenizer/chat_templates (the Hub's bytes).
std::string fixture(const std::string& name) {
  const char* root = std::getenv("TESSERA_SOURCE_DIR");
  std::ifstream in(std::filesystem::path(root != nullptr ? root : ".") / "tests/workers/tokenizer/chat_templates" / name);
  EXPECT_TRUE(in.good()) << name;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(ChatTemplate, AutoRendersTheTokenizersJinjaTemplateAsTransformersDoes) {
  auto classic = ChatTemplate::from_name("auto", config_with(kChatmlJinjaTemplate));
  ASSERT_TRUE(classic.ok()) << classic.status().to_string();
  EXPECT_EQ(classic->format(), ChatFormat::jinja);
  for (bool gen : {false, true}) EXPECT_EQ(*classic->render(kConversation, gen), *ChatTemplate::chatml().render(kConversation, gen));

  // Qwen2.5 inserts its default system message when the conversation has none.
  auto qwen = ChatTemplate::from_name("auto", config_with(fixture("qwen2.5-instruct.jinja")));
  ASSERT_TRUE(qwen.ok()) << qwen.status().to_string();
  EXPECT_EQ(*qwen->render({{"user", "Hi"}}, true),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");

  // Llama 3.1 reads bos_token from the tokenizer config and its date from a template variable.
  TokenizerConfig llama = config_with(fixture("llama-3.1-instruct.jinja"));
  llama.bos_token = "<|begin_of_text|>";
  auto plain_date = ChatTemplate::from_name("auto", llama);
  ASSERT_TRUE(plain_date.ok()) << plain_date.status().to_string();
  const std::string text = *plain_date->render({{"user", "Hi"}}, true);
  EXPECT_EQ(text.rfind("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n", 0), 0u) << text;
  EXPECT_NE(text.find("Today Date: 26 Jul 2024"), std::string::npos) << text;
  const std::string tail = "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                           "<|start_header_id|>assistant<|end_header_id|>\n\n";
  EXPECT_EQ(text.substr(text.size() - std::min(text.size(), tail.size())), tail) << text;
  auto dated = ChatTemplate::from_name("auto", llama, nlohmann::json{{"date_string", "01 Jan 2025"}});
  ASSERT_TRUE(dated.ok());
  EXPECT_NE(dated->render({{"user", "Hi"}}, true)->find("Today Date: 01 Jan 2025"), std::string::npos);
}

TEST(ChatTemplate, CustomJinjaTextIsATemplate) {
  auto t = ChatTemplate::from_name(
      "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{% if add_generation_prompt %}>{% endif %}",
      config_with(std::nullopt));
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(*t->render({{"user", "Hi"}, {"assistant", "Yo"}}, true), "[user]Hi[assistant]Yo>");
}

TEST(ChatTemplate, DatasetMessagesKeepTheirOtherFieldsForJinja) {
  const nlohmann::json messages = nlohmann::json::parse(
      R"([{"role": "system", "content": "S"}, {"role": "user", "content": "Hi", "name": "bob"}])");
  auto t = ChatTemplate::from_name("{% for m in messages %}{{ m.role }}/{{ m.name }}:{{ m.content }}|{% endfor %}",
                                   config_with(std::nullopt));
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(*t->render_json(messages, false), "system/:S|user/bob:Hi|");
  // Native formats render the same text from the JSON as from ChatMessages.
  EXPECT_EQ(*ChatTemplate::chatml().render_json(messages, true),
            *ChatTemplate::chatml().render({{"system", "S"}, {"user", "Hi"}}, true));
  EXPECT_FALSE(t->render_json(nlohmann::json::parse(R"([{"role": "user"}])"), true).ok());
  EXPECT_FALSE(t->render_json(nlohmann::json::parse(R"([{"role": "", "content": "x"}])"), true).ok());
}

TEST(ChatTemplate, ErrorsNameTheTemplateTheLineOrTheVariables) {
  auto none = ChatTemplate::from_name("auto", config_with(std::nullopt));
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("/models/x/tokenizer_config.json"), std::string::npos);
  EXPECT_FALSE(ChatTemplate::from_name("jinja", config_with(std::nullopt)).ok());  // neither a name nor a template
  auto broken = ChatTemplate::from_name("auto", config_with("line one\n{% if messages %}unclosed"));
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().message().find("/models/x/tokenizer_config.json:2"), std::string::npos)
      << broken.status().to_string();
  auto raising = ChatTemplate::from_name("{{ raise_exception('roles must alternate') }}", config_with(std::nullopt));
  ASSERT_TRUE(raising.ok());
  auto raised = raising->render({{"user", "Hi"}}, true);
  ASSERT_FALSE(raised.ok());
  EXPECT_NE(raised.status().message().find("roles must alternate"), std::string::npos);
  auto chatml_vars = ChatTemplate::from_name("chatml", config_with(std::nullopt), nlohmann::json{{"enable_thinking", false}});
  ASSERT_FALSE(chatml_vars.ok());
  EXPECT_NE(chatml_vars.status().message().find("enable_thinking"), std::string::npos);
  EXPECT_TRUE(ChatTemplate::from_name("plain", config_with("{{ x }}")).ok());  // an explicit format wins
}

}  // namespace
}  // namespace tessera::tokenizer
