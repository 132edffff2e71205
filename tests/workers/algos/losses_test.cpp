// losses_test.cpp: agg_loss, value/policy losses, KL, controllers and the verl_F helpers, checked
// against hand-computed values and closed forms, plus every error path.
#include <cmath>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "workers/algos/kl.hpp"
#include "workers/algos/losses.hpp"
#include "workers/algos/policy_loss.hpp"
#include "workers/algos/torch_functional.hpp"

namespace tessera::algos {
namespace {

const torch::TensorOptions kF64 = torch::TensorOptions().dtype(torch::kFloat64);

torch::Tensor loss_mat() { return torch::tensor({{1.0, 2.0, 3.0}, {4.0, 5.0, 6.0}}, kF64); }
torch::Tensor loss_mask() { return torch::tensor({{1.0, 1.0, 0.0}, {1.0, 0.0, 0.0}}, kF64); }

double scalar(const Result<at::Tensor>& r) { return r.value().item<double>(); }

TEST(AggLoss, FourModesByHand) {
  // valid: row0 {1, 2}, row1 {4}
  EXPECT_NEAR(scalar(agg_loss(loss_mat(), loss_mask(), "token-mean")), 7.0 / (3.0 + 1e-8), 1e-12);
  EXPECT_NEAR(scalar(agg_loss(loss_mat(), loss_mask(), "seq-mean-token-sum")), (3.0 + 4.0) / 2, 1e-12);
  EXPECT_NEAR(scalar(agg_loss(loss_mat(), loss_mask(), "seq-mean-token-mean")), (1.5 + 4.0) / 2, 1e-12);
  EXPECT_NEAR(scalar(agg_loss(loss_mat(), loss_mask(), "seq-mean-token-sum-norm")), 7.0 / 3, 1e-12);
  EXPECT_EQ(agg_loss_modes().size(), 4u);
}

TEST(AggLoss, UnknownModeAndBadShapesAreErrors) {
  auto bad = agg_loss(loss_mat(), loss_mask(), "token-sum");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::invalid_argument);
  EXPECT_NE(bad.status().message().find("token-sum"), std::string::npos);
  EXPECT_NE(bad.status().message().find("seq-mean-token-sum-norm"), std::string::npos);
  auto shape = agg_loss(loss_mat(), torch::ones({2, 2}, kF64), "token-mean");
  ASSERT_FALSE(shape.ok());
  EXPECT_NE(shape.status().message().find("loss_mask"), std::string::npos);
  EXPECT_FALSE(agg_loss(torch::ones({6}, kF64), torch::ones({6}, kF64), "token-mean").ok());
  EXPECT_FALSE(agg_loss(torch::Tensor(), loss_mask(), "token-mean").ok());
}

TEST(AggLoss, GradientFlows) {
  torch::Tensor x = loss_mat().clone().requires_grad_(true);
  auto loss = agg_loss(x, loss_mask(), "seq-mean-token-sum");
  ASSERT_TRUE(loss.ok());
  loss->backward();
  EXPECT_TRUE(torch::allclose(x.grad(), loss_mask() / 2));
}

TEST(ValueLoss, ClippedByHand) {
  // One token: values 0, vpreds 1, returns 2, clip 0.5 -> clipped pred 0.5; losses 1 vs 2.25.
  auto out = compute_value_loss(torch::tensor({{1.0}}, kF64), torch::tensor({{2.0}}, kF64), torch::tensor({{0.0}}, kF64),
                                torch::tensor({{1.0}}, kF64), 0.5);
  ASSERT_TRUE(out.ok());
  EXPECT_NEAR(out->vf_loss.item<double>(), 0.5 * 2.25 / (1 + 1e-8), 1e-12);
  EXPECT_NEAR(out->vf_clipfrac.item<double>(), 1.0, 1e-7);
  EXPECT_FALSE(compute_value_loss(torch::ones({1, 1}, kF64), torch::ones({1, 1}, kF64), torch::ones({1, 1}, kF64),
                                  torch::ones({1, 1}, kF64), -0.1)
                   .ok());
  auto shape = compute_value_loss(torch::ones({1, 2}, kF64), torch::ones({1, 1}, kF64), torch::ones({1, 2}, kF64),
                                  torch::ones({1, 2}, kF64), 0.5);
  ASSERT_FALSE(shape.ok());
  EXPECT_NE(shape.status().message().find("'returns'"), std::string::npos);
}

TEST(KlPenalty, EstimatorsByFormula) {
  torch::Tensor lp = torch::tensor({-1.0, -2.0, -0.5}, kF64);
  torch::Tensor ref = torch::tensor({-1.5, -1.0, -0.5}, kF64);
  const torch::Tensor d = lp - ref;
  EXPECT_TRUE(torch::equal(kl_penalty(lp, ref, "k1").value(), d));
  EXPECT_TRUE(torch::equal(kl_penalty(lp, ref, "abs").value(), d.abs()));
  EXPECT_TRUE(torch::allclose(kl_penalty(lp, ref, "mse").value(), 0.5 * d * d));
  EXPECT_TRUE(torch::allclose(kl_penalty(lp, ref, "k3").value(), torch::exp(-d) + d - 1));
}

TEST(KlPenalty, LowVarKlIsClampedAndNonNegative) {
  torch::manual_seed(4);
  torch::Tensor lp = torch::randn({64}, kF64) * 30;
  torch::Tensor ref = torch::randn({64}, kF64) * 30;
  auto kl = kl_penalty(lp, ref, "low_var_kl");
  ASSERT_TRUE(kl.ok());
  EXPECT_LE(kl->max().item<double>(), 10.0);
  EXPECT_GE(kl->min().item<double>(), 0.0);
  auto extreme = kl_penalty(torch::tensor({0.0}, kF64), torch::tensor({50.0}, kF64), "k3");
  EXPECT_EQ(extreme->item<double>(), 10.0);
}

TEST(KlPenalty, FullIsUnimplementedAndUnknownIsInvalid) {
  torch::Tensor x = torch::zeros({2}, kF64);
  EXPECT_EQ(kl_penalty(x, x, "full").status().code(), ErrorCode::unimplemented);
  auto unknown = kl_penalty(x, x, "k4");
  EXPECT_EQ(unknown.status().code(), ErrorCode::invalid_argument);
  EXPECT_NE(unknown.status().message().find("low_var_kl"), std::string::npos);
  EXPECT_FALSE(kl_penalty(x, torch::zeros({3}, kF64), "kl").ok());
}

TEST(KlControllers, AdaptiveAndFixed) {
  AdaptiveKLController adaptive(0.2, 0.1, 1000);
  adaptive.update(10.0, 100);  // error clipped to +0.2
  EXPECT_NEAR(adaptive.value(), 0.2 * (1 + 0.2 * 100 / 1000.0), 1e-15);
  adaptive.update(0.09, 100);  // error -0.1
  EXPECT_NEAR(adaptive.value(), 0.2 * 1.02 * (1 - 0.1 * 100 / 1000.0), 1e-15);
  FixedKLController fixed(0.05);
  fixed.update(123.0, 7);
  EXPECT_EQ(fixed.value(), 0.05);

  auto ok = get_kl_controller({"adaptive", 0.3, 10, 0.1});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)->value(), 0.3);
  EXPECT_EQ(get_kl_controller({"adaptive", 0.3, 0, 0.1}).status().code(), ErrorCode::invalid_argument);
  auto unknown = get_kl_controller({"pid", 0.3, 10, 0.1});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("pid"), std::string::npos);
}

