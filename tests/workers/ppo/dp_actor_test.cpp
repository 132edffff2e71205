// dp_actor_test.cpp: DataParallelPPOActor on a tiny random Qwen2 model, checked against an
// independent full-batch forward and against verl's loss maths worked out by hand.
#include <cmath>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/workers/ppo/ppo_test_util.hpp"
#include "workers/ppo/dp_actor.hpp"

namespace tessera::ppo {
namespace {

using namespace testing;  // NOLINT: the PPO test helpers and the standard batch (ppo_test_util.hpp)

std::shared_ptr<LocalTrainableModule> local(std::shared_ptr<models::CausalLM> model, LocalOptimizerOptions o = {}) {
  return unwrap(LocalTrainableModule::create(std::move(model), o));
}

ActorConfig fixed_config(int64_t mini, int64_t micro) {
  ActorConfig c;
  c.ppo_mini_batch_size = mini;
  c.ppo_micro_batch_size_per_gpu = micro;
  return c;
}

LogProbOutput log_probs(DataParallelPPOActor& actor, proto::DataProto d, const nlohmann::json& meta, bool entropy) {
  d.meta_info() = meta;
  return unwrap(actor.compute_log_prob(d, entropy));
}

TEST(DpActorLogProb, EqualsIndependentFullForward) {
  auto model = testing::tiny_policy(1);
  auto actor = unwrap(DataParallelPPOActor::create(fixed_config(8, 8), local(model)));
  auto data = make_batch(kPromptLens, kResponseLens, kP, kR, 5);
  auto out = log_probs(*actor, data, forward_meta(0.7, 3, false), /*entropy=*/true);
  auto [ref_lp, ref_ent] = testing::reference_log_probs(*model, data, 0.7);
  ASSERT_EQ(out.log_probs.sizes(), ref_lp.sizes());
  EXPECT_LT(max_diff(out.log_probs, ref_lp), 1e-5);
  EXPECT_LT(max_diff(out.entropys, ref_ent), 1e-5);
  // Not uniform: the check above would be weak if every log-prob were -log(V).
  EXPECT_GT((out.log_probs + std::log(static_cast<double>(testing::kVocab))).abs().max().item<double>(), 0.5);
  EXPECT_FALSE(out.log_probs.requires_grad());
}

TEST(DpActorLogProb, InvariantToMicroBatchSizeAndDynamicBatching) {
  auto actor = unwrap(DataParallelPPOActor::create(fixed_config(8, 8), local(testing::tiny_policy(2))));
  auto data = make_batch(kPromptLens, kResponseLens, kP, kR, 6);
  auto base = log_probs(*actor, data, forward_meta(1.0, 8, false), true);
  // Log-probs reach about -20 here, where one fp32 ulp is 1.9e-6: compare relative to |x| > 1.
  EXPECT_GT(base.log_probs.abs().max().item<double>(), 4.0);
  for (int64_t mbs : {1, 3}) {
    auto o = log_probs(*actor, data, forward_meta(1.0, mbs, false), true);
    EXPECT_LT(testing::max_rel_diff(o.log_probs, base.log_probs), kBatchingTolerance) << "micro_batch_size " << mbs;
    EXPECT_LT(testing::max_rel_diff(o.entropys, base.entropys), kBatchingTolerance) << "micro_batch_size " << mbs;
  }
  for (int64_t budget : {11, 20, 40}) {  // width 11: from one row per micro-batch to several
    auto o = log_probs(*actor, data, forward_meta(1.0, 0, true, budget), true);
    EXPECT_LT(testing::max_rel_diff(o.log_probs, base.log_probs), kBatchingTolerance) << "max_token_len " << budget;
    EXPECT_LT(testing::max_rel_diff(o.entropys, base.entropys), kBatchingTolerance) << "max_token_len " << budget;
  }
}

// use_remove_padding (packing.hpp): the same log-probs and entropies on every response token
// (what lies past a response's end differs and is masked out by every consumer).
TEST(DpActorLogProb, PaddingFreeEqualsPadded) {
  auto model = testing::tiny_policy(3);
  ActorConfig packed_config = fixed_config(8, 8);
  packed_config.use_remove_padding = true;
  auto padded = unwrap(DataParallelPPOActor::create(fixed_config(8, 8), local(model)));
  auto packed = unwrap(DataParallelPPOActor::create(packed_config, local(model)));
  auto data = make_batch(kPromptLens, kResponseLens, kP, kR, 7);
  at::Tensor mask = data.tensor("response_mask")->to(at::kBool);
  for (bool dynamic : {false, true}) {
    auto want = log_probs(*padded, data, forward_meta(0.8, 3, dynamic, 20), true);
    auto got = log_probs(*packed, data, forward_meta(0.8, 3, dynamic, 20), true);
    EXPECT_LT(testing::max_rel_diff(got.log_probs.masked_select(mask), want.log_probs.masked_select(mask)),
              kBatchingTolerance);
    EXPECT_LT(testing::max_rel_diff(got.entropys.masked_select(mask), want.entropys.masked_select(mask)),
              kBatchingTolerance);
  }
}

TEST(DpActorLogProb, MetaInfoErrorsNameTheKey) {
  auto actor = unwrap(DataParallelPPOActor::create(fixed_config(8, 8), local(testing::tiny_policy(3))));
  auto data = make_batch(kPromptLens, kResponseLens, kP, kR, 7);
  data.meta_info() = {{"use_dynamic_bsz", false}, {"micro_batch_size", 2}};
  auto r = actor->compute_log_prob(data, false);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("meta_info.temperature"), std::string::npos);
  data.meta_info() = {{"temperature", 1.0}, {"use_dynamic_bsz", true}};
  r = actor->compute_log_prob(data, false);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("meta_info.max_token_len"), std::string::npos);
  data.meta_info() = {{"temperature", 1.0}, {"use_dynamic_bsz", true}, {"max_token_len", 5}};
  r = actor->compute_log_prob(data, false);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("max_token_len = 5"), std::string::npos) << r.status().message();
}

