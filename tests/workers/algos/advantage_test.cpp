// advantage_test.cpp: the advantage estimators and their registry, checked against independent
// arithmetic (closed forms and small hand-computable cases), plus the error paths.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "workers/algos/advantage.hpp"

namespace tessera::algos {
namespace {

const torch::TensorOptions kF64 = torch::TensorOptions().dtype(torch::kFloat64);

// Rewards with the score on the last valid token (verl's reward managers do this).
torch::Tensor outcome_rewards(const std::vector<double>& scores, int64_t T) {
  torch::Tensor r = torch::zeros({static_cast<int64_t>(scores.size()), T}, kF64);
  for (size_t i = 0; i < scores.size(); ++i) r[static_cast<int64_t>(i)][T - 1] = scores[i];
  return r;
}

TEST(AdvantageRegistry, HasVerlEstimators) {
  for (const char* name : {"gae", "grpo", "grpo_passk", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax",
                           "rloo", "opo", "gpg"}) {
    EXPECT_TRUE(get_adv_estimator_fn(name).ok()) << name;
  }
}

TEST(AdvantageRegistry, UnknownNameListsKnownOnes) {
  auto fn = get_adv_estimator_fn("grpo_vectorized_typo");
  ASSERT_FALSE(fn.ok());
  EXPECT_EQ(fn.status().code(), ErrorCode::not_found);
  EXPECT_NE(fn.status().message().find("grpo_vectorized_typo"), std::string::npos);
  EXPECT_NE(fn.status().message().find("rloo"), std::string::npos);
  EXPECT_NE(fn.status().message().find("algorithm.adv_estimator"), std::string::npos);
}

TEST(AdvantageRegistry, UserEstimatorCanBeRegisteredOnce) {
  AdvantageEstimatorFn negate = [](const AdvantageInputs& in) -> Result<AdvantageReturn> {
    return AdvantageReturn{-in.token_level_rewards, in.token_level_rewards};
  };
  ASSERT_TRUE(register_adv_est("test_negate", negate).ok());
  EXPECT_EQ(register_adv_est("test_negate", negate).code(), ErrorCode::already_exists);
  EXPECT_EQ(register_adv_est("grpo", negate).code(), ErrorCode::already_exists);
  EXPECT_EQ(register_adv_est("test_null", nullptr).code(), ErrorCode::invalid_argument);
  auto fn = get_adv_estimator_fn("test_negate");
  ASSERT_TRUE(fn.ok());
  AdvantageInputs in;
  in.token_level_rewards = torch::ones({2, 3}, kF64);
  in.response_mask = torch::ones({2, 3}, kF64);
  auto out = (*fn)(in);
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(torch::equal(out->advantages, -torch::ones({2, 3}, kF64)));
}

TEST(AdvantageRegistry, RegistryGrpoMatchesDirectCall) {
  torch::manual_seed(3);
  AdvantageInputs in;
  in.token_level_rewards = torch::randn({6, 4}, kF64);
  in.response_mask = torch::ones({6, 4}, kF64);
  in.index = {"a", "a", "a", "b", "b", "b"};
  in.config.norm_adv_by_std_in_grpo = false;
  auto via_registry = (*get_adv_estimator_fn("grpo"))(in);
  auto direct = compute_grpo_outcome_advantage(in.token_level_rewards, in.response_mask, in.index, 1e-6,
                                               /*norm_adv_by_std_in_grpo=*/false);
  ASSERT_TRUE(via_registry.ok() && direct.ok());
  EXPECT_TRUE(torch::allclose(via_registry->advantages, direct->advantages));
}

TEST(Grpo, GroupAdvantagesHaveZeroMeanAndUnitStd) {
  torch::manual_seed(0);
  const int64_t groups = 5, n = 8, T = 7;
  torch::Tensor rewards = torch::randn({groups * n, T}, kF64);
  torch::Tensor mask = torch::ones({groups * n, T}, kF64);
  std::vector<std::string> index;
  for (int64_t i = 0; i < groups * n; ++i) index.push_back("uid-" + std::to_string(i % groups));  // interleaved
  auto out = compute_grpo_outcome_advantage(rewards, mask, index);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const torch::Tensor adv = out->advantages.select(1, 0);
  for (int64_t g = 0; g < groups; ++g) {
    const torch::Tensor rows = torch::arange(g, groups * n, groups);
    const torch::Tensor a = adv.index_select(0, rows);
    EXPECT_NEAR(a.mean().item<double>(), 0.0, 1e-12);
    EXPECT_NEAR(a.std().item<double>(), 1.0, 1e-5);
  }
  EXPECT_TRUE(torch::equal(out->advantages, out->returns));
}

TEST(Grpo, SingletonGroupUsesMeanZeroStdOneAndMaskIsApplied) {
  torch::Tensor rewards = outcome_rewards({2.0, 1.0, 3.0}, 3);
  torch::Tensor mask = torch::tensor({1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0}, kF64).view({3, 3});
  auto out = compute_grpo_outcome_advantage(rewards, mask, {"solo", "pair", "pair"});
  ASSERT_TRUE(out.ok());
  EXPECT_NEAR(out->advantages[0][0].item<double>(), 2.0 / (1.0 + 1e-6), 1e-12);
  // pair {1, 3}: mean 2, unbiased std sqrt(2).
  EXPECT_NEAR(out->advantages[1][1].item<double>(), -1.0 / (std::sqrt(2.0) + 1e-6), 1e-12);
  EXPECT_EQ(out->advantages[1][2].item<double>(), 0.0);
  EXPECT_NEAR(out->advantages[2][0].item<double>(), 1.0 / (std::sqrt(2.0) + 1e-6), 1e-12);
}

TEST(Grpo, BoolAndIntMasksGiveTheSameResult) {
  torch::manual_seed(1);
  torch::Tensor rewards = torch::randn({4, 5}, kF64);
  torch::Tensor mask = (torch::rand({4, 5}, kF64) > 0.3);
  std::vector<std::string> index = {"x", "x", "y", "y"};
  auto a = compute_grpo_outcome_advantage(rewards, mask.to(torch::kFloat64), index);
  auto b = compute_grpo_outcome_advantage(rewards, mask, index);
  auto c = compute_grpo_outcome_advantage(rewards, mask.to(torch::kLong), index);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_TRUE(torch::equal(a->advantages, b->advantages));
  EXPECT_TRUE(torch::equal(a->advantages, c->advantages));
}

TEST(Grpo, Float32StaysFloat32) {
  auto out = compute_grpo_outcome_advantage(torch::randn({4, 3}), torch::ones({4, 3}), {"a", "a", "b", "b"});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->advantages.scalar_type(), torch::kFloat32);
}

TEST(GrpoPassk, OnlyTheBestSampleGetsTheMargin) {
  auto out = compute_grpo_passk_outcome_advantage(outcome_rewards({1.0, 4.0, 2.0, 0.0, 0.5}, 2),
                                                  torch::ones({5, 2}, kF64), {"a", "a", "a", "b", "b"}, 1e-6,
                                                  /*norm_adv_by_std_in_grpo=*/false);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const torch::Tensor expected = torch::tensor({0.0, 2.0, 0.0, 0.0, 0.5}, kF64).unsqueeze(-1).expand({5, 2});
  EXPECT_TRUE(torch::allclose(out->advantages, expected));
  auto normed = compute_grpo_passk_outcome_advantage(outcome_rewards({1.0, 4.0, 2.0}, 1), torch::ones({3, 1}, kF64),
                                                     {"a", "a", "a"});
  ASSERT_TRUE(normed.ok());
  EXPECT_NEAR(normed->advantages[1][0].item<double>(), 2.0 / (std::sqrt(7.0 / 3.0) + 1e-6), 1e-12);
}

TEST(GrpoPassk, SingletonGroupIsAnErrorNamingTheUid) {
  auto out = compute_grpo_passk_outcome_advantage(outcome_rewards({1.0, 2.0, 3.0}, 2), torch::ones({3, 2}, kF64),
                                                  {"a", "a", "lonely"});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), ErrorCode::invalid_argument);
  EXPECT_NE(out.status().message().find("lonely"), std::string::npos);
}

