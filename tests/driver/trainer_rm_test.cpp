// With reward_model.enable the reward-model worker group's rm_scores replace the rule scorer:
// the tiny run's rule scores are 0/1 accuracies, while an (untrained) value-head reward model
// gives continuous scores. The RM group is colocated with the actor like verl's global pool.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "driver/ppo_trainer.hpp"
#include "tests/driver/trainer_test_util.hpp"

namespace tessera::driver {
namespace {

bool is_zero_or_one(double v) { return v == 0.0 || v == 1.0; }

TEST(TrainerRewardModel, RmScoresReplaceTheRuleScorer) {
  testing::TempDir dir("rm");
  testing::make_tiny_run(dir.path());
  std::vector<std::string> o = testing::tiny_ppo_overrides(dir.path(), "grpo", 1);
  o.push_back("trainer.val_before_train=false");
  o.push_back("reward_model.enable=true");
  o.push_back("reward_model.model.path=" + (dir.path() / "model").string());
  o.push_back("reward_model.micro_batch_size_per_gpu=4");
  auto t = testing::fit_trainer(o);
  ASSERT_NE(t, nullptr);
  bool has_rm = false;
  for (const auto& [name, wg] : t->worker_groups()) has_rm |= name == "rm";
  EXPECT_TRUE(has_rm);
  ASSERT_EQ(t->history().size(), 1u);
  const Metrics& m = t->history()[0].second;
  const double lo = m.at("critic/score/min"), hi = m.at("critic/score/max");
  EXPECT_TRUE(std::isfinite(lo) && std::isfinite(hi));
  EXPECT_LT(lo, hi);
  EXPECT_FALSE(is_zero_or_one(lo) && is_zero_or_one(hi)) << "scores look like rule accuracies: " << lo << " " << hi;
}

// verl's _validate validates rule-based rewards only: with the reward model enabled and
// reward_model.style "model" in the validation data, validation gives no metrics (and runs no
// scorer, which for such rows may not exist); with style "rule" it runs as without the RM.
TEST(TrainerRewardModel, ValidationSkipsModelStyleRewardsAsVerl) {
  testing::TempDir dir("rm_val");
  testing::make_tiny_run(dir.path());
  for (const std::string style : {"model", "rule"}) {
    std::ifstream in(dir.path() / "data" / "rl_val.jsonl");
    std::string text, line;
    while (std::getline(in, line)) {
      auto row = nlohmann::json::parse(line);
      row["reward_model"]["style"] = style;
      text += row.dump() + "\n";
    }
    const auto val_file = dir.path() / "data" / ("val_" + style + ".jsonl");
    std::ofstream(val_file) << text;
    std::vector<std::string> o = testing::tiny_ppo_overrides(dir.path(), "grpo", 1);
    o.push_back("data.val_files=" + val_file.string());
    o.push_back("trainer.val_before_train=true");
    o.push_back("trainer.default_local_dir=" + (dir.path() / ("run_" + style)).string());
    o.push_back("reward_model.enable=true");
    o.push_back("reward_model.model.path=" + (dir.path() / "model").string());
    o.push_back("reward_model.micro_batch_size_per_gpu=4");
    auto t = testing::fit_trainer(o);
    ASSERT_NE(t, nullptr) << style;
    ASSERT_EQ(t->history().size(), 2u) << style;  // validation before training + 1 step
    bool val = false;
    for (const auto& [k, v] : t->history()[0].second) val |= k.rfind("val-core/", 0) == 0;
    EXPECT_EQ(val, style == "rule") << style;
  }
}

}  // namespace
}  // namespace tessera::driver