// A batch ready for update_policy: old_log_probs from the current policy (ratio = 1 at the first
// micro-batch), advantages drawn per token.
proto::DataProto update_batch(DataParallelPPOActor& actor, const std::vector<int64_t>& prompt_lens,
                              const std::vector<int64_t>& response_lens, uint64_t seed, double temperature = 1.0) {
  auto data = make_batch(prompt_lens, response_lens, kP, kR, seed);
  auto old = log_probs(actor, data, forward_meta(temperature, 4, false), false);
  at::Generator gen = at::detail::createCPUGenerator(seed + 100);
  EXPECT_TRUE(data.set_tensor("old_log_probs", old.log_probs).ok());
  EXPECT_TRUE(data.set_tensor("advantages", at::randn({data.size(), kR}, gen)).ok());
  data.meta_info() = {{"temperature", temperature}};
  return data;
}

TEST(DpActorUpdate, FirstStepLossesMatchHandMaths) {
  ActorConfig c = fixed_config(8, 8);
  c.entropy_coeff = 0.01;
  c.use_kl_loss = true;  // low_var_kl with ref = old + 0.1: kl = exp(0.1) - 0.1 - 1 per token
  LocalOptimizerOptions o;
  o.lr = 1e-3;
  auto actor = unwrap(DataParallelPPOActor::create(c, local(testing::tiny_policy(4), o)));
  auto data = update_batch(*actor, kPromptLens, kResponseLens, 8, /*temperature=*/0.9);
  ASSERT_TRUE(data.set_tensor("ref_log_prob", *data.tensor("old_log_probs") + 0.1).ok());
  data.meta_info()["use_dynamic_bsz"] = false;
  data.meta_info()["micro_batch_size"] = 8;
  auto entropys = unwrap(actor->compute_log_prob(data, true)).entropys;
  data.meta_info() = {{"temperature", 0.9}};

  Metrics m = unwrap(actor->update_policy(data));
  for (const char* name : {"actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower",
                           "actor/grad_norm", "actor/kl_loss", "actor/kl_coef", "actor/entropy", "actor/lr"}) {
    ASSERT_EQ(m.count(name), 1u) << name;
    ASSERT_EQ(m[name].size(), 1u) << name;  // one micro-batch, one mini-batch
  }
  at::Tensor mask = data.tensor("response_mask")->to(at::kDouble);
  at::Tensor adv = data.tensor("advantages")->to(at::kDouble);
  const double token_mean_adv = ((adv * mask).sum() / mask.sum()).item<double>();
  // ratio == 1: L = max(-A, -A*clip(1)) = -A, dual clip min(-A, -3A) = -A for A < 0.
  EXPECT_NEAR(m["actor/pg_loss"][0], -token_mean_adv, 1e-5);
  EXPECT_NEAR(m["actor/ppo_kl"][0], 0.0, 1e-5);
  EXPECT_EQ(m["actor/pg_clipfrac"][0], 0.0);
  EXPECT_EQ(m["actor/pg_clipfrac_lower"][0], 0.0);
  EXPECT_NEAR(m["actor/kl_loss"][0], std::exp(0.1) - 1.1, 1e-5);
  EXPECT_DOUBLE_EQ(m["actor/kl_coef"][0], 0.001);
  const double token_mean_entropy = ((entropys.to(at::kDouble) * mask).sum() / mask.sum()).item<double>();
  EXPECT_NEAR(m["actor/entropy"][0], token_mean_entropy, 1e-5);
  EXPECT_TRUE(std::isfinite(m["actor/grad_norm"][0]));
  EXPECT_GT(m["actor/grad_norm"][0], 0.0);
  EXPECT_DOUBLE_EQ(m["actor/lr"][0], 1e-3);
}

