// ppo_batching_test.cpp: Karmarkar-Karp partitions (against verl's own algorithm), dynamic
// micro-batching and order restoration, batch-size normalisation, config parsing.
#include <numeric>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/workers/ppo/ppo_test_util.hpp"
#include "workers/ppo/ppo_batching.hpp"
#include "workers/ppo/ppo_inputs.hpp"

namespace tessera::ppo {
namespace {

using Partitions = std::vector<std::vector<int64_t>>;

// Expected values were produced by verl's karmarkar_karp + get_seqlen_balanced_partitions
// (verl/utils/seqlen_balancing.py) run in Python on the same inputs. The first case is also
// worked by hand in the comment of KarmarkarKarpHandWorked.
struct KKCase {
  std::vector<int64_t> lens;
  int64_t k;
  bool equal_size;
  Partitions expected;
};

TEST(KarmarkarKarp, MatchesVerl) {
  const std::vector<KKCase> cases = {
      {{4, 5, 6, 7, 8}, 2, false, {{0, 1, 3}, {2, 4}}},
      {{21, 10, 26, 4, 5, 35, 7, 24, 38, 4, 33, 14, 3}, 3, false, {{2, 6, 8, 9}, {3, 7, 10, 11}, {0, 1, 4, 5, 12}}},
      {{6, 28, 27, 5, 16, 6, 36, 28, 4, 37, 8, 15}, 4, true, {{1, 2, 8}, {3, 6, 11}, {0, 9, 10}, {4, 5, 7}}},
      {{5, 5, 5, 5, 3, 3, 3, 3}, 4, false, {{3, 4}, {2, 5}, {1, 6}, {0, 7}}},
      {{10, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, 3, false, {{0}, {1, 3, 5, 7, 10}, {2, 4, 6, 8, 9}}},
  };
  for (const auto& c : cases) {
    auto parts = get_seqlen_balanced_partitions(c.lens, c.k, c.equal_size);
    ASSERT_TRUE(parts.ok()) << parts.status().to_string();
    EXPECT_EQ(*parts, c.expected) << "k=" << c.k;
  }
}

// [4,5,6,7,8], k=2 by hand: pop spreads 8,7 -> {8}|{7}; pop 6,5 -> {6}|{5}; pop {4} (spread 4)
// and the spread-1 state with the larger top set {8}|{7} -> {4,7}=11 | {8}; merge with {6}|{5}
// pairing largest with smallest -> {4,7,5}=16 | {8,6}=14. Indices: {0,1,3} and {2,4}.
TEST(KarmarkarKarp, HandWorked) {
  auto parts = get_seqlen_balanced_partitions({4, 5, 6, 7, 8}, 2, false);
  ASSERT_TRUE(parts.ok());
  EXPECT_EQ(*parts, (Partitions{{0, 1, 3}, {2, 4}}));
}

TEST(KarmarkarKarp, Errors) {
  EXPECT_FALSE(get_seqlen_balanced_partitions({1, 2}, 3, false).ok());
  EXPECT_FALSE(get_seqlen_balanced_partitions({1, 2, 3}, 2, true).ok());
  EXPECT_FALSE(get_seqlen_balanced_partitions({1, 2}, 0, false).ok());
  auto neg = get_seqlen_balanced_partitions({1, -2}, 1, false);
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.status().message().find("seqlen[1]"), std::string::npos);
}

TEST(DynamicBatching, BalancedUnderBudgetAndRestorable) {
  std::vector<int64_t> prompt = {3, 7, 5, 8, 2, 6, 4, 8, 1, 5}, response = {4, 1, 6, 6, 2, 5, 3, 6, 6, 2};
  auto data = testing::make_batch(prompt, response, 8, 6, 11);
  const int64_t budget = 28;  // >= width 14
  auto mbs = rearrange_micro_batches(data, budget, "max_token_len");
  ASSERT_TRUE(mbs.ok()) << mbs.status().to_string();
  const int64_t total = std::accumulate(prompt.begin(), prompt.end(), int64_t{0}) +
                        std::accumulate(response.begin(), response.end(), int64_t{0});
  EXPECT_GE(static_cast<int64_t>(mbs->batches.size()), (total + budget - 1) / budget);
  std::vector<int64_t> all;
  for (size_t i = 0; i < mbs->batches.size(); ++i) {
    int64_t tokens = (*mbs->batches[i].tensor("attention_mask")).sum().item<int64_t>();
    EXPECT_LE(tokens, budget) << "micro-batch " << i;
    all.insert(all.end(), mbs->indices[i].begin(), mbs->indices[i].end());
  }
  std::vector<int64_t> sorted = all;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(10);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(sorted, iota);
  EXPECT_NE(all, iota) << "rows were not rearranged; the restore check below would be vacuous";
  // Restoring the concatenated per-micro-batch input_ids gives the original order back.
  std::vector<at::Tensor> parts;
  for (const auto& mb : mbs->batches) parts.push_back(*mb.tensor("input_ids"));
  auto restored = restore_dynamic_batch(at::cat(parts, 0), mbs->indices);
  ASSERT_TRUE(restored.ok());
  EXPECT_TRUE(restored->equal(*data.tensor("input_ids")));
}

TEST(DynamicBatching, SyncRaisesTheCountAndErrors) {
  auto data = testing::make_batch({3, 4, 5, 6}, {2, 2, 2, 2}, 6, 2, 3);
  int64_t seen = -1;
  auto mbs = rearrange_micro_batches(data, 100, "max_token_len", [&](int64_t local) -> Result<int64_t> {
    seen = local;
    return int64_t{3};
  });
  ASSERT_TRUE(mbs.ok()) << mbs.status().to_string();
  EXPECT_EQ(seen, 1);
  EXPECT_EQ(mbs->batches.size(), 3u);
  auto small = rearrange_micro_batches(data, 7, "actor.ppo_max_token_len_per_gpu");
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("actor.ppo_max_token_len_per_gpu = 7"), std::string::npos)
      << small.status().message();
  auto too_many = rearrange_micro_batches(data, 100, "k", [](int64_t) -> Result<int64_t> { return int64_t{5}; });
  EXPECT_FALSE(too_many.ok());
  EXPECT_FALSE(restore_dynamic_batch(at::zeros({3}), {{0, 1}}).ok());
  EXPECT_FALSE(restore_dynamic_batch(at::zeros({2}), {{0, 0}}).ok());
}

TEST(Metrics, AppendAndJson) {
  Metrics m;
  append_to_dict(m, {{"actor/pg_loss", 1.0}, {"actor/grad_norm", 2.0}});
  append_to_dict(m, {{"actor/pg_loss", NAN}});
  EXPECT_EQ(m["actor/pg_loss"].size(), 2u);
  auto j = metrics_to_json(m);
  EXPECT_EQ(j["actor/grad_norm"][0].get<double>(), 2.0);
  EXPECT_TRUE(j["actor/pg_loss"][1].is_null());
}

TEST(BatchNormalisation, ActorAsVerl) {
  ActorConfig c;
  c.ppo_mini_batch_size = 16;  // prompts
  c.ppo_micro_batch_size_per_gpu = 4;
  auto n = normalize_actor_config(c, /*rollout_n=*/4, DataParallelShape{8, 1});
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  EXPECT_EQ(n->ppo_mini_batch_size, 8);  // 16 * 4 / 8
  // Deprecated global micro size: divided over dp.
  ActorConfig g;
  g.ppo_mini_batch_size = 16;
  g.ppo_micro_batch_size = 16;
  auto ng = normalize_actor_config(g, 4, DataParallelShape{8, 1});
  ASSERT_TRUE(ng.ok()) << ng.status().to_string();
  EXPECT_EQ(*ng->ppo_micro_batch_size_per_gpu, 2);
  EXPECT_FALSE(ng->ppo_micro_batch_size.has_value());
}

void expect_error_mentions(const Status& st, const std::vector<std::string>& parts) {
  ASSERT_FALSE(st.ok());
  for (const auto& p : parts) EXPECT_NE(st.message().find(p), std::string::npos) << st.message() << " lacks " << p;
}

TEST(BatchNormalisation, ErrorsNameKeysAndValues) {
  ActorConfig c;
  c.ppo_mini_batch_size = 3;
  c.ppo_micro_batch_size_per_gpu = 1;
  expect_error_mentions(normalize_actor_config(c, 1, DataParallelShape{2, 1}).status(),
                        {"actor.ppo_mini_batch_size", "3", "dp size 2"});
  c.ppo_mini_batch_size = 8;
  c.ppo_micro_batch_size_per_gpu = 3;
  expect_error_mentions(normalize_actor_config(c, 1, DataParallelShape{2, 1}).status(),
                        {"actor.ppo_mini_batch_size = 4", "actor.ppo_micro_batch_size_per_gpu = 3"});
  c.ppo_micro_batch_size_per_gpu.reset();
  expect_error_mentions(normalize_actor_config(c, 1, DataParallelShape{2, 1}).status(),
                        {"actor.ppo_micro_batch_size_per_gpu", "use_dynamic_bsz"});
  c.use_dynamic_bsz = true;
  EXPECT_TRUE(normalize_actor_config(c, 1, DataParallelShape{2, 1}).ok());
  expect_error_mentions(normalize_actor_config(c, 1, DataParallelShape{3, 2}).status(),
                        {"world_size 3", "ulysses_sequence_parallel_size 2"});
  ActorConfig g;
  g.ppo_micro_batch_size = 3;
  expect_error_mentions(normalize_actor_config(g, 2, DataParallelShape{2, 1}).status(),
                        {"actor.ppo_micro_batch_size = 3", "dp size 2"});

  CriticConfig k;
  k.rollout_n = 2;
  k.ppo_mini_batch_size = 4;
  k.ppo_micro_batch_size_per_gpu = 3;
  expect_error_mentions(normalize_critic_config(k, DataParallelShape{2, 1}).status(),
                        {"critic.ppo_mini_batch_size = 4", "critic.ppo_micro_batch_size_per_gpu = 3"});
  k.ppo_micro_batch_size_per_gpu = 2;
  auto nk = normalize_critic_config(k, DataParallelShape{2, 1});
  ASSERT_TRUE(nk.ok()) << nk.status().to_string();
  EXPECT_EQ(nk->ppo_mini_batch_size, 4);
  EXPECT_EQ(*nk->forward_micro_batch_size_per_gpu, 2);  // falls back to the ppo_* value
  EXPECT_EQ(*nk->forward_max_token_len_per_gpu, nk->ppo_max_token_len_per_gpu);
}

TEST(ActorConfigParse, VerlKeysAndDefaults) {
  auto j = nlohmann::json::parse(R"({
    "strategy": "fsdp", "ppo_mini_batch_size": 64, "ppo_micro_batch_size": null,
    "ppo_micro_batch_size_per_gpu": 4, "use_dynamic_bsz": false, "ppo_max_token_len_per_gpu": 16384,
    "clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0,
    "policy_loss": {"_target_": "verl.workers.config.PolicyLossConfig", "loss_mode": "vanilla",
                    "clip_cov_ratio": 0.0002, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0,
                    "kl_cov_ratio": 0.0002, "ppo_kl_coef": 0.1},
    "loss_agg_mode": "seq-mean-token-mean", "entropy_coeff": 0, "use_kl_loss": true,
    "use_torch_compile": true, "kl_loss_coef": 0.01, "kl_loss_type": "low_var_kl", "ppo_epochs": 2,
    "shuffle": false, "checkpoint": {"save_contents": ["model"]}, "optim": {"lr": 1e-6},
    "grad_clip": 1.0, "ulysses_sequence_parallel_size": 1, "fsdp_config": {"param_offload": false},
    "entropy_from_logits_with_chunking": false, "entropy_checkpointing": false})");
  auto c = parse_actor_config(j, "actor_rollout_ref.actor");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->ppo_mini_batch_size, 64);
  EXPECT_EQ(*c->ppo_micro_batch_size_per_gpu, 4);
  EXPECT_FALSE(c->ppo_micro_batch_size.has_value());
  EXPECT_DOUBLE_EQ(*c->clip_ratio_high, 0.28);
  EXPECT_EQ(c->loss_agg_mode, "seq-mean-token-mean");
  EXPECT_EQ(c->ppo_epochs, 2);
  EXPECT_TRUE(c->use_kl_loss);
  EXPECT_DOUBLE_EQ(c->policy_loss_config().clip_ratio_high.value(), 0.28);
}

