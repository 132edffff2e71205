// tokenizer_spm_test.cpp: SentencePiece-converted tokenizers (Mistral, Gemma, Llama-2 style:
// byte_fallback BPE, Prepend/Replace normalizers, Metaspace, ByteFallback/Strip decoders)
// against goldens from HF `tokenizers` itself. The fixtures and tests/workers/tokenizer/spm/
// golden.json come from spm/make_fixtures.py (see its docstring for what each file imitates).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "workers/tokenizer/tokenizer.hpp"
#include "workers/tokenizer/tokenizer_pipeline.hpp"

namespace tessera::tokenizer {
namespace {

using nlohmann::json;

std::filesystem::path spm_dir() {
  const char* root = std::getenv("TESSERA_SOURCE_DIR");
  return std::filesystem::path(root != nullptr ? root : ".") / "tests" / "workers" / "tokenizer" / "spm";
}

json read_golden(const std::filesystem::path& dir) {
  std::ifstream in(dir / "golden.json");
  return in ? json::parse(in) : json::object();
}

const json& golden() {
  static const json g = read_golden(spm_dir());
  return g;
}

std::string show(const std::string& s) { return json(s).dump(); }

// Checks every case of fixture `name` under `dir` (default: the committed fixtures against
// `golden()`); returns how many were checked.
size_t check_fixture(const std::string& name, const std::filesystem::path& dir = spm_dir(),
                     const json& all = golden()) {
  auto tok = Tokenizer::from_file(dir / name / "tokenizer.json");
  EXPECT_TRUE(tok.ok()) << tok.status().to_string();
  if (!tok.ok()) return 0;
  const json& fixture = all.at("fixtures").at(name);
  size_t checked = 0;
  EncodeOptions with_special;
  with_special.add_special_tokens = true;
  DecodeOptions skip;
  skip.skip_special_tokens = true;
  for (const json& c : fixture.at("cases")) {
    const std::string text = c.at("text");
    const auto ids = c.at("ids").get<std::vector<int32_t>>();
    const auto ids_special = c.at("ids_with_special").get<std::vector<int32_t>>();
    auto got = tok->encode(text);
    auto got_special = tok->encode(text, with_special);
    if (!got.ok() || !got_special.ok()) {
      ADD_FAILURE() << name << " encode(" << show(text) << "): " << got.status().to_string()
                    << got_special.status().to_string();
      continue;
    }
    EXPECT_EQ(*got, ids) << name << " encode(" << show(text) << ")";
    EXPECT_EQ(*got_special, ids_special) << name << " encode(" << show(text) << ", add_special_tokens)";
    EXPECT_EQ(*tok->decode(ids), c.at("decoded").get<std::string>()) << name << " " << show(text);
    EXPECT_EQ(*tok->decode(ids, skip), c.at("decoded_skip").get<std::string>()) << name << " " << show(text);
    EXPECT_EQ(*tok->decode(ids_special), c.at("decoded_with_special").get<std::string>()) << name << " " << show(text);
    EXPECT_EQ(*tok->decode(ids_special, skip), c.at("decoded_with_special_skip").get<std::string>())
        << name << " " << show(text);
    ++checked;
  }
  for (const json& c : fixture.at("decode_cases")) {
    const auto ids = c.at("ids").get<std::vector<int32_t>>();
    EXPECT_EQ(*tok->decode(ids), c.at("decoded").get<std::string>()) << name << " decode " << json(ids).dump();
    EXPECT_EQ(*tok->decode(ids, skip), c.at("decoded_skip").get<std::string>()) << name << " decode " << json(ids).dump();
    ++checked;
  }
  std::printf("[golden] %s: %zu cases match tokenizers %s\n", name.c_str(), checked,
              all.value("tokenizers_version", "?").c_str());
  return checked;
}

TEST(TokenizerSpmGolden, FixturesArePresent) {
  ASSERT_TRUE(golden().contains("fixtures")) << "no golden.json under " << spm_dir();
  EXPECT_EQ(golden().at("fixtures").size(), 4u);
}

TEST(TokenizerSpmGolden, MistralV03Style) { EXPECT_GT(check_fixture("mistral"), 30u); }
TEST(TokenizerSpmGolden, Gemma2Style) { EXPECT_GT(check_fixture("gemma"), 30u); }
TEST(TokenizerSpmGolden, MetaspaceFirstStyle) { EXPECT_GT(check_fixture("metaspace"), 30u); }
TEST(TokenizerSpmGolden, LegacyMetaspaceWithUnkStyle) { EXPECT_GT(check_fixture("legacy"), 30u); }

// With $TESSERA_PYTHON holding HF `tokenizers`, make_fixtures.py runs afresh (in a temporary
// copy) and Tessera must match whatever that tokenizers version produces.
TEST(TokenizerSpmGolden, FreshlyGeneratedFixturesMatchTheInstalledTokenizers) {
  const char* py = std::getenv("TESSERA_PYTHON");
  if (py == nullptr || *py == '\0') GTEST_SKIP() << "TESSERA_PYTHON (with tokenizers) is not set";
  const std::string probe = fmt::format("'{}' -c 'import tokenizers' >/dev/null 2>&1", py);
  if (std::system(probe.c_str()) != 0) GTEST_SKIP() << py << " cannot import tokenizers";
  const auto dir = std::filesystem::temp_directory_path() / ("tessera_spm_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(spm_dir() / "make_fixtures.py", dir / "make_fixtures.py",
                             std::filesystem::copy_options::overwrite_existing);
  const std::string cmd = fmt::format("'{}' '{}'", py, (dir / "make_fixtures.py").string());
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const json fresh = read_golden(dir);
  for (const char* name : {"mistral", "gemma", "metaspace", "legacy"}) {
    EXPECT_GT(check_fixture(name, dir, fresh), 30u) << name;
  }
  std::filesystem::remove_all(dir);
}

// The golden corpus must keep covering what the brief names: specials in text, byte fallback
// for CJK / emoji / combining marks, whitespace runs, leading spaces, newlines, tabs, "".
TEST(TokenizerSpmGolden, CorpusCoversTheHardCases) {
  std::vector<std::string> texts;
  for (const json& c : golden().at("fixtures").at("mistral").at("cases")) texts.push_back(c.at("text"));
  auto any = [&](const std::string& needle) {
    for (const auto& t : texts) {
      if (t.find(needle) != std::string::npos) return true;
    }
    return false;
  };
  EXPECT_TRUE(std::find(texts.begin(), texts.end(), "") != texts.end());
  for (const char* needle : {"[INST]", "</s>", "<start_of_turn>", "\xE6\x97\xA5", "\xF0\x9F\x98\x80", "\xCC\x81",
                             "   ", "\n", "\t"}) {
    EXPECT_TRUE(any(needle)) << show(needle);
  }
}

TEST(TokenizerSpm, ConfigTokensResolveThroughFromDir) {
  // from_dir with a Mistral-style tokenizer_config.json beside the tokenizer.json.
  const auto dir = std::filesystem::temp_directory_path() / "tessera_spm_from_dir";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(spm_dir() / "mistral" / "tokenizer.json", dir / "tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
  std::ofstream(dir / "tokenizer_config.json")
      << R"({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": true})";
  auto tok = Tokenizer::from_dir(dir);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ(tok->bos_token_id(), 1);
  EXPECT_EQ(tok->eos_token_id(), 2);
  EXPECT_TRUE(tok->is_special(3));  // [INST]
  EXPECT_EQ(tok->token_to_id("<0x0A>"), 3 + 7 + 10);  // after <unk> <s> </s> and 7 control tokens
}

// ---- Stage-level checks (expected values follow from the HF Rust source) ----------------

std::vector<std::string> pre_tokenize(const json& j, const std::string& text, bool at_start = true) {
  auto p = PreTokenizer::from_json(&j, tokenizer_json::JsonPath{"test", "pre_tokenizer"});
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  std::vector<std::string> pieces;
  if (p.ok()) {
    EXPECT_TRUE(p->run(text, at_start, pieces).ok());
  }
  return pieces;
}

using Pieces = std::vector<std::string>;
const std::string kMeta = "\xE2\x96\x81";  // ▁

TEST(MetaspacePreTokenizer, SplitMergesEachReplacementWithTheNextPiece) {
  json j = {{"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "always"}, {"split", true}};
  EXPECT_EQ(pre_tokenize(j, "Hey  friend"), (Pieces{kMeta + "Hey", kMeta, kMeta + "friend"}));
  EXPECT_EQ(pre_tokenize(j, " Hey"), (Pieces{kMeta + "Hey"}));  // no second ▁ when one leads already
  j["split"] = false;
  EXPECT_EQ(pre_tokenize(j, "Hey friend"), (Pieces{kMeta + "Hey" + kMeta + "friend"}));
}

TEST(MetaspacePreTokenizer, PrependSchemes) {
  json j = {{"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "first"}, {"split", false}};
  EXPECT_EQ(pre_tokenize(j, "a b", /*at_start=*/true), (Pieces{kMeta + "a" + kMeta + "b"}));
  EXPECT_EQ(pre_tokenize(j, "a b", /*at_start=*/false), (Pieces{"a" + kMeta + "b"}));
  j["prepend_scheme"] = "never";
  EXPECT_EQ(pre_tokenize(j, "a b"), (Pieces{"a" + kMeta + "b"}));
  // Legacy form: add_prefix_space false is "never" (and needs prepend_scheme "never" if given).
  json legacy = {{"type", "Metaspace"}, {"replacement", kMeta}, {"add_prefix_space", false}, {"prepend_scheme", "never"}};
  EXPECT_EQ(pre_tokenize(legacy, "a b"), (Pieces{"a", kMeta + "b"}));
}

TEST(MetaspacePreTokenizer, FirstOnlyPrependsTheStretchAtByteZero) {
  // "first" sees HF's original offsets: the text after a special token is not at the start.
  json j = {{"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {kMeta, 1}, {"<s>", 2}}}, {"merges", json::array()}}},
            {"pre_tokenizer", {{"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "first"}, {"split", true}}},
            {"added_tokens", {{{"id", 2}, {"content", "<s>"}, {"special", true}, {"normalized", false}}}}};
  auto tok = Tokenizer::from_json(j, "first.json");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ(*tok->encode("a<s>a"), (std::vector<int32_t>{1, 0, 2, 0}));
  EXPECT_EQ(*tok->encode("<s>a"), (std::vector<int32_t>{2, 0}));
}

TEST(ByteFallbackModel, UnknownCharactersBecomeByteTokensOnlyWhenAllExist) {
  json vocab = {{"<unk>", 0}, {"a", 1}, {"<0xC3>", 2}, {"<0xA9>", 3}, {"<0xE2>", 4}};
  json j = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}, {"unk_token", "<unk>"},
                       {"byte_fallback", true}, {"fuse_unk", true}, {"dropout", nullptr}}}};
  auto tok = Tokenizer::from_json(j, "bf.json");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ(*tok->encode("a\xC3\xA9" "a"), (std::vector<int32_t>{1, 2, 3, 1}));  // é: both byte tokens exist
  // € (E2 82 AC) lacks two byte tokens -> <unk>; a pending <unk> waits behind byte tokens, as in HF.
  EXPECT_EQ(*tok->encode("\xE2\x82\xAC\xE2\x82\xAC\xC3\xA9" "a"), (std::vector<int32_t>{2, 3, 0, 1}));
}

TEST(ByteFallbackDecoder, ByteRunsDecodeOrBecomeReplacementCharacters) {
  json j = {{"model", {{"type", "BPE"},
                       {"vocab", {{"<0xC3>", 0}, {"<0xA9>", 1}, {"x", 2}, {"<0x+F>", 3}, {"<0xZZ>", 4}}},
                       {"merges", json::array()}}},
            {"decoder", {{"type", "Sequence"}, {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}}}};
  auto tok = Tokenizer::from_json(j, "bfd.json");
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ(*tok->decode({0, 1, 2}), "\xC3\xA9x");
  EXPECT_EQ(*tok->decode({0, 2, 1}), "\xEF\xBF\xBDx\xEF\xBF\xBD");
  EXPECT_EQ(*tok->decode({3, 4}), "\x0F<0xZZ>");  // Rust's from_str_radix accepts "+F"
}

TEST(Normalizers, PrependSkipsEmptyTextAndReplaceTakesRegexes) {
  json seq = {{"type", "Sequence"},
              {"normalizers", {{{"type", "Prepend"}, {"prepend", kMeta}},
                               {{"type", "Replace"}, {"pattern", {{"Regex", "\\s+"}}}, {"content", "_"}}}}};
  auto n = parse_normalizer(&seq, tokenizer_json::JsonPath{"test", "normalizer"});
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  EXPECT_EQ(*(*n)(""), "");
  EXPECT_EQ(*(*n)("a \t b\n"), kMeta + "a_b_");
}

}  // namespace
}  // namespace tessera::tokenizer