TEST(DpActorUpdate, MetricCountsFollowEpochsAndBatches) {
  ActorConfig c = fixed_config(4, 2);
  c.ppo_epochs = 2;
  LocalOptimizerOptions o;
  o.lr = 1e-2;
  auto actor = unwrap(DataParallelPPOActor::create(c, local(testing::tiny_policy(5), o)));
  auto data = update_batch(*actor, kPromptLens, kResponseLens, 9);
  Metrics m = unwrap(actor->update_policy(data));
  EXPECT_EQ(m["actor/grad_norm"].size(), 4u);  // 2 epochs x 2 mini-batches
  EXPECT_EQ(m["actor/pg_loss"].size(), 8u);    // x 2 micro-batches
  EXPECT_EQ(m["actor/lr"].size(), 1u);
  EXPECT_EQ(m.count("actor/kl_loss"), 0u);
  EXPECT_EQ(m.count("actor/entropy"), 0u);
  // The second epoch sees a moved policy: ratio != 1, so ppo_kl is no longer ~0 everywhere.
  double late_kl = 0;
  for (size_t i = 4; i < 8; ++i) late_kl += std::abs(m["actor/ppo_kl"][i]);
  EXPECT_GT(late_kl, 1e-4);
  EXPECT_LT(std::abs(m["actor/ppo_kl"][0]), 1e-5);  // the very first micro-batch: ratio == 1
}

// Two identical policies trained on the same mini-batch, split into 1 vs 4 micro-batches (or fixed
// vs dynamic): verl's loss scaling makes the gradients, hence SGD's parameters, the same. SGD
// (lr 1) keeps the gradient's scale visible in the parameters, which Adam's first step would hide.
struct TwinResult {
  double param_diff;
  double moved;
};

TwinResult train_twins(ActorConfig a, ActorConfig b, const std::string& agg_mode,
                       const std::vector<int64_t>& response_lens) {
  LocalOptimizerOptions sgd;
  sgd.optimizer = "sgd";
  sgd.lr = 1.0;
  sgd.weight_decay = 0.0;
  a.loss_agg_mode = b.loss_agg_mode = agg_mode;
  a.grad_clip = b.grad_clip = 1e9;
  auto ma = testing::tiny_policy(6), mb = testing::tiny_policy(6);
  auto before = testing::snapshot(*ma);
  auto actor_a = unwrap(DataParallelPPOActor::create(a, local(ma, sgd)));
  auto actor_b = unwrap(DataParallelPPOActor::create(b, local(mb, sgd)));
  auto data = update_batch(*actor_a, kPromptLens, response_lens, 10);
  unwrap(actor_a->update_policy(data));
  unwrap(actor_b->update_policy(data));
  auto pa = testing::snapshot(*ma), pb = testing::snapshot(*mb);
  return {testing::max_param_diff(pa, pb), testing::max_param_diff(pa, before)};
}

TEST(DpActorUpdate, GradientAccumulationOneVsFourMicroBatches) {
  // token-mean: equal token counts per micro-batch make verl's 1/grad_accum scaling exact.
  auto r = train_twins(fixed_config(8, 8), fixed_config(8, 2), "token-mean", {3, 3, 3, 3, 3, 3, 3, 3});
  EXPECT_GT(r.moved, 1e-3);
  EXPECT_LT(r.param_diff, 1e-5);
  // seq-mean-token-mean is exact for any lengths.
  r = train_twins(fixed_config(8, 8), fixed_config(8, 2), "seq-mean-token-mean", kResponseLens);
  EXPECT_GT(r.moved, 1e-3);
  EXPECT_LT(r.param_diff, 1e-5);
}

