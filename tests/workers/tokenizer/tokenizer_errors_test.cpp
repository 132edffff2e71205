// tokenizer_errors_test.cpp: malformed tokenizer files fail with one line naming file and field.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "workers/tokenizer/tokenizer.hpp"

namespace tessera::tokenizer {
namespace {

using nlohmann::json;

class TokenizerErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("tessera_tok_err_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
    return (dir_ / name).string();
  }

  // Loads `text` as tokenizer.json and returns the error, checking it is one line naming the file.
  Status load_error(const std::string& text) {
    const std::string file = write("tokenizer.json", text);
    auto tok = Tokenizer::from_dir(dir_);
    EXPECT_FALSE(tok.ok());
    if (tok.ok()) return Status();
    const std::string msg = tok.status().message();
    EXPECT_NE(msg.find(file), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    return tok.status();
  }

  std::filesystem::path dir_;
};

json valid_json() {
  return {{"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}}, {"merges", {"a b"}}}}};
}

void expect_mentions(const Status& st, const std::string& what) {
  EXPECT_NE(st.message().find(what), std::string::npos) << st.message();
}

TEST_F(TokenizerErrors, ValidBaselineLoads) {
  write("tokenizer.json", valid_json().dump());
  EXPECT_TRUE(Tokenizer::from_dir(dir_).ok());
}

TEST_F(TokenizerErrors, MissingFile) {
  auto tok = Tokenizer::from_dir(dir_);
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), ErrorCode::not_found);
  expect_mentions(tok.status(), (dir_ / "tokenizer.json").string());
}

TEST_F(TokenizerErrors, MissingDirectoryAndUncachedRepoId) {
  auto tok = Tokenizer::from_dir(dir_ / "absent");
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), ErrorCode::not_found);
  expect_mentions(tok.status(), (dir_ / "absent").string() + ": no such directory");
  EXPECT_EQ(tok.status().message().find("huggingface-cli"), std::string::npos);
  // A Hub repo id that resolve_model_paths did not find in the local cache: say how to fetch it.
  auto repo = Tokenizer::from_dir("Org/not-downloaded");
  ASSERT_FALSE(repo.ok());
  expect_mentions(repo.status(), "huggingface-cli download Org/not-downloaded");
}

TEST_F(TokenizerErrors, NotJsonAndTruncated) {
  EXPECT_EQ(load_error("this is not json").code(), ErrorCode::corrupt_data);
  const std::string full = valid_json().dump();
  const Status truncated = load_error(full.substr(0, full.size() / 2));
  EXPECT_EQ(truncated.code(), ErrorCode::corrupt_data);
  expect_mentions(truncated, "not valid JSON");
  EXPECT_EQ(load_error("[1, 2]").code(), ErrorCode::corrupt_data);
}

TEST_F(TokenizerErrors, MissingModelAndUnknownModelType) {
  expect_mentions(load_error(R"({"added_tokens": []})"), "'model'");
  json j = valid_json();
  j["model"]["type"] = "WordPiece";
  const Status st = load_error(j.dump());
  EXPECT_EQ(st.code(), ErrorCode::unimplemented);
  expect_mentions(st, "model.type");
  expect_mentions(st, "WordPiece");
}

TEST_F(TokenizerErrors, BadMergesEntries) {
  for (const json& bad : {json("a b c"), json("ab"), json(7), json::array({"a"}), json::array({"a", 1})}) {
    json j = valid_json();
    j["model"]["merges"] = json::array({"a b", bad});
    expect_mentions(load_error(j.dump()), "model.merges[1]");
  }
  json j = valid_json();
  j["model"]["merges"] = {"a z"};
  const Status st = load_error(j.dump());
  expect_mentions(st, "model.merges[0]");
  expect_mentions(st, "'z'");
  j["model"]["merges"] = {"b a"};  // "ba" is not in the vocab
  expect_mentions(load_error(j.dump()), "'ba'");
}

TEST_F(TokenizerErrors, BadVocabAndUnkToken) {
  json j = valid_json();
  j["model"]["vocab"]["c"] = "three";
  expect_mentions(load_error(j.dump()), "model.vocab.c");
  j = valid_json();
  j["model"]["vocab"]["c"] = 1;
  expect_mentions(load_error(j.dump()), "id 1 is used by both");
  j = valid_json();
  j["model"]["unk_token"] = "<unk>";
  expect_mentions(load_error(j.dump()), "model.unk_token");
}