TEST(Rloo, IsScoreMinusLeaveOneOutMean) {
  const std::vector<double> s = {1.0, 2.0, 6.0, 5.0};
  auto out = compute_rloo_outcome_advantage(outcome_rewards(s, 1), torch::ones({4, 1}, kF64), {"g", "g", "g", "solo"});
  ASSERT_TRUE(out.ok());
  EXPECT_NEAR(out->advantages[0][0].item<double>(), 1.0 - (2.0 + 6.0) / 2, 1e-12);
  EXPECT_NEAR(out->advantages[1][0].item<double>(), 2.0 - (1.0 + 6.0) / 2, 1e-12);
  EXPECT_NEAR(out->advantages[2][0].item<double>(), 6.0 - (1.0 + 2.0) / 2, 1e-12);
  EXPECT_NEAR(out->advantages[3][0].item<double>(), 5.0, 1e-12);  // group of one: unchanged
}

TEST(Opo, BaselineIsLengthWeightedGroupMean) {
  torch::Tensor mask = torch::tensor({1.0, 0.0, 0.0, 1.0, 1.0, 1.0}, kF64).view({2, 3});
  auto out = compute_opo_outcome_advantage(outcome_rewards({2.0, 6.0}, 3), mask, {"g", "g"});
  ASSERT_TRUE(out.ok());
  const double baseline = (1 * 2.0 + 3 * 6.0) / 4.0;
  EXPECT_NEAR(out->advantages[0][0].item<double>(), 2.0 - baseline, 1e-12);
  EXPECT_EQ(out->advantages[0][2].item<double>(), 0.0);
  EXPECT_NEAR(out->advantages[1][2].item<double>(), 6.0 - baseline, 1e-12);
}

