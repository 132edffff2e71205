// tokenizer_writer_test.cpp: the byte and character tokenizers `tessera init-model` writes,
// loaded back through the one loading path.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <random>

#include "workers/tokenizer/tokenizer.hpp"
#include "workers/tokenizer/tokenizer_pipeline.hpp"

namespace tessera::tokenizer {
namespace {

std::filesystem::path fresh_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("tessera_tok_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::remove_all(dir);
  return dir;
}

Tokenizer byte_tokenizer() {
  auto j = make_byte_tokenizer_json();
  EXPECT_TRUE(j.ok());
  auto tok = Tokenizer::from_json(*j, "byte tokenizer");
  EXPECT_TRUE(tok.ok()) << tok.status().to_string();
  return *tok;
}

TEST(ByteTokenizer, EachByteIsItsOwnIdAndSpecialsFollow) {
  Tokenizer tok = byte_tokenizer();
  EXPECT_EQ(tok.vocab_size(), 260);
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  auto ids = *tok.encode(all);
  ASSERT_EQ(ids.size(), 256u);
  // GPT-2 byte order: id b stands for byte b, whatever symbol it is spelled with.
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[b], b);
  EXPECT_EQ(tok.token_to_id("<|endoftext|>"), 256);
  EXPECT_EQ(tok.token_to_id("<|im_start|>"), 257);
  EXPECT_EQ(tok.token_to_id("<|im_end|>"), 258);
  EXPECT_EQ(tok.token_to_id("<|pad|>"), 259);
  EXPECT_EQ(*tok.id_to_token(' '), "\xC4\xA0");  // "Ġ", GPT-2's symbol for the space byte
}

TEST(ByteTokenizer, RoundTripsRandomBytesInvalidUtf8AndEmoji) {
  Tokenizer tok = byte_tokenizer();
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::string s(rng() % 64, '\0');
    for (char& c : s) c = static_cast<char>(rng() & 0xFF);
    auto ids = *tok.encode(s);
    EXPECT_EQ(ids.size(), s.size());
    EXPECT_EQ(*tok.decode(ids), s);
  }
  const std::string tricky = "\xF0\x9F\xA4\x96 robot \xC3\x28 \xED\xA0\x80 \xF4\x90\x80\x80 caf\x65\xCC\x81";
  EXPECT_EQ(*tok.decode(*tok.encode(tricky)), tricky);  // no NFC: bytes are kept exactly
  EXPECT_EQ(tok.encode("\xF0\x9F\xA4\x96")->size(), 4u);
}

TEST(ByteTokenizer, SpecialTokensAreMatchedAndSkippable) {
  Tokenizer tok = byte_tokenizer();
  auto ids = *tok.encode("<|im_start|>hi<|im_end|>");
  EXPECT_EQ(ids, (std::vector<int32_t>{257, 'h', 'i', 258}));
  DecodeOptions skip;
  skip.skip_special_tokens = true;
  EXPECT_EQ(*tok.decode(ids, skip), "hi");
  EXPECT_EQ(*tok.decode(ids), "<|im_start|>hi<|im_end|>");
}

TEST(CharTokenizer, OneIdPerCharacterThenSpecialsThenUnk) {
  auto j = make_char_tokenizer_json("ab c\xC3\xA9" "a");  // duplicate 'a' keeps its first id
  ASSERT_TRUE(j.ok());
  auto tok = Tokenizer::from_json(*j, "char tokenizer");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  // a=0 b=1 ' '=2 c=3 é=4, then 5..8 specials, 9 unk.
  EXPECT_EQ(*tok->encode("abc \xC3\xA9"), (std::vector<int32_t>{0, 1, 3, 2, 4}));
  EXPECT_EQ(tok->token_to_id("<|im_end|>"), 7);
  EXPECT_EQ(tok->token_to_id(kWrittenUnkToken), 9);
  EXPECT_EQ(*tok->decode({0, 1, 3, 2, 4}), "abc \xC3\xA9");
  EXPECT_EQ(*tok->encode("axb<|im_end|>"), (std::vector<int32_t>{0, 9, 1, 7}));
  EXPECT_EQ(*tok->decode({0, 9, 1, 7}), "a<|unk|>b<|im_end|>");
  DecodeOptions skip;
  skip.skip_special_tokens = true;
  EXPECT_EQ(*tok->decode({0, 9, 1, 7}, skip), "ab");
}

TEST(CharTokenizer, RejectsBadAlphabets) {
  EXPECT_FALSE(make_char_tokenizer_json("").ok());
  EXPECT_FALSE(make_char_tokenizer_json("ab\xFF").ok());
}

TEST(CharTokenizer, WithoutUnkAnUnknownCharacterIsAnError) {
  auto j = *make_char_tokenizer_json("ab");
  j["model"]["unk_token"] = nullptr;
  auto tok = Tokenizer::from_json(j, "no-unk.json");
  ASSERT_TRUE(tok.ok());
  auto ids = tok->encode("abz");
  ASSERT_FALSE(ids.ok());
  EXPECT_NE(ids.status().message().find("U+007A"), std::string::npos) << ids.status().message();
  EXPECT_NE(ids.status().message().find("no-unk.json"), std::string::npos);
}

TEST(WriteTokenizerFiles, ByteSpecLoadsBackWithConfig) {
  const auto dir = fresh_dir("byte");
  TokenizerSpec spec;
  spec.model_max_length = 512;
  ASSERT_TRUE(write_tokenizer_files(spec, dir).ok());
  auto tok = Tokenizer::from_dir(dir);
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ(tok->eos_token_id(), 258);
  EXPECT_EQ(tok->pad_token_id(), 259);
  EXPECT_EQ(tok->config().model_max_length, 512);
  EXPECT_EQ(tok->config().chat_template, std::string(kChatmlJinjaTemplate));
  EXPECT_EQ(*tok->decode(*tok->encode("hello \xE2\x9C\x93")), "hello \xE2\x9C\x93");
  size_t files = 0;  // the atomic writes leave no temporary files behind
  for (const auto& entry : std::filesystem::directory_iterator(dir)) files += entry.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 2u);
  std::filesystem::remove_all(dir);
}

TEST(WriteTokenizerFiles, CharSpecAndBadSpecs) {
  const auto dir = fresh_dir("chars");
  TokenizerSpec spec;
  spec.kind = TokenizerSpec::Kind::chars;
  spec.alphabet = "0123456789+= ";
  spec.eos_token = "<|endoftext|>";
  ASSERT_TRUE(write_tokenizer_files(spec, dir).ok());
  auto tok = Tokenizer::from_dir(dir);
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ(*tok->encode("1+1=2"), (std::vector<int32_t>{1, 10, 1, 11, 2}));
  EXPECT_EQ(tok->eos_token_id(), 13);
  EXPECT_EQ(tok->config().unk_token, std::string(kWrittenUnkToken));
  std::filesystem::remove_all(dir);

  spec.eos_token = "</s>";
  EXPECT_EQ(write_tokenizer_files(spec, fresh_dir("bad")).code(), ErrorCode::invalid_argument);
  spec.eos_token = "<|im_end|>";
  spec.model_max_length = 0;
  EXPECT_FALSE(make_tokenizer_config_json(spec).ok());
}

}  // namespace
}  // namespace tessera::tokenizer
