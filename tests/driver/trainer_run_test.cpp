// RayPPOTrainer end to end on the embedded runtime (2 CPU ranks, a tiny Qwen2): a GRPO run and a
// PPO run (GAE + critic + reference policy with KL in the reward), a few steps each, through every
// worker group. The checks are structural (every step's metrics, verl's names, the jsonl log) plus
// invariants that follow from the data: scores are 0/1 accuracies, response lengths are within
// [1, max_response_length], GRPO advantages have zero mean per group.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "driver/plot.hpp"
#include "driver/ppo_trainer.hpp"
#include "proto/device.hpp"
#include "tests/driver/trainer_test_util.hpp"

namespace tessera::driver {
namespace {

using testing::TempDir;

void expect_step_metrics(const Metrics& m, const std::vector<std::string>& keys) {
  for (const auto& k : keys) {
    auto it = m.find(k);
    ASSERT_NE(it, m.end()) << "missing metric " << k;
    EXPECT_TRUE(std::isfinite(it->second)) << k << " = " << it->second;
  }
  EXPECT_GE(m.at("critic/score/min"), 0.0);
  EXPECT_LE(m.at("critic/score/max"), 1.0);
  EXPECT_GE(m.at("response_length/min"), 1.0);
  EXPECT_LE(m.at("response_length/max"), 4.0);
}

TEST(TrainerRun, GrpoThreeSteps) {
  TempDir dir("grpo");
  testing::make_tiny_run(dir.path());
  auto t = testing::fit_trainer(testing::tiny_ppo_overrides(dir.path(), "grpo", 3));
  ASSERT_NE(t, nullptr);
  const auto& h = t->history();
  ASSERT_EQ(h.size(), 4u);  // validation before training + 3 steps
  EXPECT_EQ(h[0].first, 0);
  bool has_val = false;
  for (const auto& [k, v] : h[0].second) has_val |= k.rfind("val-core/tessera/arith/", 0) == 0;
  EXPECT_TRUE(has_val);
  for (int64_t step = 1; step <= 3; ++step) {
    const Metrics& m = h[static_cast<size_t>(step)].second;
    EXPECT_EQ(h[static_cast<size_t>(step)].first, step);
    expect_step_metrics(m, {"timing_s/gen", "timing_s/reward", "timing_s/old_log_prob", "timing_s/adv",
                            "timing_s/update_actor", "timing_s/step", "actor/pg_loss", "actor/grad_norm",
                            "critic/score/mean", "critic/advantages/mean", "response_length/mean",
                            "prompt_length/mean", "global_seqlen/balanced_max", "perf/throughput",
                            "training/global_step"});
    EXPECT_EQ(m.count("timing_s/values"), 0u);  // no critic for GRPO
    EXPECT_EQ(m.at("training/global_step"), static_cast<double>(step));
  }
  // test_freq=2: validation at step 2 and at the last step.
  for (int64_t step : {2, 3}) {
    bool val = false;
    for (const auto& [k, v] : h[static_cast<size_t>(step)].second) val |= k.rfind("val-core/", 0) == 0;
    EXPECT_TRUE(val) << "step " << step;
  }
  auto rows = read_metrics_jsonl(dir.path() / "run" / "metrics.jsonl");
  ASSERT_TRUE(rows.ok()) << rows.status().to_string();
  EXPECT_EQ(rows->size(), 4u);
}

TEST(TrainerRun, PpoWithCriticAndKlInReward) {
  TempDir dir("ppo");
  testing::make_tiny_run(dir.path());
  auto o = testing::tiny_ppo_overrides(dir.path(), "gae", 3);
  o.push_back("algorithm.use_kl_in_reward=true");
  o.push_back("algorithm.kl_ctrl.type=adaptive");
  auto t = testing::fit_trainer(o);
  ASSERT_NE(t, nullptr);
  ASSERT_NE(t->critic_wg(), nullptr);
  const auto& h = t->history();
  ASSERT_EQ(h.size(), 4u);
  for (int64_t step = 1; step <= 3; ++step) {
    const Metrics& m = h[static_cast<size_t>(step)].second;
    expect_step_metrics(m, {"timing_s/ref", "timing_s/values", "timing_s/update_critic", "timing_s/update_actor",
                            "critic/vf_loss", "critic/values/mean", "critic/returns/mean", "critic/rewards/mean",
                            "actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff", "actor/pg_loss"});
  }
  // The adaptive controller starts at kl_coef (0.001) and moves once per step.
  EXPECT_DOUBLE_EQ(h[1].second.at("actor/reward_kl_penalty_coeff"), 0.001);
}

TEST(TrainerRun, BadConfigIsRefusedBeforeStarting) {
  TempDir dir("bad");
  testing::make_tiny_run(dir.path());
  auto o = testing::tiny_ppo_overrides(dir.path(), "grpo", 3);
  o.push_back("data.train_batch_size=3");  // 3 x n=2 rows cannot be split over 2 ranks' mini-batches
  auto cfg = load_config(ConfigKind::ppo, "", o);
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  auto t = RayPPOTrainer::create(std::move(*cfg), testing::trainer_registry(), {nullptr, nullptr, {}});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message().find('\n'), std::string::npos);
}

TEST(TrainerRun, CudaWithoutThatGpuIsRefusedInOneLine) {
  // trainer.device=cuda must run on the GPU or stop: never compute on the CPU instead.
  TempDir dir("grpo_no_gpu");
  testing::make_tiny_run(dir.path());
  auto overrides = testing::tiny_ppo_overrides(dir.path(), "grpo", 1);
  for (auto& o : overrides) {
    if (o.rfind("trainer.n_gpus_per_node=", 0) == 0) o = "trainer.n_gpus_per_node=" + std::to_string(proto::cuda_device_count() + 1);
    if (o.rfind("trainer.device=", 0) == 0) o = "trainer.device=cuda";
  }
  auto cfg = load_config(ConfigKind::ppo, "", overrides);
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  PpoTrainerOptions o;
  o.console = nullptr;
  o.progress = nullptr;
  auto t = RayPPOTrainer::create(std::move(*cfg), testing::trainer_registry(), o);
  Status st = t.ok() ? (*t)->init_workers() : t.status();
  ASSERT_FALSE(st.ok()) << "a cuda run must not fall back to the CPU";
  EXPECT_NE(st.message().find("cuda:" + std::to_string(proto::cuda_device_count())), std::string::npos)
      << st.to_string();
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.to_string();
}

}  // namespace
}  // namespace tessera::driver
