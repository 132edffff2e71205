// tokenizer_test.cpp: the Qwen3 tokenizer against ids from an independent implementation
// (shared/golden/qwen3-tokenizer, produced by transformers.js), plus lookups and config.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>
#include <algorithm>

#include "workers/tokenizer/chat_template.hpp"
#include "workers/tokenizer/tokenizer.hpp"

namespace tessera::tokenizer {
namespace {

// encode_cases.json: $TESSERA_GOLDEN_TOKENIZER_CASES, else under $TESSERA_SHARED_DIR/golden.
std::filesystem::path golden_cases_path() {
  if (const char* p = std::getenv("TESSERA_GOLDEN_TOKENIZER_CASES")) return p;
  const char* shared = std::getenv("TESSERA_SHARED_DIR");
  return std::filesystem::path(shared != nullptr ? shared : "../shared") / "golden" / "qwen3-tokenizer" /
         "encode_cases.json";
}

const nlohmann::json& golden_cases() {
  static const nlohmann::json cases = [] {
    std::ifstream in(golden_cases_path());
    if (!in) return nlohmann::json::array();
    return nlohmann::json::parse(in).at("cases");
  }();
  return cases;
}

// The Qwen3 tokenizer beside the case file, loaded once per test binary.
const Tokenizer& qwen3() {
  static const Result<Tokenizer> tok = Tokenizer::from_dir(golden_cases_path().parent_path());
  if (!tok.ok()) {
    ADD_FAILURE() << tok.status().to_string();
    std::abort();
  }
  return *tok;
}

std::vector<int32_t> ids_of(const nlohmann::json& c) { return c.at("ids").get<std::vector<int32_t>>(); }

TEST(TokenizerGolden, EveryQwen3CaseEncodesAndDecodesExactly) {
  const auto& cases = golden_cases();
  ASSERT_GT(cases.size(), 0u) << "no golden cases at " << golden_cases_path();
  size_t checked = 0;
  for (const auto& c : cases) {
    const std::string text = c.at("text");
    auto ids = qwen3().encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status().to_string();
    EXPECT_EQ(*ids, ids_of(c)) << "encode(" << nlohmann::json(text).dump() << ")";
    auto decoded = qwen3().decode(ids_of(c));
    ASSERT_TRUE(decoded.ok()) << decoded.status().to_string();
    EXPECT_EQ(*decoded, c.at("decoded").get<std::string>());
    ++checked;
  }
  std::printf("[golden] checked %zu Qwen3 tokenizer cases from %s\n", checked, golden_cases_path().c_str());
  EXPECT_EQ(checked, cases.size());
}

TEST(TokenizerGolden, ChatmlPromptEncodesLikeTheGoldenChatCase) {
  // The golden case "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n" is
  // exactly the ChatML rendering of one user message with the generation prompt.
  const nlohmann::json* chat_case = nullptr;
  for (const auto& c : golden_cases()) {
    if (c.at("text").get<std::string>().rfind("<|im_start|>user\n", 0) == 0) chat_case = &c;
  }
  ASSERT_NE(chat_case, nullptr);
  auto tmpl = ChatTemplate::from_name("auto", qwen3().config());
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().to_string();
  auto text = tmpl->render({{"user", "What is 2+2?"}}, /*add_generation_prompt=*/true);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, chat_case->at("text").get<std::string>());
  EXPECT_EQ(*qwen3().encode(*text), ids_of(*chat_case));
}

TEST(TokenizerQwen3, ConfigAndSpecialTokenLookups) {
  const Tokenizer& tok = qwen3();
  EXPECT_EQ(tok.token_to_id("<|endoftext|>"), 151643);
  EXPECT_EQ(tok.token_to_id("<|im_start|>"), 151644);
  EXPECT_EQ(tok.token_to_id("<|im_end|>"), 151645);
  EXPECT_EQ(tok.eos_token_id(), 151645);  // eos_token "<|im_end|>"
  EXPECT_EQ(tok.pad_token_id(), 151643);  // pad_token "<|endoftext|>"
  EXPECT_FALSE(tok.bos_token_id().has_value());
  EXPECT_EQ(tok.vocab_size(), 151669);  // 151643 BPE entries + 26 added tokens
  EXPECT_TRUE(tok.is_special(151644));
  EXPECT_FALSE(tok.is_special(151657));  // <tool_call> is added but not special
  EXPECT_EQ(tok.config().model_max_length, 131072);
  EXPECT_FALSE(tok.config().add_bos_token);
  ASSERT_TRUE(tok.config().chat_template.has_value());
  EXPECT_EQ(*tok.id_to_token(9707), "Hello");
  EXPECT_EQ(*tok.id_to_token(151645), "<|im_end|>");
  EXPECT_FALSE(tok.id_to_token(151669).ok());
}

TEST(TokenizerQwen3, SpecialTokensSplitInsideText) {
  const Tokenizer& tok = qwen3();
  auto hello = *tok.encode("Hello");
  auto world = *tok.encode("world");
  auto ids = *tok.encode("Hello<|im_end|>world<|endoftext|>");
  std::vector<int32_t> expected = hello;
  expected.push_back(151645);
  expected.insert(expected.end(), world.begin(), world.end());
  expected.push_back(151643);
  EXPECT_EQ(ids, expected);
  // A near miss is ordinary text.
  auto near = *tok.encode("<|im_end");
  EXPECT_EQ(std::count(near.begin(), near.end(), 151645), 0);
}

TEST(TokenizerQwen3, SkipSpecialTokensAndUnknownIds) {
  const Tokenizer& tok = qwen3();
  auto ids = *tok.encode("<|im_start|>user\nhi<|im_end|>");
  DecodeOptions skip;
  skip.skip_special_tokens = true;
  EXPECT_EQ(*tok.decode(ids, skip), "user\nhi");
  // Ids past the tokenizer (Qwen's padded embedding rows, which a sampler can draw) decode to
  // nothing, as HF's tokenizer.decode([9707, 151931, 1879]) == "Hello world".
  EXPECT_EQ(*tok.decode({9707, 151931, 1879}), "Hello world");
  EXPECT_EQ(*tok.decode({151700}), "");
  auto bad = tok.decode({9707, -3});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::out_of_range);
  EXPECT_NE(bad.status().message().find("-3"), std::string::npos);
}