TEST(ActorConfigParse, ErrorsNameTheKey) {
  expect_error_mentions(parse_actor_config({{"ppo_epoch", 1}}, "actor_rollout_ref.actor").status(),
                        {"actor_rollout_ref.actor.ppo_epoch", "unknown key"});
  expect_error_mentions(parse_actor_config({{"policy_loss", {{"mode", "x"}}}}, "actor").status(),
                        {"actor.policy_loss.mode", "unknown key"});
  expect_error_mentions(parse_actor_config({{"ppo_epochs", "two"}}, "actor").status(), {"actor.ppo_epochs", "integer"});
  expect_error_mentions(parse_actor_config({{"loss_agg_mode", "mean"}}, "actor").status(), {"actor.loss_agg_mode", "mean"});
  expect_error_mentions(parse_actor_config({{"policy_loss", {{"loss_mode", "nope"}}}}, "actor").status(),
                        {"actor.policy_loss.loss_mode", "nope"});
  expect_error_mentions(parse_actor_config({{"use_kl_loss", true}, {"kl_loss_type", "full"}}, "actor").status(),
                        {"actor.kl_loss_type", "full"});
  expect_error_mentions(parse_actor_config({{"ulysses_sequence_parallel_size", 0}}, "actor").status(),
                        {"actor.ulysses_sequence_parallel_size = 0"});
  expect_error_mentions(parse_actor_config({{"ppo_micro_batch_size", 8}, {"ppo_micro_batch_size_per_gpu", 2}}, "actor").status(),
                        {"actor.ppo_micro_batch_size", "only one"});
  expect_error_mentions(parse_actor_config(nlohmann::json::array(), "actor").status(), {"actor", "mapping"});
}

