// dp_critic_test.cpp: DataParallelPPOCritic on a tiny random Qwen2 value model: values against an
// independent full-batch forward, batching invariance, the value loss by hand, and training.
#include <cmath>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/workers/ppo/ppo_test_util.hpp"
#include "workers/ppo/dp_critic.hpp"

namespace tessera::ppo {
namespace {

using namespace testing;  // NOLINT: the PPO test helpers and the standard batch (ppo_test_util.hpp)

CriticConfig fixed_config(int64_t mini, int64_t micro) {
  CriticConfig c;
  c.ppo_mini_batch_size = mini;
  c.ppo_micro_batch_size_per_gpu = micro;
  c.forward_micro_batch_size_per_gpu = micro;
  return c;
}

std::shared_ptr<LocalTrainableModule> local(std::shared_ptr<models::ValueModel> model, double lr = 1e-5) {
  LocalOptimizerOptions o;
  o.lr = lr;
  return unwrap(LocalTrainableModule::create(std::move(model), o));
}

at::Tensor values_of(DataParallelPPOCritic& critic, proto::DataProto d, const nlohmann::json& meta) {
  d.meta_info() = meta;
  return unwrap(critic.compute_values(d));
}

// Independent: one full forward of the value model, response slice [T-R-1, T-1), times the mask.
at::Tensor reference_values(models::ValueModel& model, const proto::DataProto& d) {
  torch::NoGradGuard g;
  at::Tensor ids = *d.tensor("input_ids");
  at::Tensor v = model.forward(ids, *d.tensor("attention_mask"), *d.tensor("position_ids"));
  const int64_t T = ids.size(1);
  return v.slice(1, T - kR - 1, T - 1) * d.tensor("response_mask")->to(at::kFloat);
}

TEST(DpCriticValues, EqualIndependentForwardAndInvariantToBatching) {
  auto model = testing::tiny_critic(21);
  auto critic = unwrap(DataParallelPPOCritic::create(fixed_config(8, 8), local(model)));
  auto data = make_batch(kPromptLens, kResponseLens, kP, kR, 22);
  at::Tensor ref = reference_values(*model, data);
  at::Tensor base = values_of(*critic, data, forward_meta(1.0, 8, false));
  EXPECT_LT(max_diff(base, ref), 1e-5);
  EXPECT_GT(ref.abs().max().item<double>(), 1e-2);
  // Masked-out response positions are exactly zero.
  EXPECT_EQ(base.masked_select(data.tensor("response_mask")->eq(0)).abs().sum().item<double>(), 0.0);
  EXPECT_LT(testing::max_rel_diff(values_of(*critic, data, forward_meta(1.0, 3, false)), base), kBatchingTolerance);
  for (int64_t budget : {11, 25}) {
    EXPECT_LT(testing::max_rel_diff(values_of(*critic, data, forward_meta(1.0, 0, true, budget)), base), kBatchingTolerance) << budget;
  }
  // Without meta_info the config's forward_* values are used.
  EXPECT_LT(testing::max_rel_diff(values_of(*critic, data, nlohmann::json::object()), base), kBatchingTolerance);
}

// use_remove_padding: the same values (masked positions 0 either way), and the same update.
TEST(DpCriticValues, PaddingFreeEqualsPadded) {
  CriticConfig packed_config = fixed_config(8, 4);
  packed_config.use_remove_padding = true;
  auto padded_model = testing::tiny_critic(23), packed_model = testing::tiny_critic(23);
  auto padded = unwrap(DataParallelPPOCritic::create(fixed_config(8, 4), local(padded_model, 1e-2)));
  auto packed = unwrap(DataParallelPPOCritic::create(packed_config, local(packed_model, 1e-2)));
  auto data = make_batch(kPromptLens, kResponseLens, kP, kR, 24);
  at::Tensor want = values_of(*padded, data, forward_meta(1.0, 3, false));
  EXPECT_LT(testing::max_rel_diff(values_of(*packed, data, forward_meta(1.0, 3, false)), want), kBatchingTolerance);
  at::Generator gen = at::detail::createCPUGenerator(25);
  ASSERT_TRUE(data.set_tensor("values", want).ok());
  ASSERT_TRUE(data.set_tensor("returns", want + at::randn(want.sizes(), gen)).ok());
  data.meta_info() = nlohmann::json::object();
  auto before = testing::snapshot(*padded_model);
  unwrap(padded->update_critic(data));
  unwrap(packed->update_critic(data));
  EXPECT_GT(testing::max_param_diff(testing::snapshot(*padded_model), before), 1e-4);
  EXPECT_LT(testing::max_param_diff(testing::snapshot(*padded_model), testing::snapshot(*packed_model)), 1e-5);
}

// A critic batch: values = the critic's current predictions, returns = values + noise.
proto::DataProto critic_batch(DataParallelPPOCritic& critic, uint64_t seed, double noise) {
  auto data = make_batch(kPromptLens, kResponseLens, kP, kR, seed);
  at::Tensor values = values_of(critic, data, forward_meta(1.0, 8, false));
  at::Generator gen = at::detail::createCPUGenerator(seed + 1);
  EXPECT_TRUE(data.set_tensor("values", values).ok());
  EXPECT_TRUE(data.set_tensor("returns", values + noise * at::randn(values.sizes(), gen)).ok());
  return data;
}

TEST(DpCriticUpdate, FirstLossByHandAndMetricNames) {
  auto critic = unwrap(DataParallelPPOCritic::create(fixed_config(8, 8), local(testing::tiny_critic(23), 1e-3)));
  auto data = critic_batch(*critic, 24, 0.3);
  Metrics m = unwrap(critic->update_critic(data));
  for (const char* name : {"critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm", "critic/lr"}) {
    ASSERT_EQ(m.count(name), 1u) << name;
    ASSERT_EQ(m[name].size(), 1u) << name;
  }
  // vpreds == values at the first step, so clipping is inactive: 0.5 * token-mean((v - R)^2).
  at::Tensor mask = data.tensor("response_mask")->to(at::kDouble);
  at::Tensor err = (*data.tensor("values") - *data.tensor("returns")).to(at::kDouble);
  const double expected = 0.5 * ((err * err * mask).sum() / mask.sum()).item<double>();
  EXPECT_NEAR(m["critic/vf_loss"][0], expected, 1e-5);
  EXPECT_EQ(m["critic/vf_clipfrac"][0], 0.0);
  const double vmean = ((data.tensor("values")->to(at::kDouble) * mask).sum() / mask.sum()).item<double>();
  EXPECT_NEAR(m["critic/vpred_mean"][0], vmean, 1e-5);
  EXPECT_DOUBLE_EQ(m["critic/lr"][0], 1e-3);
}

TEST(DpCriticUpdate, RepeatedUpdatesLowerTheValueLoss) {
  CriticConfig c = fixed_config(4, 2);
  auto critic = unwrap(DataParallelPPOCritic::create(c, local(testing::tiny_critic(25), 3e-3)));
  auto data = critic_batch(*critic, 26, 0.3);  // targets within cliprange_value 0.5 of the old values
  auto mean = [](const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return s / static_cast<double>(v.size());
  };
  double first = 0, last = 0;
  for (int step = 0; step < 8; ++step) {
    Metrics m = unwrap(critic->update_critic(data));
    ASSERT_EQ(m["critic/grad_norm"].size(), 2u);
    ASSERT_EQ(m["critic/vf_loss"].size(), 4u);
    if (step == 0) first = mean(m["critic/vf_loss"]);
    last = mean(m["critic/vf_loss"]);
  }
  EXPECT_LT(last, 0.5 * first) << "first " << first << " last " << last;
}

TEST(DpCriticUpdate, ErrorsNameTheKey) {
  auto critic = unwrap(DataParallelPPOCritic::create(fixed_config(8, 4), local(testing::tiny_critic(27))));
  auto data = make_batch(kPromptLens, kResponseLens, kP, kR, 28);
  ASSERT_TRUE(data.set_tensor("values", at::zeros({8, kR})).ok());
  auto r = critic->update_critic(data);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("returns"), std::string::npos) << r.status().message();
  CriticConfig none = fixed_config(8, 4);
  none.forward_micro_batch_size_per_gpu.reset();
  auto c2 = unwrap(DataParallelPPOCritic::create(none, local(testing::tiny_critic(27))));
  auto v = c2->compute_values(data);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("forward_micro_batch_size_per_gpu"), std::string::npos);
}

}  // namespace
}  // namespace tessera::ppo