TEST(TokenizerQwen3, NfcNormalisesBeforeBpe) {
  // "e" + COMBINING ACUTE is canonically equal to U+00E9; Qwen3 declares an NFC normalizer.
  EXPECT_EQ(*qwen3().encode("caf\x65\xCC\x81"), *qwen3().encode("caf\xC3\xA9"));
}

TEST(TokenizerQwen3, RoundTripsArbitraryBytesAndLossyRepair) {
  const std::string bytes("a\xFF\xFE b\xC3", 6);
  auto ids = qwen3().encode(bytes);
  ASSERT_TRUE(ids.ok()) << ids.status().to_string();
  EXPECT_EQ(*qwen3().decode(*ids), bytes);
  DecodeOptions lossy;
  lossy.lossy_utf8 = true;
  EXPECT_EQ(*qwen3().decode(*ids, lossy), "a\xEF\xBF\xBD\xEF\xBF\xBD b\xEF\xBF\xBD");
}

TEST(TokenizerQwen3, CopiesShareStateAndEncodeConcurrently) {
  const Tokenizer copy = qwen3();
  const std::string text = golden_cases().at(1).at("text");
  std::vector<std::vector<int32_t>> results(4);
  std::vector<std::thread> threads;
  for (auto& r : results) threads.emplace_back([&] { r = *copy.encode(text); });
  for (auto& t : threads) t.join();
  for (const auto& r : results) EXPECT_EQ(r, ids_of(golden_cases().at(1)));
}

}  // namespace
}  // namespace tessera::tokenizer