TEST(DpActorUpdate, DynamicBatchingMatchesFixed) {
  ActorConfig dyn = fixed_config(8, 8);
  dyn.use_dynamic_bsz = true;
  dyn.ppo_micro_batch_size_per_gpu.reset();
  dyn.ppo_max_token_len_per_gpu = 20;  // several micro-batches of unequal row counts
  auto r = train_twins(fixed_config(8, 8), dyn, "seq-mean-token-mean", kResponseLens);
  EXPECT_GT(r.moved, 1e-3);
  EXPECT_LT(r.param_diff, 1e-5);
}

// use_remove_padding trains the same policy: packed and padded twins take the same SGD step
// (with the KL and entropy terms on, so every output of the chunked log-softmax carries gradient).
TEST(DpActorUpdate, PaddingFreeMatchesPadded) {
  ActorConfig a = fixed_config(8, 4), b = fixed_config(8, 4);
  a.entropy_coeff = b.entropy_coeff = 0.01;
  b.use_remove_padding = true;
  auto r = train_twins(a, b, "token-mean", kResponseLens);
  EXPECT_GT(r.moved, 1e-3);
  EXPECT_LT(r.param_diff, 1e-5);
}

TEST(DpActorUpdate, NonFiniteGradNormSkipsTheStep) {
  auto model = testing::tiny_policy(7);
  LocalOptimizerOptions o;
  o.lr = 1e-2;
  auto actor = unwrap(DataParallelPPOActor::create(fixed_config(8, 4), local(model, o)));
  auto data = update_batch(*actor, kPromptLens, kResponseLens, 11);
  at::Tensor adv = data.tensor("advantages")->clone();
  adv[2][0] = NAN;  // row 2 has one response token; its loss (and the gradient) becomes NaN
  ASSERT_TRUE(data.set_tensor("advantages", adv).ok());
  auto before = testing::snapshot(*model);
  Metrics m = unwrap(actor->update_policy(data));
  ASSERT_EQ(m["actor/grad_norm"].size(), 1u);
  EXPECT_FALSE(std::isfinite(m["actor/grad_norm"][0]));
  EXPECT_EQ(testing::max_param_diff(before, testing::snapshot(*model)), 0.0);
  for (const auto& p : model->parameters()) EXPECT_FALSE(p.grad().defined());
  // A clean batch afterwards trains normally.
  ASSERT_TRUE(data.set_tensor("advantages", at::nan_to_num(adv, 0.0)).ok());
  m = unwrap(actor->update_policy(data));
  EXPECT_TRUE(std::isfinite(m["actor/grad_norm"][0]));
  EXPECT_GT(testing::max_param_diff(before, testing::snapshot(*model)), 0.0);
}

TEST(DpActorUpdate, InputErrorsNameTheKey) {
  ActorConfig c = fixed_config(8, 4);
  c.use_kl_loss = true;
  auto actor = unwrap(DataParallelPPOActor::create(c, local(testing::tiny_policy(8))));
  auto data = update_batch(*actor, kPromptLens, kResponseLens, 12);
  auto r = actor->update_policy(data);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("ref_log_prob"), std::string::npos) << r.status().message();
  auto no_adv = data.select(std::vector<std::string>{"input_ids", "attention_mask", "position_ids", "responses",
                                                     "old_log_probs"});
  ASSERT_TRUE(no_adv.ok());
  r = actor->update_policy(*no_adv);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("advantages"), std::string::npos) << r.status().message();
}

TEST(DpActorUpdate, FrozenModuleAndBadConfigAreErrors) {
  auto frozen = unwrap(LocalTrainableModule::create(testing::tiny_policy(9), std::nullopt));
  auto actor = unwrap(DataParallelPPOActor::create(fixed_config(8, 4), frozen));
  auto data = update_batch(*actor, kPromptLens, kResponseLens, 13);
  auto r = actor->update_policy(data);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no optimizer"), std::string::npos);
  EXPECT_FALSE(DataParallelPPOActor::create(fixed_config(8, 3), frozen).ok());
  ActorConfig none = fixed_config(8, 4);
  none.ppo_micro_batch_size_per_gpu.reset();
  EXPECT_FALSE(DataParallelPPOActor::create(none, frozen).ok());
  EXPECT_FALSE(DataParallelPPOActor::create(fixed_config(8, 4), nullptr).ok());
}

