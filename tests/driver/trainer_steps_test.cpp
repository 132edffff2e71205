// The driver-side steps of fit(): balance_batch's Karmarkar-Karp partitions, apply_kl_penalty and
// compute_advantage, each checked against hand-computed values or brute force.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <random>
#include <set>

#include "driver/ppo_trainer.hpp"

namespace tessera::driver {
namespace {

int64_t spread(const std::vector<std::vector<int64_t>>& parts, const std::vector<int64_t>& lens) {
  int64_t mn = INT64_MAX, mx = INT64_MIN;
  for (const auto& p : parts) {
    int64_t s = 0;
    for (int64_t i : p) s += lens[static_cast<size_t>(i)];
    mn = std::min(mn, s), mx = std::max(mx, s);
  }
  return mx - mn;
}

TEST(BalanceBatch, PartitionsAreEqualSizedSortedCovers) {
  std::mt19937 g(3);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t k = 1 + trial % 4, per = 1 + trial % 5;
    std::vector<int64_t> lens(static_cast<size_t>(k * per));
    for (auto& l : lens) l = 1 + static_cast<int64_t>(g() % 50);
    auto parts = balanced_equal_partitions(lens, k);
    ASSERT_TRUE(parts.ok()) << parts.status().to_string();
    ASSERT_EQ(static_cast<int64_t>(parts->size()), k);
    std::set<int64_t> seen;
    for (const auto& p : *parts) {
      EXPECT_EQ(static_cast<int64_t>(p.size()), per);
      EXPECT_TRUE(std::is_sorted(p.begin(), p.end()));
      seen.insert(p.begin(), p.end());
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), k * per);
    // Never worse than the contiguous split the dispatch would otherwise make.
    std::vector<std::vector<int64_t>> contiguous(static_cast<size_t>(k));
    for (int64_t i = 0; i < k * per; ++i) contiguous[static_cast<size_t>(i / per)].push_back(i);
    EXPECT_LE(spread(*parts, lens), spread(contiguous, lens));
  }
}

TEST(BalanceBatch, HandCases) {
  auto parts = balanced_equal_partitions({1, 2, 3, 4}, 2);
  ASSERT_TRUE(parts.ok());
  EXPECT_EQ(spread(*parts, {1, 2, 3, 4}), 0);  // {1,4} {2,3}
  EXPECT_FALSE(balanced_equal_partitions({1, 2, 3}, 2).ok());
}

TEST(BalanceBatch, ReordersRowsAndReportsSeqlens) {
  at::Tensor mask = torch::zeros({4, 6}, torch::kInt64);
  const int64_t lens[] = {6, 5, 1, 2};
  for (int i = 0; i < 4; ++i) mask[i].narrow(0, 0, lens[i]).fill_(1);
  auto batch = proto::DataProto::from_dict({{"attention_mask", mask}, {"row", torch::arange(4)}});
  ASSERT_TRUE(batch.ok());
  Metrics m;
  ASSERT_TRUE(balance_batch(*batch, 2, m).ok());
  at::Tensor rows = *batch->tensor("row");
  // Each half must sum to 7 (6+1 and 5+2) instead of 11 / 3.
  at::Tensor l = (*batch->tensor("attention_mask")).sum(-1);
  EXPECT_EQ(l.narrow(0, 0, 2).sum().item<int64_t>(), 7);
  EXPECT_EQ(l.narrow(0, 2, 2).sum().item<int64_t>(), 7);
  EXPECT_EQ(m["global_seqlen/min"], 3);
  EXPECT_EQ(m["global_seqlen/max"], 11);
  EXPECT_EQ(m["global_seqlen/balanced_min"], 7);
  EXPECT_EQ(m["global_seqlen/balanced_max"], 7);
  EXPECT_EQ(m["global_seqlen/mean"], 7);
  EXPECT_EQ(rows.numel(), 4);
}

TEST(KlPenalty, MatchesHandComputation) {
  at::Tensor old_lp = torch::tensor({{-1.0, -2.0, -0.5}, {-0.2, -0.3, -0.4}});
  at::Tensor ref_lp = torch::tensor({{-1.5, -1.0, -0.5}, {-0.2, -0.1, -9.0}});
  at::Tensor mask = torch::tensor({{1.0, 1.0, 0.0}, {1.0, 1.0, 1.0}});
  at::Tensor scores = torch::tensor({{0.0, 1.0, 0.0}, {0.0, 0.0, 0.5}});
  auto batch = proto::DataProto::from_dict(
      {{"old_log_probs", old_lp}, {"ref_log_prob", ref_lp}, {"response_mask", mask}, {"token_level_scores", scores}});
  ASSERT_TRUE(batch.ok());
  auto kl = apply_kl_penalty(*batch, 0.1, "kl");
  ASSERT_TRUE(kl.ok()) << kl.status().to_string();
  // kl = old - ref, masked: row0 [0.5, -1, 0] mean over 2 = -0.25; row1 [0, -0.2, 8.6] mean 8.4/3.
  EXPECT_NEAR(*kl, (-0.25 + 8.4 / 3) / 2, 1e-6);
  at::Tensor want = torch::tensor({{-0.05, 1.1, 0.0}, {0.0, 0.02, 0.5 - 0.86}});
  EXPECT_TRUE(torch::allclose(*batch->tensor("token_level_rewards"), want, 1e-6, 1e-6));
}