TEST(ComputeRewards, SubtractsScaledKl) {
  torch::Tensor scores = torch::tensor({1.0, 2.0}, kF64);
  auto r = compute_rewards(scores, torch::tensor({-1.0, -1.0}, kF64), torch::tensor({-2.0, -0.5}, kF64), 0.1);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(torch::allclose(*r, torch::tensor({0.9, 2.05}, kF64)));
  EXPECT_FALSE(compute_rewards(scores, torch::zeros({3}, kF64), torch::zeros({2}, kF64), 0.1).ok());
}

TEST(PolicyLossRegistry, KnownAndUnknownModes) {
  for (const char* name : {"vanilla", "gpg", "clip_cov", "kl_cov", "gspo"}) {
    EXPECT_TRUE(get_policy_loss_fn(name).ok()) << name;
  }
  auto unknown = get_policy_loss_fn("sapo");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), ErrorCode::not_found);
  EXPECT_NE(unknown.status().message().find("sapo"), std::string::npos);
  EXPECT_NE(unknown.status().message().find("vanilla"), std::string::npos);
}

// GSPO worked out per sequence: s_i = exp(mean of the masked log-ratios), each token's loss
// max(-A s_i, -A clip(s_i, 1 - 0.2, 1 + 0.28)), the mean over sequences of their token means; the
// gradient of an unclipped token is -A s_i / (rows x tokens of its row), of a clipped one 0.
TEST(GspoPolicyLoss, SequenceRatiosValuesAndGradientsByHand) {
  PolicyLossConfig config;
  config.clip_ratio_low = 0.2;
  config.clip_ratio_high = 0.28;
  torch::manual_seed(3);
  const torch::Tensor old = torch::randn({3, 4}, kF64) * 0.3;
  torch::Tensor lp0 = old + torch::randn({3, 4}, kF64) * 0.1;
  lp0[2] = old[2] + 0.5;  // the last row's ratio e^0.5 lies above 1.28: its A > 0 tokens clip
  torch::Tensor lp = lp0.clone().requires_grad_(true);
  const torch::Tensor adv = torch::tensor({{0.5, -1.0, 2.0, 7.0}, {-0.3, 1.5, 9.0, 9.0}, {1.0, -1.0, 0.5, -2.0}}, kF64);
  const torch::Tensor mask = torch::tensor({{1.0, 1.0, 1.0, 0.0}, {1.0, 1.0, 0.0, 0.0}, {1.0, 1.0, 1.0, 1.0}}, kF64);
  auto out = (*get_policy_loss_fn("gspo"))(old, lp, adv, mask, "token-mean", config);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  out->pg_loss.backward();
  double loss = 0, clipped = 0, tokens = 0, kl = 0;
  for (int64_t i = 0; i < 3; ++i) {
    double log_s = 0, n = 0;
    for (int64_t t = 0; t < 4; ++t) {
      if (mask[i][t].item<double>() == 0) continue;
      log_s += (lp0[i][t] - old[i][t]).item<double>();
      n += 1;
    }
    const double s = std::exp(log_s / n), c = std::min(std::max(s, 0.8), 1.28);
    double row = 0;
    for (int64_t t = 0; t < 4; ++t) {
      const double g = lp.grad()[i][t].item<double>();
      if (mask[i][t].item<double>() == 0) {
        EXPECT_EQ(g, 0.0);
        continue;
      }
      const double a = adv[i][t].item<double>();
      const bool clip = -a * c > -a * s;
      row += std::max(-a * s, -a * c);
      clipped += clip ? 1 : 0;
      tokens += 1;
      kl += (old[i][t] - lp0[i][t]).item<double>();
      EXPECT_NEAR(g, clip ? 0.0 : -a * s / (3 * n), 1e-12) << i << "," << t;
    }
    loss += row / n / 3;
  }
  EXPECT_NEAR(out->pg_loss.item<double>(), loss, 1e-12);
  EXPECT_EQ(clipped, 2.0);  // the last row's two positive advantages
  EXPECT_NEAR(out->pg_clipfrac.item<double>(), clipped / (tokens + 1e-8), 1e-12);  // verl's masked_mean
  EXPECT_NEAR(out->ppo_kl.item<double>(), kl / (tokens + 1e-8), 1e-12);
  EXPECT_EQ(out->pg_clipfrac_lower.item<double>(), 0.0);
  // On-policy (old = log_prob): every ratio is 1, the loss minus the mean of the rows' mean advantages.
  auto same = (*get_policy_loss_fn("gspo"))(lp0, lp0, adv, mask, "token-mean", config);
  ASSERT_TRUE(same.ok());
  const double want = -((adv * mask).sum(-1) / mask.sum(-1)).mean().item<double>();
  EXPECT_NEAR(same->pg_loss.item<double>(), want, 1e-12);
  EXPECT_EQ(same->pg_clipfrac.item<double>(), 0.0);
}