TEST(CriticConfigParse, VerlKeysAndErrors) {
  auto j = nlohmann::json::parse(R"({
    "_target_": "verl.workers.config.CriticConfig", "rollout_n": 4, "strategy": "fsdp", "enable": null,
    "optim": {"lr": 1e-5}, "model": {"path": "x"}, "ppo_mini_batch_size": 32, "ppo_micro_batch_size": null,
    "ppo_micro_batch_size_per_gpu": 2, "use_dynamic_bsz": false, "ppo_max_token_len_per_gpu": 32768,
    "forward_max_token_len_per_gpu": 32768, "ppo_epochs": 1, "shuffle": false, "cliprange_value": 0.5,
    "loss_agg_mode": "token-mean", "checkpoint": {}, "forward_micro_batch_size": null,
    "forward_micro_batch_size_per_gpu": 8, "ulysses_sequence_parallel_size": 1, "grad_clip": 1.0})");
  auto c = parse_critic_config(j, "critic");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->rollout_n, 4);
  EXPECT_EQ(*c->forward_micro_batch_size_per_gpu, 8);
  expect_error_mentions(parse_critic_config({{"cliprange", 0.5}}, "critic").status(), {"critic.cliprange", "unknown key"});
  expect_error_mentions(parse_critic_config({{"cliprange_value", -1.0}}, "critic").status(), {"critic.cliprange_value"});
}

TEST(Inputs, BatchChecksNameTheKey) {
  auto d = testing::make_batch({2, 3}, {1, 2}, 4, 3, 1);
  ASSERT_TRUE(read_sequence_batch(d).ok());
  auto no_resp = d.select(std::vector<std::string>{"input_ids", "attention_mask", "position_ids"});
  ASSERT_TRUE(no_resp.ok());
  expect_error_mentions(read_sequence_batch(*no_resp).status(), {"responses"});
  ASSERT_TRUE(d.set_tensor("old_log_probs", at::zeros({2, 2})).ok());
  expect_error_mentions(read_response_tensor(d, "old_log_probs", *read_sequence_batch(d)).status(),
                        {"old_log_probs", "[2, 2]"});
  expect_error_mentions(meta_number(d.meta_info(), "temperature").status(), {"meta_info.temperature"});
}

}  // namespace
}  // namespace tessera::ppo