// Note [On-policy old log-probs]: an on-policy batch without old_log_probs trains on the update's
// own log-probs, detached. Twins take the same SGD step (the clip and KL terms on) whether the
// batch holds the old_log_probs compute_log_prob made or none; the one without reports the
// entropy of each micro-batch that the skipped pass would have given.
TEST(DpActorUpdate, OnPolicyWithoutOldLogProbsEqualsTheRecomputedPass) {
  ActorConfig c = fixed_config(8, 4);
  c.use_kl_loss = true;
  c.grad_clip = 1e9;
  LocalOptimizerOptions sgd;
  sgd.optimizer = "sgd";
  sgd.lr = 1.0;
  sgd.weight_decay = 0.0;
  auto ma = testing::tiny_policy(14), mb = testing::tiny_policy(14);
  const auto before = testing::snapshot(*ma);
  auto recomputed = unwrap(DataParallelPPOActor::create(c, local(ma, sgd)));
  auto own = unwrap(DataParallelPPOActor::create(c, local(mb, sgd)));
  auto data = update_batch(*recomputed, kPromptLens, kResponseLens, 14);
  ASSERT_TRUE(data.set_tensor("ref_log_prob", *data.tensor("old_log_probs") + 0.1).ok());
  auto entropys = log_probs(*recomputed, data, forward_meta(1.0, 4, false), true).entropys;
  proto::DataProto without = data;
  ASSERT_TRUE(without.pop(std::vector<std::string>{"old_log_probs"}).ok());
  ASSERT_FALSE(without.tensor("old_log_probs").ok());

  Metrics a = unwrap(recomputed->update_policy(data));
  Metrics b = unwrap(own->update_policy(without));
  EXPECT_GT(testing::max_param_diff(testing::snapshot(*ma), before), 1e-3);
  EXPECT_LT(testing::max_param_diff(testing::snapshot(*ma), testing::snapshot(*mb)), 1e-6);
  for (const char* name : {"actor/pg_loss", "actor/kl_loss", "actor/grad_norm"}) {
    ASSERT_EQ(a[name].size(), b[name].size()) << name;
    for (size_t i = 0; i < a[name].size(); ++i) EXPECT_NEAR(a[name][i], b[name][i], 1e-6) << name << " " << i;
  }
  ASSERT_EQ(b["actor/ppo_kl"].size(), 2u);
  for (double kl : b["actor/ppo_kl"]) EXPECT_EQ(kl, 0.0);  // the ratio is exactly 1
  EXPECT_EQ(a.count("actor/entropy"), 0u);                   // entropy_coeff 0: not computed
  ASSERT_EQ(b["actor/entropy"].size(), 2u);                  // one per micro-batch of 4 rows
  at::Tensor mask = data.tensor("response_mask")->to(at::kDouble);
  at::Tensor e = entropys.to(at::kDouble) * mask;
  for (int64_t i = 0; i < 2; ++i) {
    const double token_mean = (e.narrow(0, 4 * i, 4).sum() / mask.narrow(0, 4 * i, 4).sum()).item<double>();
    EXPECT_NEAR(b["actor/entropy"][static_cast<size_t>(i)], token_mean, 1e-5) << i;
  }
}

TEST(DpActorUpdate, WithoutOldLogProbsAnUpdateThatIsNotOnPolicyIsAnError) {
  ActorConfig two_minis = fixed_config(4, 2), two_epochs = fixed_config(8, 4);
  two_epochs.ppo_epochs = 2;
  for (const ActorConfig& c : {two_minis, two_epochs}) {
    auto model = testing::tiny_policy(15);
    auto actor = unwrap(DataParallelPPOActor::create(c, local(model)));
    auto data = update_batch(*actor, kPromptLens, kResponseLens, 15);
    ASSERT_TRUE(data.pop(std::vector<std::string>{"old_log_probs"}).ok());
    const auto before = testing::snapshot(*model);
    auto r = actor->update_policy(data);
    ASSERT_FALSE(r.ok());
    const std::string& msg = r.status().message();
    EXPECT_NE(msg.find("no old_log_probs"), std::string::npos) << msg;
    EXPECT_NE(msg.find(fmt::format("{} mini-batches of actor.ppo_mini_batch_size = {} rows per rank, actor.ppo_epochs "
                                   "= {}", 8 / c.ppo_mini_batch_size, c.ppo_mini_batch_size, c.ppo_epochs)),
              std::string::npos)
        << msg;
    EXPECT_EQ(testing::max_param_diff(before, testing::snapshot(*model)), 0.0);
  }
}

}  // namespace
}  // namespace tessera::ppo