TEST(VanillaPolicyLoss, OnPolicyIsMinusMeanAdvantage) {
  torch::Tensor lp = torch::full({2, 3}, -1.0, kF64);
  torch::Tensor adv = torch::tensor({{1.0, -2.0, 3.0}, {0.5, 0.5, 9.0}}, kF64);
  auto out = compute_policy_loss_vanilla(lp, lp, adv, loss_mask(), "token-mean", PolicyLossConfig{});
  ASSERT_TRUE(out.ok());
  EXPECT_NEAR(out->pg_loss.item<double>(), -(1.0 - 2.0 + 0.5) / 3.0, 1e-7);
  EXPECT_EQ(out->pg_clipfrac.item<double>(), 0.0);
  EXPECT_EQ(out->ppo_kl.item<double>(), 0.0);
  EXPECT_EQ(out->pg_clipfrac_lower.item<double>(), 0.0);
}

TEST(VanillaPolicyLoss, ClipHigherAndDualClip) {
  PolicyLossConfig config;
  config.clip_ratio_low = 0.2;
  config.clip_ratio_high = 0.28;
  config.clip_ratio_c = 3.0;
  torch::Tensor old = torch::zeros({1, 3}, kF64);
  // ratios e^1, e^1, e^-1 ; advantages +1, -1, +1.
  torch::Tensor lp = torch::tensor({{1.0, 1.0, -1.0}}, kF64);
  torch::Tensor adv = torch::tensor({{1.0, -1.0, 1.0}}, kF64);
  auto out = compute_policy_loss_vanilla(old, lp, adv, torch::ones({1, 3}, kF64), "seq-mean-token-sum", config);
  ASSERT_TRUE(out.ok());
  // token 0: max(-e, -1.28) = -1.28 (clipped); token 1: max(e, 1.2) = e, dual-clipped to 3? e < 3 so e;
  // token 2: max(-1/e, -0.8) = -1/e (not clipped).
  EXPECT_NEAR(out->pg_loss.item<double>(), -1.28 + std::exp(1.0) - std::exp(-1.0), 1e-12);
  EXPECT_NEAR(out->pg_clipfrac.item<double>(), 1.0 / 3, 1e-7);
  EXPECT_EQ(out->pg_clipfrac_lower.item<double>(), 0.0);
  // A < 0 with a huge ratio: the loss is capped at -A*c.
  auto dual = compute_policy_loss_vanilla(torch::zeros({1, 1}, kF64), torch::full({1, 1}, 5.0, kF64),
                                          torch::full({1, 1}, -2.0, kF64), torch::ones({1, 1}, kF64), "token-mean",
                                          config);
  ASSERT_TRUE(dual.ok());
  EXPECT_NEAR(dual->pg_loss.item<double>(), 6.0, 1e-7);
  EXPECT_NEAR(dual->pg_clipfrac_lower.item<double>(), 1.0, 1e-7);
}