TEST(Gpg, ScalesByBatchOverNonzeroScores) {
  auto out = compute_gpg_outcome_advantage(outcome_rewards({0.0, 2.0, 0.0, 0.0}, 1), torch::ones({4, 1}, kF64),
                                           {"a", "a", "b", "b"});
  ASSERT_TRUE(out.ok());
  // alpha = 4 / 1; group a mean 1.
  EXPECT_NEAR(out->advantages[0][0].item<double>(), 4.0 * (0.0 - 1.0), 1e-12);
  EXPECT_NEAR(out->advantages[1][0].item<double>(), 4.0 * (2.0 - 1.0), 1e-12);
  EXPECT_NEAR(out->advantages[2][0].item<double>(), 0.0, 1e-12);
}

TEST(Gae, GammaLambdaOneGivesRewardToGoMinusValue) {
  torch::manual_seed(2);
  torch::Tensor rewards = torch::randn({3, 5}, kF64);
  torch::Tensor values = torch::randn({3, 5}, kF64);
  torch::Tensor mask = torch::ones({3, 5}, kF64);
  auto out = compute_gae_advantage_return(rewards, values, mask, 1.0, 1.0);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const torch::Tensor to_go = rewards.flip({1}).cumsum(1).flip({1});
  EXPECT_TRUE(torch::allclose(out->returns, to_go, 1e-12, 1e-12));
  const torch::Tensor raw = to_go - values;
  const torch::Tensor whitened = (raw - raw.mean()) / torch::sqrt(raw.var() + 1e-8);
  EXPECT_TRUE(torch::allclose(out->advantages, whitened, 1e-9, 1e-9));
}

TEST(Gae, DiscountedOneStepCase) {
  // T=2, all valid: A1 = r1 - V1; A0 = r0 + γV1 - V0 + γλA1; returns = A + V.
  torch::Tensor rewards = torch::tensor({{0.5, 1.0}, {0.0, 2.0}}, kF64);
  torch::Tensor values = torch::tensor({{0.2, 0.4}, {0.1, 0.3}}, kF64);
  const double g = 0.9, l = 0.8;
  auto out = compute_gae_advantage_return(rewards, values, torch::ones({2, 2}, kF64), g, l);
  ASSERT_TRUE(out.ok());
  const double a1 = 1.0 - 0.4, a0 = 0.5 + g * 0.4 - 0.2 + g * l * a1;
  EXPECT_NEAR(out->returns[0][1].item<double>(), a1 + 0.4, 1e-12);
  EXPECT_NEAR(out->returns[0][0].item<double>(), a0 + 0.2, 1e-12);
}

