// Metrics: data/timing/throughput metrics against hand-computed values on a small batch, and
// validation metrics against numpy (tests/driver/data/validation_golden.json).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <fstream>

#include "driver/metrics.hpp"

namespace tessera::driver {
namespace {

using nlohmann::json;

// 2 rows, prompt width 3, response width 4.
//   row 0: prompt mask 0 1 1, response mask 1 1 1 0  (prompt 2, response 3)
//   row 1: prompt mask 1 1 1, response mask 1 1 1 1  (prompt 3, response 4 = clipped)
proto::DataProto small_batch() {
  auto f = [](std::vector<float> v) { return torch::tensor(v).view({2, 4}); };
  proto::TensorDict t;
  t.insert_or_assign("responses", torch::zeros({2, 4}, torch::kInt64));
  t.insert_or_assign("attention_mask",
                     torch::tensor(std::vector<int64_t>{0, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1}).view({2, 7}));
  t.insert_or_assign("token_level_scores", f({0, 0, 1, 0, 0, 0, 0, 0.5}));
  t.insert_or_assign("token_level_rewards", f({0, -0.1, 0.9, 0, 0, 0, 0, 0.4}));
  t.insert_or_assign("advantages", f({1, 2, 3, 99, -1, -2, -3, -4}));
  t.insert_or_assign("returns", f({0.5, 1.5, 2.5, 99, 1, 1, 1, 1}));
  t.insert_or_assign("values", f({0.5, 1, 2, 99, 1, 2, 1, 2}));
  auto d = proto::DataProto::from_dict(t, {}, json{{"global_token_num", {5, 7}}});
  EXPECT_TRUE(d.ok());
  return *d;
}

TEST(Metrics, DataMetricsMatchHandComputation) {
  auto m = compute_data_metrics(small_batch(), /*use_critic=*/true);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_DOUBLE_EQ(m->at("critic/score/mean"), 0.75);
  EXPECT_DOUBLE_EQ(m->at("critic/score/max"), 1.0);
  EXPECT_DOUBLE_EQ(m->at("critic/score/min"), 0.5);
  EXPECT_NEAR(m->at("critic/rewards/mean"), (0.8 + 0.4) / 2, 1e-6);
  // Advantages over the 7 valid response tokens (the 99 is masked out).
  EXPECT_NEAR(m->at("critic/advantages/mean"), (1 + 2 + 3 - 1 - 2 - 3 - 4) / 7.0, 1e-6);
  EXPECT_DOUBLE_EQ(m->at("critic/advantages/max"), 3);
  EXPECT_DOUBLE_EQ(m->at("critic/advantages/min"), -4);
  EXPECT_NEAR(m->at("critic/returns/mean"), (0.5 + 1.5 + 2.5 + 4) / 7.0, 1e-6);
  EXPECT_NEAR(m->at("critic/values/mean"), (0.5 + 1 + 2 + 1 + 2 + 1 + 2) / 7.0, 1e-6);
  // vf_explained_var = 1 - var(returns - values) / (var(returns) + 1e-5), unbiased variances.
  std::vector<double> ret = {0.5, 1.5, 2.5, 1, 1, 1, 1}, val = {0.5, 1, 2, 1, 2, 1, 2};
  auto var = [](const std::vector<double>& v) {
    double mean = 0, s = 0;
    for (double x : v) mean += x / v.size();
    for (double x : v) s += (x - mean) * (x - mean);
    return s / (v.size() - 1);
  };
  std::vector<double> diff;
  for (size_t i = 0; i < ret.size(); ++i) diff.push_back(ret[i] - val[i]);
  EXPECT_NEAR(m->at("critic/vf_explained_var"), 1.0 - var(diff) / (var(ret) + 1e-5), 1e-6);
  EXPECT_DOUBLE_EQ(m->at("response_length/mean"), 3.5);
  EXPECT_DOUBLE_EQ(m->at("response_length/max"), 4);
  EXPECT_DOUBLE_EQ(m->at("response_length/min"), 3);
  EXPECT_DOUBLE_EQ(m->at("response_length/clip_ratio"), 0.5);
  EXPECT_DOUBLE_EQ(m->at("prompt_length/mean"), 2.5);
  EXPECT_DOUBLE_EQ(m->at("prompt_length/clip_ratio"), 0.5);
  auto no_critic = compute_data_metrics(small_batch(), false);
  EXPECT_EQ(no_critic->count("critic/values/mean"), 0u);
}

TEST(Metrics, TimingAndThroughput) {
  TimingRaw timing = {{"gen", 1.4}, {"update_actor", 2.6}, {"step", 5.0}, {"reward", 0.1}};
  auto t = compute_timing_metrics(small_batch(), timing);
  ASSERT_TRUE(t.ok());
  EXPECT_DOUBLE_EQ(t->at("timing_s/gen"), 1.4);
  EXPECT_DOUBLE_EQ(t->at("timing_s/reward"), 0.1);
  EXPECT_DOUBLE_EQ(t->at("timing_per_token_ms/gen"), 1.4 * 1000 / 7);            // 7 response tokens
  EXPECT_DOUBLE_EQ(t->at("timing_per_token_ms/update_actor"), 2.6 * 1000 / 12);  // 5 prompt + 7 response
  EXPECT_EQ(t->count("timing_per_token_ms/reward"), 0u);
  auto p = compute_throughout_metrics(small_batch(), timing, /*n_gpus=*/2);
  ASSERT_TRUE(p.ok());
  EXPECT_DOUBLE_EQ(p->at("perf/total_num_tokens"), 12);
  EXPECT_DOUBLE_EQ(p->at("perf/time_per_step"), 5.0);
  EXPECT_DOUBLE_EQ(p->at("perf/throughput"), 12 / (5.0 * 2));
  EXPECT_FALSE(compute_throughout_metrics(small_batch(), {{"gen", 1}}, 2).ok());
}

TEST(Metrics, ReduceAndWorkerMetrics) {
  auto r = reduce_metrics({{"a", {1, 2, 3}}, {"b", {4}}});
  EXPECT_DOUBLE_EQ(r["a"], 2);
  EXPECT_DOUBLE_EQ(r["b"], 4);
  Metrics m;
  ASSERT_TRUE(merge_worker_metrics(json{{"actor/pg_loss", {1.0, 3.0}}, {"actor/lr", 1e-6}}, m).ok());
  EXPECT_DOUBLE_EQ(m["actor/pg_loss"], 2.0);
  EXPECT_DOUBLE_EQ(m["actor/lr"], 1e-6);
  Status bad = merge_worker_metrics(json{{"actor/x", "text"}}, m);
  EXPECT_NE(bad.message().find("actor/x"), std::string::npos);
}

// Dynamic sampling's further generation batches: counters add, the cache size is the largest,
// per-row means average over the batches, other metrics are the latest; phases add, the agent
// loops' min/max/mean combine as such.
TEST(Metrics, GenerationBatchesFoldIntoTheStep) {
  Metrics metrics{{"rollout/prefill_tokens", 100}, {"rollout/kv_cache_gb", 2}, {"rollout/tool_calls_mean", 1},
                  {"actor/lr", 1e-6}};
  TimingRaw timing{{"gen", 3}, {"agent_loop/generate_sequences/max", 5}, {"agent_loop/generate_sequences/min", 1},
                   {"agent_loop/generate_sequences/mean", 2}};
  // Two batches are in already; the third brings:
  fold_generation_metrics({{"rollout/prefill_tokens", 50}, {"rollout/kv_cache_gb", 1.5},
                           {"rollout/tool_calls_mean", 4}, {"actor/lr", 2e-6}, {"rollout/preemptions", 3}},
                          {{"gen", 2}, {"agent_loop/generate_sequences/max", 4}, {"agent_loop/generate_sequences/min", 0.5},
                           {"agent_loop/generate_sequences/mean", 5}},
                          /*folded=*/2, metrics, timing);
  EXPECT_DOUBLE_EQ(metrics["rollout/prefill_tokens"], 150);
  EXPECT_DOUBLE_EQ(metrics["rollout/kv_cache_gb"], 2);
  EXPECT_DOUBLE_EQ(metrics["rollout/tool_calls_mean"], 2);  // (1 + 1 + 4) / 3
  EXPECT_DOUBLE_EQ(metrics["actor/lr"], 2e-6);
  EXPECT_DOUBLE_EQ(metrics["rollout/preemptions"], 3);  // new to the step
  EXPECT_DOUBLE_EQ(timing["gen"], 5);
  EXPECT_DOUBLE_EQ(timing["agent_loop/generate_sequences/max"], 5);
  EXPECT_DOUBLE_EQ(timing["agent_loop/generate_sequences/min"], 0.5);
  EXPECT_DOUBLE_EQ(timing["agent_loop/generate_sequences/mean"], 3);  // (2 + 2 + 5) / 3
}

TEST(Metrics, MarkedTimerRecordsASection) {
  TimingRaw raw;
  { MarkedTimer t("gen", raw); }
  ASSERT_EQ(raw.count("gen"), 1u);
  EXPECT_GE(raw["gen"], 0.0);
}

TEST(ValidationMetrics, BootstrapDrawsNumpysIndices) {
  // numpy 1.24: np.random.seed(42); np.random.choice(5, size=8, replace=True) -> 3 4 2 4 4 1 2 2
  std::vector<size_t> seen;
  ReduceFn record = [&](const std::vector<size_t>& idxs) {
    seen = idxs;
    return 0.0;
  };
  bootstrap_metric(5, 8, {record}, /*n_bootstrap=*/1, /*seed=*/42);
  EXPECT_EQ(seen, (std::vector<size_t>{3, 4, 2, 4, 4, 1, 2, 2}));
}

TEST(ValidationMetrics, MatchNumpyReference) {
  const char* src = std::getenv("TESSERA_SOURCE_DIR");
  std::ifstream in(std::string(src ? src : ".") + "/tests/driver/data/validation_golden.json");
  ASSERT_TRUE(in.good());
  json golden = json::parse(in);
  std::map<std::string, std::vector<json>> infos;
  for (const auto& [k, v] : golden["infos"].items()) infos[k] = v.get<std::vector<json>>();
  auto vm = process_validation_metrics(golden["data_sources"].get<std::vector<std::string>>(),
                                       golden["sample_inputs"].get<std::vector<std::string>>(), infos);
  ASSERT_TRUE(vm.ok()) << vm.status().to_string();
  Metrics got = validation_metric_dict(*vm);
  EXPECT_EQ(got.size(), golden["expected"].size());
  for (const auto& [k, v] : golden["expected"].items()) {
    ASSERT_EQ(got.count(k), 1u) << k;
    EXPECT_NEAR(got[k], v.get<double>(), 1e-12) << k;
  }
  EXPECT_EQ(got.count("val-core/arith/acc/mean@4"), 1u);
  EXPECT_EQ(got.count("val-core/arith/acc/maj@4/mean"), 1u);
  EXPECT_EQ(got.count("val-core/gsm8k/acc/best@3/mean"), 1u);
  auto bad = process_validation_metrics({"a", "b"}, {"x", "y"}, {{"reward", {json(1.0)}}});
  EXPECT_NE(bad.status().message().find("'reward'"), std::string::npos);
}

}  // namespace
}  // namespace tessera::driver