TEST(VanillaPolicyLoss, ErrorPaths) {
  torch::Tensor x = torch::zeros({2, 3}, kF64);
  PolicyLossConfig bad_c;
  bad_c.clip_ratio_c = 1.0;
  auto c = compute_policy_loss_vanilla(x, x, x, loss_mask(), "token-mean", bad_c);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("clip_ratio_c"), std::string::npos);
  EXPECT_FALSE(compute_policy_loss_vanilla(x, x, torch::zeros({2, 2}, kF64), loss_mask(), "token-mean", {}).ok());
  EXPECT_FALSE(compute_policy_loss_vanilla(x, x, x, loss_mask(), "nope", {}).ok());
  EXPECT_FALSE(compute_policy_loss(x, x, x, loss_mask()).ok());  // no cliprange at all
  EXPECT_TRUE(compute_policy_loss(x, x, x, loss_mask(), 0.2).ok());
}

TEST(GpgPolicyLoss, IsMinusLogProbTimesAdvantage) {
  torch::Tensor lp = torch::tensor({{-1.0, -2.0, -3.0}, {-0.5, -0.5, -0.5}}, kF64).requires_grad_(true);
  torch::Tensor adv = torch::tensor({{1.0, 2.0, 3.0}, {4.0, 5.0, 6.0}}, kF64);
  auto out = (*get_policy_loss_fn("gpg"))(lp.detach(), lp, adv, loss_mask(), "token-mean", PolicyLossConfig{});
  ASSERT_TRUE(out.ok());
  EXPECT_NEAR(out->pg_loss.item<double>(), (1.0 + 4.0 + 2.0) / 3.0, 1e-7);
  out->pg_loss.backward();
  EXPECT_NEAR(lp.grad()[0][1].item<double>(), -2.0 / 3.0, 1e-7);
  EXPECT_EQ(lp.grad()[0][2].item<double>(), 0.0);
}

