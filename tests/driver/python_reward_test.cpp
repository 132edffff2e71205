// custom_reward_function: a user's Python compute_score in a pool of processes: scores in order
// with reward_kwargs, dict results as extra infos, a raising call named by row and data_source
// (or scored 0 on request), a call past the timeout (the process is replaced and the pool keeps
// working), a file that does not load, and the whole path through NaiveRewardManager.
#include <gtest/gtest.h>

#include <fstream>
#include <optional>

#include "driver/config.hpp"
#include "driver/python_reward.hpp"
#include "tests/driver/driver_test_util.hpp"

namespace tessera::driver {
namespace {

using nlohmann::json;

const char* kRewardFile = R"PY(
import os, threading

def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    print("a user's print goes to stderr, not into the protocol")
    os.system("echo so does a program it starts")
    if solution_str == "boom":
        raise ValueError("cannot parse")
    if solution_str == "slow":
        threading.Event().wait()  # never set: the call hangs until the pool kills the process
    if data_source == "dict":
        return {"score": float(solution_str == ground_truth) + bonus, "acc": solution_str == ground_truth}
    return float(solution_str == ground_truth) + bonus + (extra_info or {}).get("extra", 0)
)PY";

PythonRewardOptions options(const std::filesystem::path& file) {
  PythonRewardOptions o;
  o.path = file.string();
  o.processes = 3;
  o.kwargs = {{"bonus", 0.5}};
  o.timeout = std::chrono::milliseconds(20000);
  return o;
}

std::vector<ScoreRequest> rows(const std::vector<std::string>& answers, const std::string& source = "math") {
  std::vector<ScoreRequest> out;
  for (size_t i = 0; i < answers.size(); ++i) {
    out.push_back({source, answers[i], std::to_string(i), json(nullptr)});
  }
  return out;
}

TEST(PythonReward, ScoresInOrderAcrossProcesses) {
  testing::TempDir dir("pyreward");
  auto file = dir.write("reward.py", kRewardFile);
  auto pool = PythonRewardPool::start(options(file));
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  auto r = (*pool)->score(rows({"0", "x", "2", "3", "y", "5", "6"}));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::vector<double> got;
  for (const auto& s : *r) got.push_back(s.score);
  EXPECT_EQ(got, (std::vector<double>{1.5, 0.5, 1.5, 1.5, 0.5, 1.5, 1.5}));
  auto d = (*pool)->score(rows({"0", "1", "x"}, "dict"));
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ((*d)[2].score, 0.5);
  EXPECT_EQ((*d)[1].extra, json({{"acc", true}}));
  auto extra = (*pool)->score({{"math", "0", "0", json({{"extra", 2}})}});
  ASSERT_TRUE(extra.ok());
  EXPECT_EQ((*extra)[0].score, 3.5);
  EXPECT_TRUE((*pool)->score({}).ok());
}

TEST(PythonReward, ErrorsNameTheRowAndNothingHangs) {
  testing::TempDir dir("pyreward_err");
  auto file = dir.write("reward.py", kRewardFile);
  auto pool = PythonRewardPool::start(options(file));
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  auto boom = (*pool)->score(rows({"0", "1", "2", "boom"}, "gsm8k"));
  ASSERT_FALSE(boom.ok());
  EXPECT_EQ(boom.status().message(),
            "custom_reward_function compute_score: row 3 (data_source 'gsm8k'): ValueError: cannot parse");

  auto lenient = options(file);
  lenient.errors_score_zero = true;
  auto zero_pool = PythonRewardPool::start(lenient);
  ASSERT_TRUE(zero_pool.ok());
  auto zero = (*zero_pool)->score(rows({"0", "boom"}));
  ASSERT_TRUE(zero.ok()) << zero.status().to_string();
  EXPECT_EQ((*zero)[1].score, 0.0);

  auto quick = options(file);
  quick.processes = 1;
  quick.timeout = std::chrono::milliseconds(1500);
  auto slow_pool = PythonRewardPool::start(quick);
  ASSERT_TRUE(slow_pool.ok());
  auto slow = (*slow_pool)->score(rows({"0", "slow"}));
  ASSERT_FALSE(slow.ok());
  EXPECT_EQ(slow.status().code(), ErrorCode::timeout);
  EXPECT_NE(slow.status().message().find("rows 0..1 (data_source 'math'): timed out after 1.5 s"), std::string::npos)
      << slow.status().message();
  auto after = (*slow_pool)->score(rows({"0"}));  // a fresh process took the slot
  ASSERT_TRUE(after.ok()) << after.status().to_string();
  EXPECT_EQ((*after)[0].score, 1.5);
}

TEST(PythonReward, AFileThatDoesNotLoadIsOneLine) {
  testing::TempDir dir("pyreward_bad");
  auto file = dir.write("reward.py", kRewardFile);
  auto o = options(file);
  o.name = "nope";
  auto missing = PythonRewardPool::start(o);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("cannot load nope() from " + file.string() + ": AttributeError"),
            std::string::npos) << missing.status().message();
  auto broken = PythonRewardPool::start(options(dir.write("broken.py", "def compute_score(:\n")));
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().message().find("SyntaxError"), std::string::npos) << broken.status().message();
  EXPECT_EQ(broken.status().message().find('\n'), std::string::npos);

  auto cfg = load_config(ConfigKind::ppo, {}, {"custom_reward_function.path=" + file.string(),
                                               "custom_reward_function.on_error=maybe"});
  ASSERT_TRUE(cfg.ok());
  EXPECT_NE(python_reward_options(*cfg).status().message().find("custom_reward_function.on_error"), std::string::npos);
  cfg = load_config(ConfigKind::ppo, {}, {"custom_reward_function.path=/no/such.py"});
  ASSERT_TRUE(cfg.ok());
  EXPECT_NE(python_reward_options(*cfg).status().message().find("/no/such.py"), std::string::npos);
}

