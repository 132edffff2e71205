// tokenizer_pipeline_test.cpp: the stages of tokenizer.json one at a time, on tiny hand-made
// files whose expected output follows from the HF definitions (HF docs examples where given).
#include <gtest/gtest.h>

#include "workers/tokenizer/tokenizer.hpp"
#include "workers/tokenizer/tokenizer_pipeline.hpp"

namespace tessera::tokenizer {
namespace {

using nlohmann::json;
using tokenizer_json::JsonPath;

std::vector<std::string> pre_tokenize(const json& j, const std::string& text) {
  auto p = PreTokenizer::from_json(&j, JsonPath{"test", "pre_tokenizer"});
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  std::vector<std::string> pieces;
  EXPECT_TRUE(p->run(text, pieces).ok());
  return pieces;
}

json split_on_dash(const char* behavior, bool invert = false) {
  return {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", invert}};
}

using Pieces = std::vector<std::string>;

// HF docs (SplitDelimiterBehavior), input "the-final--countdown" split on "-".
TEST(SplitPreTokenizer, BehavioursMatchTheHfDocumentation) {
  const std::string text = "the-final--countdown";
  EXPECT_EQ(pre_tokenize(split_on_dash("Removed"), text), (Pieces{"the", "final", "countdown"}));
  EXPECT_EQ(pre_tokenize(split_on_dash("Isolated"), text), (Pieces{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(pre_tokenize(split_on_dash("MergedWithPrevious"), text), (Pieces{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(pre_tokenize(split_on_dash("MergedWithNext"), text), (Pieces{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(pre_tokenize(split_on_dash("Contiguous"), text), (Pieces{"the", "-", "final", "--", "countdown"}));
}

TEST(SplitPreTokenizer, InvertKeepsTheMatchesAsTheContent) {
  // invert: the regex describes the pieces; with Removed the gaps disappear.
  json j = {{"type", "Split"}, {"pattern", {{"Regex", "\\p{L}+"}}}, {"behavior", "Removed"}, {"invert", true}};
  EXPECT_EQ(pre_tokenize(j, "héllo, wörld!"), (Pieces{"héllo", "wörld"}));
}

TEST(SplitPreTokenizer, UnicodeClassesAndCaseInsensitiveContractions) {
  json j = {{"type", "Split"},
            {"pattern", {{"Regex", "(?i:'s|'t)|\\p{L}+|\\p{N}|\\s+(?!\\S)|\\s+|[^\\s\\p{L}\\p{N}]+"}}},
            {"behavior", "Isolated"},
            {"invert", false}};
  // U+2003 EM SPACE is \s; "'S" matches the case-insensitive contraction.
  EXPECT_EQ(pre_tokenize(j, "IT'S 42\xE2\x80\x83x"), (Pieces{"IT", "'S", " ", "4", "2", "\xE2\x80\x83", "x"}));
}

TEST(SplitPreTokenizer, BackslashSIsUnicodeWhiteSpaceAsInOniguruma) {
  // U+180E MONGOLIAN VOWEL SEPARATOR is not White_Space (PCRE2's own \s would split on it).
  json j = {{"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "Removed"}, {"invert", false}};
  EXPECT_EQ(pre_tokenize(j, "a\xE1\xA0\x8E" "b c\xC2\x85" "d"), (Pieces{"a\xE1\xA0\x8E" "b", "c", "d"}));
}

TEST(ByteLevelPreTokenizer, PrefixSpaceRegexAndByteMapping) {
  json j = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}, {"trim_offsets", true}};
  // GPT-2: " Hello" " world" then "!" ; spaces print as "Ġ" (U+0120).
  EXPECT_EQ(pre_tokenize(j, "Hello world!"), (Pieces{"\xC4\xA0Hello", "\xC4\xA0world", "!"}));
  j["add_prefix_space"] = false;
  j["use_regex"] = false;
  EXPECT_EQ(pre_tokenize(j, "a b\n"), (Pieces{"a\xC4\xA0" "b\xC4\x8A"}));
}

TEST(ByteLevelPreTokenizer, SequenceAppliesStepsInOrder) {
  json j = {{"type", "Sequence"},
            {"pretokenizers",
             {split_on_dash("Isolated"), {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", false}}}}};
  EXPECT_EQ(pre_tokenize(j, "a-b"), (Pieces{"\xC4\xA0" "a", "\xC4\xA0-", "\xC4\xA0" "b"}));
}

json tiny_bpe(json merges) {
  json vocab = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"bc", 4}, {"abc", 5}, {"aa", 6}};
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", std::move(merges)}}},
          {"decoder", {{"type", "Fuse"}}}};
}

std::vector<int32_t> encode(const json& j, const std::string& text) {
  auto tok = Tokenizer::from_json(j, "tiny.json");
  EXPECT_TRUE(tok.ok()) << tok.status().to_string();
  if (!tok.ok()) return {};
  auto ids = tok->encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status().to_string();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

TEST(BpeModel, LowestRankMergesFirst) {
  // a b c: "a b" (rank 0) first, then "ab c" -> abc.
  EXPECT_EQ(encode(tiny_bpe({"a b", "b c", "ab c"}), "abc"), (std::vector<int32_t>{5}));
  // "b c" ranks first: a + bc, and no merge joins them.
  EXPECT_EQ(encode(tiny_bpe({"b c", "a b", "ab c"}), "abc"), (std::vector<int32_t>{0, 4}));
}

TEST(BpeModel, PairMergesMeanTheSameAsStringMerges) {
  // json::array() spells the list out: a brace list of [string, x] pairs would become an object.
  const json pairs = json::array({json::array({"a", "b"}), json::array({"ab", "c"})});
  EXPECT_EQ(encode(tiny_bpe(pairs), "abcab"), encode(tiny_bpe({"a b", "ab c"}), "abcab"));
  EXPECT_EQ(encode(tiny_bpe(pairs), "abcab"), (std::vector<int32_t>{5, 3}));
}

TEST(BpeModel, EqualRanksMergeLeftmostFirst) {
  EXPECT_EQ(encode(tiny_bpe({"a a"}), "aaa"), (std::vector<int32_t>{6, 0}));
  EXPECT_EQ(encode(tiny_bpe({"a a"}), "aaaa"), (std::vector<int32_t>{6, 6}));
}

TEST(BpeModel, UnkTokenAndFuseUnk) {
  json j = tiny_bpe({"a b"});
  j["model"]["vocab"]["<unk>"] = 7;
  j["model"]["unk_token"] = "<unk>";
  EXPECT_EQ(encode(j, "axyb"), (std::vector<int32_t>{0, 7, 7, 1}));
  j["model"]["fuse_unk"] = true;
  EXPECT_EQ(encode(j, "axyb"), (std::vector<int32_t>{0, 7, 1}));
}

json with_added(json added) {
  json j = {{"model", {{"type", "BPE"}, {"vocab", {{"x", 0}, {" ", 1}, {"y", 2}}}, {"merges", json::array()}}}};
  j["added_tokens"] = std::move(added);
  return j;
}

json added_token(int id, const std::string& content, json flags) {
  json t = {{"id", id}, {"content", content}, {"special", true}, {"normalized", false}};
  t.update(flags);
  return t;
}

TEST(AddedTokens, LongestMatchWinsAndStripFlagsEatSpaces) {
  json j = with_added({added_token(10, "<m>", json::object()), added_token(11, "<m>>", json::object())});
  EXPECT_EQ(encode(j, "x<m>>y<m>"), (std::vector<int32_t>{0, 11, 2, 10}));
  json strip = with_added({added_token(10, "<m>", {{"lstrip", true}, {"rstrip", true}})});
  EXPECT_EQ(encode(strip, "x  <m>  y"), (std::vector<int32_t>{0, 10, 2}));
  json left = with_added({added_token(10, "<m>", {{"lstrip", true}})});
  EXPECT_EQ(encode(left, "x <m> y"), (std::vector<int32_t>{0, 10, 1, 2}));
}

TEST(AddedTokens, SingleWordOnlyMatchesWholeWords) {
  json j = with_added({added_token(10, "xy", {{"single_word", true}})});
  EXPECT_EQ(encode(j, "xy xxy"), (std::vector<int32_t>{10, 1, 0, 0, 2}));
}

TEST(PostProcessor, TemplateProcessingAddsBosOnlyWhenAsked) {
  json j = with_added({added_token(10, "<s>", json::object())});
  j["post_processor"] = json::parse(R"({"type": "Sequence", "processors": [
      {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
      {"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
       "pair": [],
       "special_tokens": {"<s>": {"id": "<s>", "ids": [10], "tokens": ["<s>"]}}}]})");
  auto tok = Tokenizer::from_json(j, "bos.json");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ(*tok->encode("xy"), (std::vector<int32_t>{0, 2}));
  EncodeOptions with_bos;
  with_bos.add_special_tokens = true;
  EXPECT_EQ(*tok->encode("xy", with_bos), (std::vector<int32_t>{10, 0, 2}));
}

TEST(Decoders, NoDecoderJoinsWithSpacesAndCleanUpFollowsConfig) {
  json j = with_added(json::array());
  auto tok = Tokenizer::from_json(j, "plain.json");
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ(*tok->decode({0, 2}), "x y");  // HF joins tokens with " " when there is no decoder
  TokenizerConfig config;
  config.clean_up_tokenization_spaces = true;
  j["model"]["vocab"]["."] = 3;
  auto clean = Tokenizer::from_json(j, "plain.json", config);
  ASSERT_TRUE(clean.ok());
  EXPECT_EQ(*clean->decode({0, 3}), "x.");
}

}  // namespace
}  // namespace tessera::tokenizer