TEST(ComputeAdvantage, GrpoMatchesGroupFormula) {
  at::Tensor rewards = torch::zeros({4, 2});
  rewards[0][1] = 1.0, rewards[1][0] = 0.0, rewards[2][1] = 1.0, rewards[3][1] = 1.0;
  at::Tensor mask = torch::ones({4, 2});
  auto batch = proto::DataProto::from_dict({{"token_level_rewards", rewards}, {"response_mask", mask}},
                                           {{"uid", proto::Column::strings({"a", "a", "b", "b"})}});
  ASSERT_TRUE(batch.ok()) << batch.status().to_string();
  ASSERT_TRUE(compute_advantage(*batch, "grpo", 1.0, 1.0, true).ok());
  at::Tensor adv = *batch->tensor("advantages");
  // group a: scores {1, 0}: mean .5, unbiased std sqrt(.5); group b: {1, 1}: std 0 -> 0.
  const double a = 0.5 / (std::sqrt(0.5) + 1e-6);
  EXPECT_NEAR(adv[0][0].item<double>(), a, 1e-5);
  EXPECT_NEAR(adv[1][1].item<double>(), -a, 1e-5);
  EXPECT_NEAR(adv[2][0].item<double>(), 0.0, 1e-6);
}

// verl's PF-PPO: rows drawn with replacement by score weight; with one row carrying all the
// weight, every drawn row is that row (tensors, columns and per-row meta_info alike).
TEST(PfPpo, ResamplesRowsByScoreWeight) {
  at::Tensor scores = torch::zeros({4, 3});
  scores[2][1] = 3.0;  // pow: weights 1e-8, 1e-8, 9, 1e-8
  auto batch = proto::DataProto::from_dict({{"token_level_scores", scores}, {"row", torch::arange(4)}},
                                           {{"uid", proto::Column::strings({"a", "b", "c", "d"})}});
  ASSERT_TRUE(batch.ok());
  batch->meta_info()["global_token_num"] = {10, 11, 12, 13};
  batch->meta_info()["temperature"] = 1.0;
  ASSERT_TRUE(pf_ppo_reweight(*batch, "pow", 2.0).ok());
  EXPECT_TRUE(torch::equal(*batch->tensor("row"), torch::full({4}, 2, torch::kInt64)));
  EXPECT_EQ(batch->column("uid")->row_json(3), "c");
  EXPECT_EQ(batch->meta_info()["global_token_num"], nlohmann::json({12, 12, 12, 12}));
  EXPECT_EQ(batch->meta_info()["temperature"], 1.0);
  // max_min: only the max (row 2) and min (rows 0, 1, 3: all 0) carry weight, i.e. everything.
  EXPECT_TRUE(pf_ppo_reweight(*batch, "max_min", 2.0).ok());
  auto bad = pf_ppo_reweight(*batch, "softmax", 2.0);
  EXPECT_NE(bad.message().find("algorithm.pf_ppo.reweight_method = 'softmax'"), std::string::npos);
}

TEST(ComputeAdvantage, GaeMatchesRecursionBeforeWhitening) {
  at::Tensor rewards = torch::tensor({{0.0, 0.0, 1.0}, {0.0, 0.5, 0.0}});
  at::Tensor values = torch::tensor({{0.1, 0.2, 0.3}, {0.4, 0.5, 0.6}});
  at::Tensor mask = torch::ones({2, 3});
  auto batch = proto::DataProto::from_dict({{"token_level_rewards", rewards}, {"values", values}, {"response_mask", mask}});
  ASSERT_TRUE(batch.ok());
  ASSERT_TRUE(compute_advantage(*batch, "gae", 0.9, 0.8, true).ok());
  // returns = A + V with A from delta_t = r_t + g V_{t+1} - V_t, A_t = delta_t + g l A_{t+1}.
  at::Tensor returns = *batch->tensor("returns");
  for (int64_t b = 0; b < 2; ++b) {
    double next_v = 0, next_a = 0;
    for (int64_t t = 2; t >= 0; --t) {
      const double v = values[b][t].item<double>();
      const double delta = rewards[b][t].item<double>() + 0.9 * next_v - v;
      next_a = delta + 0.9 * 0.8 * next_a;
      next_v = v;
      EXPECT_NEAR(returns[b][t].item<double>(), next_a + v, 1e-5) << "row " << b << " t " << t;
    }
  }
}

TEST(ComputeAdvantage, UnknownEstimatorIsNamed) {
  auto batch = proto::DataProto::from_dict({{"token_level_rewards", torch::zeros({2, 2})}, {"response_mask", torch::ones({2, 2})}});
  ASSERT_TRUE(batch.ok());
  Status st = compute_advantage(*batch, "nope", 1.0, 1.0, true);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("nope"), std::string::npos);
}

}  // namespace
}  // namespace tessera::driver