TEST_F(TokenizerErrors, BadRegexNamesTheField) {
  json j = valid_json();
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", {{{"type", "Split"}, {"pattern", {{"Regex", "(\\p{L}+"}}},
                                            {"behavior", "Isolated"}, {"invert", false}}}}};
  const Status st = load_error(j.dump());
  expect_mentions(st, "pre_tokenizer.pretokenizers[0].pattern.Regex");
  expect_mentions(st, "offset");
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Regex", "a"}};
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
  expect_mentions(load_error(j.dump()), "pre_tokenizer.pretokenizers[0].behavior");
}

TEST_F(TokenizerErrors, UnsupportedStagesAreRefusedNotIgnored) {
  const std::pair<const char*, json> cases[] = {
      {"normalizer.type", {{"type", "NFKC"}}},
      {"pre_tokenizer.type", {{"type", "BertPreTokenizer"}}},
      {"decoder.type", {{"type", "WordPiece"}}},
      {"post_processor.type", {{"type", "BertProcessing"}}},
  };
  for (const auto& [field, value] : cases) {
    json j = valid_json();
    j[std::string(field).substr(0, std::string(field).find('.'))] = value;
    const Status st = load_error(j.dump());
    EXPECT_EQ(st.code(), ErrorCode::unimplemented) << st.message();
    expect_mentions(st, field);
  }
  json j = valid_json();
  j["model"]["dropout"] = 0.1;
  const Status dropout = load_error(j.dump());
  EXPECT_EQ(dropout.code(), ErrorCode::unimplemented);
  expect_mentions(dropout, "model.dropout");
  j = valid_json();
  j["truncation"] = {{"max_length", 8}};
  expect_mentions(load_error(j.dump()), "truncation");
}

// The SentencePiece-style stages (Prepend / Replace / Metaspace / Strip / byte_fallback).
TEST_F(TokenizerErrors, BadSentencePieceStagesNameTheField) {
  const std::string meta = "\xE2\x96\x81";
  const std::pair<const char*, json> cases[] = {
      {"normalizer.prepend", {{"type", "Prepend"}, {"prepend", 1}}},
      {"normalizer.normalizers[1].content",
       {{"type", "Sequence"},
        {"normalizers", {{{"type", "Prepend"}, {"prepend", meta}}, {{"type", "Replace"}, {"pattern", {{"String", " "}}}}}}}},
      {"normalizer.pattern.Regex", {{"type", "Replace"}, {"pattern", {{"Regex", "(a"}}}, {"content", "b"}}},
      {"normalizer.pattern", {{"type", "Replace"}, {"pattern", "a"}, {"content", "b"}}},
      {"pre_tokenizer.replacement", {{"type", "Metaspace"}, {"replacement", "ab"}, {"prepend_scheme", "always"}}},
      {"pre_tokenizer.replacement", {{"type", "Metaspace"}}},
      {"pre_tokenizer.prepend_scheme", {{"type", "Metaspace"}, {"replacement", meta}, {"prepend_scheme", "sometimes"}}},
      // HF refuses add_prefix_space=false unless prepend_scheme is "never" (absent means "always").
      {"pre_tokenizer.add_prefix_space", {{"type", "Metaspace"}, {"replacement", meta}, {"add_prefix_space", false}}},
      {"pre_tokenizer.split", {{"type", "Metaspace"}, {"replacement", meta}, {"split", "yes"}}},
      {"decoder.decoders[0].replacement", {{"type", "Sequence"}, {"decoders", {{{"type", "Metaspace"}, {"replacement", ""}}}}}},
      {"decoder.content", {{"type", "Strip"}, {"content", "  "}, {"start", 1}, {"stop", 0}}},
      {"decoder.pattern", {{"type", "Replace"}, {"content", " "}}},
  };
  for (const auto& [field, value] : cases) {
    json j = valid_json();
    j[std::string(field).substr(0, std::string(field).find('.'))] = value;
    const Status st = load_error(j.dump());
    EXPECT_EQ(st.code(), ErrorCode::corrupt_data) << st.message();
    expect_mentions(st, std::string("field '") + field + "'");
  }
  json j = valid_json();
  j["model"]["byte_fallback"] = "yes";
  expect_mentions(load_error(j.dump()), "model.byte_fallback");
}

TEST_F(TokenizerErrors, BadAddedTokens) {
  json j = valid_json();
  j["added_tokens"] = {{{"id", 5}, {"content", ""}}};
  expect_mentions(load_error(j.dump()), "added_tokens[0].content");
  j["added_tokens"] = {{{"content", "<s>"}}};
  expect_mentions(load_error(j.dump()), "added_tokens[0].id");
}