// reward_model.sandbox_fusion: verl's own scorer (here a stand-in package on PYTHONPATH, shadowing
// an installed verl) gets the sandbox's url, memory limit and a semaphore, as verl's
// get_custom_reward_fn passes them, so code runs in the sandbox rather than locally; without a url
// it is called without them.
TEST(PythonReward, VerlScorersGetTheSandboxFusionSettings) {
  testing::TempDir dir("sandbox");
  dir.write("verl/__init__.py", "");
  dir.write("verl/utils/__init__.py", "");
  dir.write("verl/utils/reward_score/__init__.py", R"PY(
def default_compute_score(data_source, solution_str, ground_truth, extra_info=None, sandbox_fusion_url=None,
                          concurrent_semaphore=None, memory_limit_mb=None):
    if solution_str == "slow":
        import threading
        threading.Event().wait()  # the pool replaces this process after its timeout
    if sandbox_fusion_url is None:
        return -1.0
    with concurrent_semaphore:
        return memory_limit_mb / 1000.0 + (sandbox_fusion_url == "http://sandbox:8080/run_code")
)PY");
  // The stand-in must stay importable for the whole test: a replaced process imports it again.
  testing::ScopedEnv python_path("PYTHONPATH", dir.path().string());
  PythonRewardOptions o;
  o.processes = 2;
  o.timeout = std::chrono::milliseconds(3000);
  o.kwargs = {{"bonus", 0.5}};  // custom_reward_function.reward_kwargs: not verl's scorer's
  SandboxFusionOptions sandbox;
  sandbox.url = "http://sandbox:8080/run_code";
  sandbox.memory_limit_mb = 2048;
  auto with = start_verl_scorer_pool(o, "codecontests", sandbox);
  auto without = start_verl_scorer_pool(o, "codecontests");
  ASSERT_TRUE(with.ok()) << with.status().to_string();
  ASSERT_TRUE(without.ok()) << without.status().to_string();
  auto a = (*with)->score(rows({"print(1)", "print(2)", "print(3)"}, "codecontests"));
  auto b = (*without)->score(rows({"print(1)"}, "codecontests"));
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().to_string() << b.status().to_string();
  for (const auto& s : *a) EXPECT_DOUBLE_EQ(s.score, 3.048);
  EXPECT_DOUBLE_EQ((*b)[0].score, -1.0);
  // A call past the timeout: the process is replaced, and the replacement loads verl's scorer
  // with the same settings (the module's directory lives as long as the pool).
  auto slow = (*with)->score(rows({"slow"}, "codecontests"));
  ASSERT_FALSE(slow.ok());
  EXPECT_NE(slow.status().message().find("timed out"), std::string::npos) << slow.status().to_string();
  auto again = (*with)->score(rows({"print(1)", "print(2)"}, "codecontests"));
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  for (const auto& s : *again) EXPECT_DOUBLE_EQ(s.score, 3.048);

  // The settings come from the config's keys; a bad value names its key.
  auto cfg = load_config(ConfigKind::ppo, {}, {"reward_model.sandbox_fusion.url=http://sandbox:8080/run_code",
                                               "reward_model.sandbox_fusion.max_concurrent=0"});
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  auto bad = sandbox_fusion_options(*cfg);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("reward_model.sandbox_fusion.max_concurrent = 0"), std::string::npos);
  (*cfg)["reward_model"]["sandbox_fusion"]["max_concurrent"] = 8;
  auto good = sandbox_fusion_options(*cfg);
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  EXPECT_EQ(good->url, std::optional<std::string>("http://sandbox:8080/run_code"));
  EXPECT_EQ(good->max_concurrent, 8);
  EXPECT_EQ(good->memory_limit_mb, 1024);
}

}  // namespace
}  // namespace tessera::driver