TEST(KlCovPolicyLoss, FullRatioAddsTheKlTermEverywhere) {
  torch::manual_seed(5);
  torch::Tensor old = torch::randn({3, 4}, kF64), lp = torch::randn({3, 4}, kF64), adv = torch::randn({3, 4}, kF64);
  torch::Tensor mask = torch::ones({3, 4}, kF64);
  PolicyLossConfig config;
  config.kl_cov_ratio = 1.0;
  config.ppo_kl_coef = 0.7;
  auto out = compute_policy_loss_kl_cov(old, lp, adv, mask, "token-mean", config);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const torch::Tensor d = lp - old;
  const double expected = (-adv * torch::exp(d) + 0.7 * d.abs()).sum().item<double>() / (12 + 1e-8);
  EXPECT_NEAR(out->pg_loss.item<double>(), expected, 1e-12);
  EXPECT_NEAR(out->ppo_kl.item<double>(), d.abs().sum().item<double>() / (12 + 1e-8), 1e-12);
  config.kl_cov_ratio = 0.0;
  EXPECT_FALSE(compute_policy_loss_kl_cov(old, lp, adv, mask, "token-mean", config).ok());
}

TEST(ClipCovPolicyLoss, EmptyWindowIsPlainClippedPpo) {
  torch::manual_seed(6);
  torch::Tensor old = torch::randn({3, 4}, kF64), lp = old + 0.3 * torch::randn({3, 4}, kF64);
  torch::Tensor adv = torch::randn({3, 4}, kF64), mask = torch::ones({3, 4}, kF64);
  PolicyLossConfig config;
  config.clip_cov_lb = 1e9;  // no covariance lies in (1e9, 1e9+...) so nothing is detached
  config.clip_cov_ub = 2e9;
  auto out = compute_policy_loss_clip_cov(old, lp, adv, mask, "token-mean", config);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const torch::Tensor ratio = torch::exp(lp - old);
  const torch::Tensor l = torch::maximum(-adv * ratio, -adv * torch::clamp(ratio, 0.8, 1.2));
  EXPECT_NEAR(out->pg_loss.item<double>(), l.sum().item<double>() / (12 + 1e-8), 1e-12);
  EXPECT_EQ(out->pg_clipfrac.item<double>(), 0.0);
}