TEST(Gae, ErrorsNameTheProblem) {
  torch::Tensor r = torch::zeros({2, 3}, kF64);
  auto missing = (*get_adv_estimator_fn("gae"))(AdvantageInputs{r, torch::ones({2, 3}, kF64), {}, {}, {}, {}});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("'values'"), std::string::npos);
  auto shape = compute_gae_advantage_return(r, torch::zeros({2, 4}, kF64), torch::ones({2, 3}, kF64), 1.0, 1.0);
  ASSERT_FALSE(shape.ok());
  EXPECT_EQ(shape.status().code(), ErrorCode::invalid_argument);
  // Whitening one valid token divides by zero in verl, which raises; here it is an error.
  torch::Tensor one = torch::zeros({2, 3}, kF64);
  one[0][0] = 1.0;
  auto single = compute_gae_advantage_return(r, r, one, 1.0, 1.0);
  ASSERT_FALSE(single.ok());
  EXPECT_NE(single.status().message().find("compute_gae_advantage_return"), std::string::npos);
}

TEST(ReinforcePlusPlus, ReturnsResetAfterEos) {
  torch::Tensor rewards = torch::tensor({{1.0, 2.0, 100.0}, {0.5, 0.5, 0.5}}, kF64);
  torch::Tensor mask = torch::tensor({{1.0, 1.0, 0.0}, {1.0, 1.0, 1.0}}, kF64);
  auto out = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, 0.5);
  ASSERT_TRUE(out.ok());
  EXPECT_NEAR(out->returns[0][1].item<double>(), 2.0, 1e-12);  // the padding reward does not leak back
  EXPECT_NEAR(out->returns[0][0].item<double>(), 1.0 + 0.5 * 2.0, 1e-12);
  EXPECT_NEAR(out->returns[1][0].item<double>(), 0.5 + 0.25 + 0.125, 1e-12);
  EXPECT_EQ(out->advantages[0][2].item<double>(), 0.0);
}

TEST(Remax, SubtractsTheGreedyBaseline) {
  torch::Tensor rewards = torch::tensor({{0.0, 1.0, 2.0}}, kF64);
  torch::Tensor mask = torch::tensor({{1.0, 1.0, 0.0}}, kF64);
  auto out = compute_remax_outcome_advantage(rewards, torch::tensor({0.25}, kF64), mask);
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(torch::allclose(out->returns, torch::tensor({{1.0, 1.0, 0.0}}, kF64)));
  EXPECT_TRUE(torch::allclose(out->advantages, torch::tensor({{0.75, 0.75, 0.0}}, kF64)));
  auto bad = compute_remax_outcome_advantage(rewards, torch::tensor({0.25, 0.5}, kF64), mask);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("reward_baselines"), std::string::npos);
}

TEST(GroupEstimators, IndexLengthMismatchIsAnError) {
  auto out = compute_rloo_outcome_advantage(torch::zeros({3, 2}, kF64), torch::ones({3, 2}, kF64), {"a", "b"});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), ErrorCode::invalid_argument);
  EXPECT_NE(out.status().message().find("'index'"), std::string::npos);
  auto mask = compute_grpo_outcome_advantage(torch::zeros({2, 2}, kF64), torch::ones({2, 3}, kF64), {"a", "b"});
  ASSERT_FALSE(mask.ok());
  EXPECT_NE(mask.status().message().find("response_mask"), std::string::npos);
  auto not_2d = compute_opo_outcome_advantage(torch::zeros({2}, kF64), torch::ones({2}, kF64), {"a", "b"});
  EXPECT_FALSE(not_2d.ok());
}

}  // namespace
}  // namespace tessera::algos