TEST_F(TokenizerErrors, ConfigTokensMustExistAndConfigMustParse) {
  write("tokenizer.json", valid_json().dump());
  const std::string config = write("tokenizer_config.json", R"({"eos_token": "</s>"})");
  auto tok = Tokenizer::from_dir(dir_);
  ASSERT_FALSE(tok.ok());
  expect_mentions(tok.status(), config);
  expect_mentions(tok.status(), "eos_token '</s>'");

  write("tokenizer_config.json", R"({"eos_token": {"content": "ab"}, "pad_token": 5})");
  tok = Tokenizer::from_dir(dir_);
  ASSERT_FALSE(tok.ok());
  expect_mentions(tok.status(), "pad_token");

  write("tokenizer_config.json", R"({"eos_token": {"content": "ab"}, "chat_template": 3})");
  tok = Tokenizer::from_dir(dir_);
  ASSERT_FALSE(tok.ok());
  expect_mentions(tok.status(), "chat_template");

  write("tokenizer_config.json", R"({"eos_token": {"content": "ab"}, "model_max_length": 1e30,
                                     "chat_template": [{"name": "default", "template": "T"}]})");
  tok = Tokenizer::from_dir(dir_);
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ(tok->eos_token_id(), 2);
  EXPECT_EQ(tok->config().chat_template, "T");
  EXPECT_EQ(tok->config().model_max_length, INT64_MAX);

  write("tokenizer_config.json", "{");
  tok = Tokenizer::from_dir(dir_);
  ASSERT_FALSE(tok.ok());
  expect_mentions(tok.status(), (dir_ / "tokenizer_config.json").string());
}

// transformers' legacy loading: without an added_tokens_decoder in tokenizer_config.json,
// special_tokens_map.json's special tokens override the config's; with one, the map is not read.
TEST_F(TokenizerErrors, SpecialTokensMapOverridesALegacyConfig) {
  write("tokenizer.json", valid_json().dump());
  write("tokenizer_config.json", R"({"eos_token": "a"})");
  write("special_tokens_map.json", R"({"eos_token": {"content": "ab", "lstrip": false}, "pad_token": "a"})");
  auto tok = Tokenizer::from_dir(dir_);
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ(tok->config().eos_token, "ab");
  EXPECT_EQ(tok->config().pad_token, "a");
  write("tokenizer_config.json", R"({"eos_token": "a", "added_tokens_decoder": {}})");
  tok = Tokenizer::from_dir(dir_);
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ(tok->config().eos_token, "a");
  EXPECT_FALSE(tok->config().pad_token.has_value());
  std::filesystem::remove(dir_ / "tokenizer_config.json");
  write("special_tokens_map.json", R"({"eos_token": 3})");
  tok = Tokenizer::from_dir(dir_);
  ASSERT_FALSE(tok.ok());
  expect_mentions(tok.status(), "special_tokens_map.json");
}

// verl's hf_tokenizer: a tokenizer under a path naming gemma-2-2b-it gets <end_of_turn> as its eos
// (verl's correction); any other path loads as from_dir.
TEST_F(TokenizerErrors, VerlsGemma2bItCorrectionSetsTheEndOfTurnEos) {
  json j = valid_json();
  j["added_tokens"] = {{{"id", 3}, {"content", "<end_of_turn>"}, {"special", true}}};
  for (const std::string sub : {"google/gemma-2-2b-it", "google/gemma-2-9b-it"}) {
    const std::filesystem::path d = dir_ / sub;
    std::filesystem::create_directories(d);
    std::ofstream(d / "tokenizer.json") << j.dump();
    std::ofstream(d / "tokenizer_config.json") << R"({"eos_token": "ab"})";
    bool corrected = true;
    auto tok = Tokenizer::from_dir_as_verl(d, &corrected);
    ASSERT_TRUE(tok.ok()) << tok.status().to_string();
    const bool gemma_2b_it = sub == "google/gemma-2-2b-it";
    EXPECT_EQ(corrected, gemma_2b_it) << sub;
    EXPECT_EQ(tok->eos_token_id(), gemma_2b_it ? 3 : 2) << sub;
    EXPECT_EQ(tok->config().eos_token, gemma_2b_it ? "<end_of_turn>" : "ab") << sub;
  }
}

}  // namespace
}  // namespace tessera::tokenizer