TEST(MaskedOps, MeanVarWhiten) {
  torch::Tensor v = torch::tensor({1.0, 2.0, 3.0, std::nan("")}, kF64);
  torch::Tensor m = torch::tensor({1.0, 1.0, 1.0, 0.0}, kF64);
  EXPECT_NEAR(scalar(masked_sum(v, m)), 6.0, 1e-12);  // the NaN is masked out
  EXPECT_NEAR(scalar(masked_mean(v, m)), 6.0 / (3 + 1e-8), 1e-12);
  EXPECT_NEAR(scalar(masked_var(v, m)), 1.0, 1e-7);  // unbiased var of {1,2,3}
  EXPECT_NEAR(scalar(masked_var(v, m, /*unbiased=*/false)), 2.0 / 3, 1e-7);
  auto w = masked_whiten(v, m);
  ASSERT_TRUE(w.ok());
  EXPECT_NEAR((*w)[0].item<double>(), -1.0 / std::sqrt(1.0 + 1e-8), 1e-7);
  EXPECT_EQ(scalar(masked_mean(v, torch::zeros({4}, kF64))), 0.0);
  EXPECT_FALSE(masked_var(v, torch::zeros({4}, kF64)).ok());
  EXPECT_FALSE(masked_var(v, torch::tensor({0.0, 1.0, 0.0, 0.0}, kF64)).ok());
  EXPECT_FALSE(masked_mean(v, torch::ones({3}, kF64)).ok());
  EXPECT_EQ(masked_mean(v, m, 5).status().code(), ErrorCode::out_of_range);
  auto rows = masked_mean(torch::tensor({{1.0, 3.0}, {2.0, 4.0}}, kF64), torch::tensor({{1.0, 0.0}, {1.0, 1.0}}, kF64), 1);
  ASSERT_TRUE(rows.ok());
  EXPECT_NEAR((*rows)[1].item<double>(), 3.0, 1e-7);
}

TEST(Logits, EntropyAndLogProbsMatchDirectSums) {
  torch::manual_seed(7);
  torch::Tensor logits = torch::randn({2, 3, 5}, kF64);
  torch::Tensor labels = torch::randint(0, 5, {2, 3}, torch::kLong);
  auto ent = entropy_from_logits(logits);
  auto lp = logprobs_from_logits(logits, labels);
  ASSERT_TRUE(ent.ok() && lp.ok());
  auto acc = logits.accessor<double, 3>();
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t t = 0; t < 3; ++t) {
      double z = 0.0;
      for (int64_t v = 0; v < 5; ++v) z += std::exp(acc[b][t][v]);
      double h = 0.0;
      for (int64_t v = 0; v < 5; ++v) h -= std::exp(acc[b][t][v]) / z * (acc[b][t][v] - std::log(z));
      EXPECT_NEAR((*ent)[b][t].item<double>(), h, 1e-12);
      EXPECT_NEAR((*lp)[b][t].item<double>(), acc[b][t][labels[b][t].item<int64_t>()] - std::log(z), 1e-12);
    }
  }
  auto bf16 = logprobs_from_logits(logits.to(torch::kBFloat16), labels);
  ASSERT_TRUE(bf16.ok());
  EXPECT_TRUE(torch::allclose(bf16->to(torch::kFloat64), *lp, 0.05, 0.05));
  auto ent_loss = compute_entropy_loss(logits, torch::ones({2, 3}, kF64));
  ASSERT_TRUE(ent_loss.ok());
  EXPECT_NEAR(ent_loss->item<double>(), ent->mean().item<double>(), 1e-7);
}

TEST(Logits, BadLabelsAreErrors) {
  torch::Tensor logits = torch::randn({2, 4});
  EXPECT_EQ(logprobs_from_logits(logits, torch::tensor({0, 4})).status().code(), ErrorCode::out_of_range);
  EXPECT_EQ(logprobs_from_logits(logits, torch::tensor({-1, 0})).status().code(), ErrorCode::out_of_range);
  EXPECT_FALSE(logprobs_from_logits(logits, torch::tensor({0, 1, 2})).ok());
  EXPECT_FALSE(logprobs_from_logits(logits, torch::tensor({0.0, 1.0})).ok());
  EXPECT_FALSE(entropy_from_logits(torch::tensor({1, 2})).ok());
}

}  // namespace
}  // namespace tessera::algos
