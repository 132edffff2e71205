// The driver REPL (app/repl.hpp): every command against a tiny 2-rank embedded GRPO run; bad
// commands print an error and the help and never end the session.
#include "app/repl.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "driver/config.hpp"
#include "tests/driver/trainer_test_util.hpp"

namespace tessera::app {
namespace {

namespace fs = std::filesystem;

TEST(SplitCommandLine, QuotesAndEscapes) {
  auto w = split_command_line(R"(generate "1+2= \"x\"" 'a b'  c)");
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(*w, (std::vector<std::string>{"generate", "1+2= \"x\"", "a b", "c"}));
  EXPECT_TRUE(split_command_line("   ")->empty());
  EXPECT_EQ(*split_command_line("call a b meta={\"k\":1}"),
            (std::vector<std::string>{"call", "a", "b", "meta={k:1}"}));  // quotes group, then vanish
  EXPECT_FALSE(split_command_line("generate \"open").ok());
}

class ReplSession : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() / ("tessera_repl_" + std::to_string(::getpid())));
    fs::create_directories(*dir_);
    driver::testing::make_tiny_run(*dir_);
    auto cfg = driver::load_config(driver::ConfigKind::ppo, "",
                                   driver::testing::tiny_ppo_overrides(*dir_, "grpo", 3));
    ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
    out_ = std::tmpfile();
    auto repl = Repl::create(std::move(*cfg), out_);
    ASSERT_TRUE(repl.ok()) << repl.status().to_string();
    repl_ = repl->release();
  }
  static void TearDownTestSuite() {
    delete repl_;
    if (out_) std::fclose(out_);
    fs::remove_all(*dir_);
    delete dir_;
  }

  // Runs `line`; returns what it printed. The session must go on unless the line is quit.
  std::string run(const std::string& line, bool expect_continue = true) {
    std::fflush(out_);
    long start = std::ftell(out_);
    EXPECT_EQ(repl_->execute(line), expect_continue) << line;
    std::fflush(out_);
    long end = std::ftell(out_);
    std::string text(static_cast<size_t>(end - start), '\0');
    std::fseek(out_, start, SEEK_SET);
    size_t got = std::fread(text.data(), 1, text.size(), out_);
    text.resize(got);
    std::fseek(out_, 0, SEEK_END);
    return text;
  }

  static fs::path* dir_;
  static std::FILE* out_;
  static Repl* repl_;
};
fs::path* ReplSession::dir_ = nullptr;
std::FILE* ReplSession::out_ = nullptr;
Repl* ReplSession::repl_ = nullptr;

TEST_F(ReplSession, BadCommandsPrintAnErrorAndTheHelp) {
  ASSERT_NE(repl_, nullptr);
  std::string out = run("frobnicate now");
  EXPECT_NE(out.find("unknown command 'frobnicate'"), std::string::npos) << out;
  EXPECT_NE(out.find("commands:"), std::string::npos) << out;
  EXPECT_NE(run("call nosuchgroup m").find("no worker group 'nosuchgroup'"), std::string::npos);
  EXPECT_NE(run("run zero").find("N must be a positive integer"), std::string::npos);
  EXPECT_NE(run("generate \"unclosed").find("unclosed"), std::string::npos);
  EXPECT_NE(run("call actor_rollout no_such_method").find("no_such_method"), std::string::npos);
  EXPECT_NE(run("inspect rows=x").find("error"), std::string::npos);
  EXPECT_EQ(run(""), "");
}

TEST_F(ReplSession, GroupsAndMethods) {
  ASSERT_NE(repl_, nullptr);
  std::string groups = run("groups");
  EXPECT_NE(groups.find("actor_rollout (2 ranks)"), std::string::npos) << groups;
  EXPECT_NE(groups.find("cpu:1"), std::string::npos) << groups;
  std::string methods = run("methods actor_rollout");
  EXPECT_NE(methods.find("generate_sequences"), std::string::npos) << methods;
  EXPECT_NE(methods.find("DP_COMPUTE_PROTO"), std::string::npos) << methods;
  EXPECT_NE(methods.find("init_model"), std::string::npos) << methods;
  EXPECT_EQ(repl_->complete({}, "g"), (std::vector<std::string>{"generate", "groups"}));
  EXPECT_EQ(repl_->complete({"call"}, "actor_r"), (std::vector<std::string>{"actor_rollout"}));
  auto m = repl_->complete({"call", "actor_rollout"}, "generate_");
  EXPECT_EQ(m, (std::vector<std::string>{"generate_sequences"}));
}

TEST_F(ReplSession, GenerateThenInspect) {
  ASSERT_NE(repl_, nullptr);
  EXPECT_NE(run("inspect").find("nothing to inspect"), std::string::npos);
  std::string gen = run("generate \"3+4=\"");
  EXPECT_EQ(gen.find("error"), std::string::npos) << gen;
  std::string ins = run("inspect rows=1");
  EXPECT_NE(ins.find("DataProto: 2 rows"), std::string::npos) << ins;  // one prompt per rank
  EXPECT_NE(ins.find("responses"), std::string::npos) << ins;
  EXPECT_NE(ins.find("prompts[0]: "), std::string::npos) << ins;
  EXPECT_NE(ins.find("3+4="), std::string::npos) << ins;  // the prompt decodes back
}

TEST_F(ReplSession, CallWithDataRowsStepMetricsAndSave) {
  ASSERT_NE(repl_, nullptr);
  std::string call = run(R"(call actor_rollout generate_sequences rows=2 meta='{"eos_token_id":1,"pad_token_id":0}')");
  EXPECT_NE(call.find("DataProto: 2 rows"), std::string::npos) << call;
  EXPECT_NE(run("metrics").find("no step has run yet"), std::string::npos);
  std::string step = run("step");
  EXPECT_NE(step.find("step 1: critic/score/mean"), std::string::npos) << step;
  std::string metrics = run("metrics response_length/");
  EXPECT_NE(metrics.find("response_length/mean"), std::string::npos) << metrics;
  EXPECT_EQ(metrics.find("actor/"), std::string::npos) << metrics;  // filtered by prefix
  std::string save = run("save");
  EXPECT_NE(save.find("saved global_step_1"), std::string::npos) << save;
  EXPECT_TRUE(fs::exists(*dir_ / "run" / "global_step_1"));
  std::string more = run("run 5");  // total_training_steps=3: stops at the end
  EXPECT_NE(more.find("step 3:"), std::string::npos) << more;
  EXPECT_NE(more.find("training finished"), std::string::npos) << more;
  run("quit", /*expect_continue=*/false);
}

}  // namespace
}  // namespace tessera::app
