// tokenizer_cli_test.cpp: `tessera tokenize` end to end on the Qwen3 tokenizer (integration:
// runs the built binary; skipped when it has not been built).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "workers/tokenizer/tokenizer.hpp"

namespace {

std::filesystem::path golden_cases_path() {
  if (const char* p = std::getenv("TESSERA_GOLDEN_TOKENIZER_CASES")) return p;
  const char* shared = std::getenv("TESSERA_SHARED_DIR");
  return std::filesystem::path(shared != nullptr ? shared : "../shared") / "golden" / "qwen3-tokenizer" /
         "encode_cases.json";
}

std::filesystem::path tessera_binary() {
  const char* bin = std::getenv("TESSERA_BIN_DIR");
  return std::filesystem::path(bin != nullptr ? bin : ".") / "tessera";
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs `command`, returning stdout and the exit status.
std::pair<std::string, int> run(const std::string& command) {
  std::string out;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return {"popen failed", -1};
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  const int status = ::pclose(pipe);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

class TokenizerCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(tessera_binary())) GTEST_SKIP() << "no binary at " << tessera_binary();
    std::ifstream in(golden_cases_path());
    ASSERT_TRUE(in) << "no golden cases at " << golden_cases_path();
    cases_ = nlohmann::json::parse(in).at("cases");
    dir_ = golden_cases_path().parent_path().string();
  }
  std::string base() const { return shell_quote(tessera_binary().string()) + " tokenize --tokenizer " + shell_quote(dir_); }

  nlohmann::json cases_;
  std::string dir_;
};

TEST_F(TokenizerCli, EncodePrintsTheGoldenIdsAsJson) {
  const auto& c = cases_.at(0);
  auto [out, rc] = run(base() + " " + shell_quote(c.at("text")));
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(nlohmann::json::parse(out), c.at("ids"));
}

TEST_F(TokenizerCli, ChatRendersAUserMessageWithTheGenerationPrompt) {
  for (const auto& c : cases_) {
    if (c.at("text") != "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n") continue;
    auto [out, rc] = run(base() + " --chat 'What is 2+2?'");
    ASSERT_EQ(rc, 0) << out;
    EXPECT_EQ(nlohmann::json::parse(out), c.at("ids"));
    return;
  }
  FAIL() << "golden chat case not found";
}

TEST_F(TokenizerCli, DecodePrintsTheGoldenText) {
  const auto& c = cases_.at(0);
  auto [out, rc] = run(base() + " --decode " + shell_quote(c.at("ids").dump()));
  ASSERT_EQ(rc, 0) << out;
  EXPECT_EQ(out, c.at("decoded").get<std::string>() + "\n");
}

// Decoding options and errors on a written byte tokenizer (id = byte), which loads instantly.
TEST_F(TokenizerCli, DecodeFormatsAndErrorsOnAByteTokenizer) {
  const auto dir = std::filesystem::temp_directory_path() / ("tessera_tok_cli_" + std::to_string(::getpid()));
  ASSERT_TRUE(tessera::tokenizer::write_tokenizer_files(tessera::tokenizer::TokenizerSpec{}, dir).ok());
  const std::string cmd = shell_quote(tessera_binary().string()) + " tokenize --tokenizer " + shell_quote(dir.string());
  auto [csv, rc1] = run(cmd + " --decode '72, 105,258'");
  EXPECT_EQ(rc1, 0);
  EXPECT_EQ(csv, "Hi<|im_end|>\n");
  auto [skipped, rc2] = run(cmd + " --skip-special-tokens --decode '[72,105,258]'");
  EXPECT_EQ(rc2, 0);
  EXPECT_EQ(skipped, "Hi\n");
  auto [bad, rc3] = run(cmd + " --decode 1,x");
  EXPECT_NE(rc3, 0);
  EXPECT_NE(bad.find("'x'"), std::string::npos) << bad;
  EXPECT_EQ(bad.find('\n'), bad.size() - 1) << bad;
  std::filesystem::remove_all(dir);
}

}  // namespace
