// The colocated HybridEngine: FsdpShardingManager hands each gathered FSDP unit to the engine by
// reference (pointer identity, zero bytes copied), frees everything on exit (storage released,
// FSDP resident bytes and offload state as before), swaps the RNG like verl; generate_sequences
// through the worker recomputes old_log_probs equal to the engine's rollout_log_probs within 1e-4.
#include <c10/util/intrusive_ptr.h>

#include "tests/workers/roles/worker_test_util.hpp"
#include "workers/roles/actor_rollout_ref_worker.hpp"
#include "workers/models/model_io.hpp"
#include "workers/rollout/contract.hpp"
#include "workers/rollout/tensor_parallel.hpp"

namespace tessera::workers {
namespace {

using namespace testing;  // NOLINT

bool inside(const at::Tensor& p, const std::vector<at::Tensor>& buffers) {
  const auto* b = static_cast<const char*>(p.data_ptr());
  const int64_t n = p.numel() * static_cast<int64_t>(p.element_size());
  for (const auto& buf : buffers) {
    const auto* lo = static_cast<const char*>(buf.data_ptr());
    if (b >= lo && b + n <= lo + buf.numel() * static_cast<int64_t>(buf.element_size())) return true;
  }
  return false;
}

TEST(ShardingManager, ColocatedHandoffIsZeroCopyAndExitFreesEverything) {
  json c = arr_config();
  c["actor"]["fsdp_config"] = fp32_fsdp(/*param_offload=*/true);
  const auto want = load_tiny_model()->parameter_map();
  const uint16_t port = next_port();
  run_ranks(2, [&](int r) {
    auto w = make_worker(context(r, 2, port), "actor_rollout", c);
    auto& fsdp = w->actor_module()->engine();
    auto* sm = w->sharding_manager();
    ASSERT_NE(sm, nullptr);
    ASSERT_TRUE(fsdp.params_offloaded());
    const int64_t resident = fsdp.resident_bytes();
    ASSERT_TRUE(sm->enter().ok());
    EXPECT_EQ(sm->last_reshard().handoff_copied_bytes, 0);
    EXPECT_EQ(sm->last_reshard().units, static_cast<int64_t>(fsdp.layouts().size()));
    std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> storages;
    for (const auto& b : sm->gathered_buffers()) storages.emplace_back(b.storage().getWeakStorageImpl());
    // Every engine weight is a view of a gathered buffer (pointer identity: nothing was copied),
    // holding the model's values.
    auto engine_params = sm->rollout_model().parameter_map();
    ASSERT_EQ(engine_params.size(), want.size());
    for (const auto& [name, t] : engine_params) {
      EXPECT_TRUE(inside(t, sm->gathered_buffers())) << name;
      EXPECT_TRUE(at::equal(t, want.at(name))) << name;
    }
    EXPECT_TRUE(fsdp.params_offloaded());  // shards re-offloaded while the engine holds the buffers
    ASSERT_TRUE(sm->exit().ok());
    for (const auto& s : storages) EXPECT_TRUE(s.expired());  // the gathered memory is released
    for (const auto& [name, t] : sm->rollout_model().parameter_map()) {
      EXPECT_LE(t.storage().nbytes(), t.element_size()) << name;  // a one-element broadcast view
    }
    EXPECT_TRUE(sm->gathered_buffers().empty());
    EXPECT_EQ(fsdp.resident_bytes(), resident);
    EXPECT_TRUE(fsdp.params_offloaded());
  });
}

TEST(ShardingManager, SwapsToTheGenerationRngAndRestoresTheTrainingOne) {
  auto w = make_worker(context(0, 1, next_port()), "rollout", arr_config());
  auto* sm = w->sharding_manager();
  at::Generator def = at::detail::getDefaultCPUGenerator();
  at::Tensor before = def.get_state();
  ASSERT_TRUE(sm->enter().ok());
  at::Tensor first = at::rand({4});
  ASSERT_TRUE(sm->exit().ok());
  EXPECT_TRUE(at::equal(def.get_state(), before));
  ASSERT_TRUE(sm->enter().ok());
  at::Tensor second = at::rand({4});
  ASSERT_TRUE(sm->exit().ok());
  // verl: the generation state is seeded with dp_rank + 1000 and continues across enters.
  at::Generator expect = at::detail::createCPUGenerator(1000);
  EXPECT_TRUE(at::equal(first, at::rand({4}, expect)));
  EXPECT_TRUE(at::equal(second, at::rand({4}, expect)));
  EXPECT_TRUE(at::equal(def.get_state(), before));
}

TEST(ActorRolloutRefWorker, GenerateSequencesRecomputesOldLogProbsEqualToRolloutLogProbs) {
  auto w = make_worker(context(0, 1, next_port()), "actor_rollout", arr_config());
  proto::DataProto prompts = make_prompts({3, 8, 5, 1}, 8, 31, kVocab);
  at::Tensor rng_before = at::detail::getDefaultCPUGenerator().get_state();
  auto out = w->generate_sequences(prompts);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_TRUE(at::equal(at::detail::getDefaultCPUGenerator().get_state(), rng_before));
  const int64_t R = 6;
  at::Tensor responses = *out->tensor("responses");
  ASSERT_EQ(responses.sizes(), (at::IntArrayRef{4, R}));
  EXPECT_TRUE(at::equal(*out->tensor("input_ids"), at::cat({*prompts.tensor("input_ids"), responses}, 1)));
  at::Tensor mask = out->tensor("attention_mask")->narrow(1, 8, R).to(at::kFloat);
  at::Tensor rollout_lp = *out->tensor("rollout_log_probs");
  at::Tensor old_lp = *out->tensor("old_log_probs");
  EXPECT_LE(((rollout_lp - old_lp) * mask).abs().max().item<double>(), 1e-4);
  const json& m = out->meta_info().at("metrics");
  EXPECT_GE(m.at("timing_s/generate_sequences").get<double>(), m.at("timing_s/reshard").get<double>());
  EXPECT_TRUE(m.contains("perf/cpu_memory_used_gb"));
  EXPECT_TRUE(w->sharding_manager()->gathered_buffers().empty());
  // The same weights give the same log-probs through compute_log_prob.
  auto lp = w->compute_log_prob(*out);
  ASSERT_TRUE(lp.ok()) << lp.status().to_string();
  EXPECT_EQ(max_diff(*lp->tensor("old_log_probs"), old_lp), 0.0);
  // verl's validation flag skips the recompute.
  prompts.meta_info()["recompute_log_prob"] = false;
  auto val = w->generate_sequences(prompts);
  ASSERT_TRUE(val.ok()) << val.status().to_string();
  EXPECT_FALSE(val->tensor("old_log_probs").ok());
}

TEST(ActorRolloutRefWorker, RolloutOnlyRoleGeneratesWithoutRecompute) {
  auto w = make_worker(context(0, 1, next_port()), "rollout", arr_config());
  auto out = w->generate_sequences(make_prompts({3, 5}, 8, 32, kVocab));
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_FALSE(out->tensor("old_log_probs").ok());
  auto update = w->update_actor(make_rollout({3}, {2}, 5, 6, 1, kVocab));
  ASSERT_FALSE(update.ok());
  EXPECT_NE(update.status().message().find("role 'rollout'"), std::string::npos);
}

// Rollout TP=2 over a world of 2 (FULL_SHARD FSDP over the same 2 ranks) against TP=1 on one rank
// with the whole batch: the same responses (greedy and sampled: TP peers share verl's dp-rank seed
// and the gathered batch keeps the row order), the same log-probs within 1e-4; each rank holds and
// receives only its slices of the weights, and the engine aliases them (zero-copy handoff).
TEST(RolloutTensorParallel, TwoRanksGenerateLikeOneFromTheirSlicesOnly) {
  const auto want = load_tiny_model()->parameter_map();
  proto::DataProto prompts = make_prompts({3, 8, 5, 1, 6, 2}, 8, 41, kVocab);
  auto halves = prompts.chunk(2);
  ASSERT_TRUE(halves.ok());
  for (bool sample : {false, true}) {
    SCOPED_TRACE(sample ? "sampled" : "greedy");
    json c = arr_config();
    c["rollout"]["do_sample"] = sample;
    auto single = make_worker(context(0, 1, next_port()), "actor_rollout", c)->generate_sequences(prompts);
    ASSERT_TRUE(single.ok()) << single.status().to_string();
    c["rollout"]["tensor_model_parallel_size"] = 2;
    std::vector<proto::DataProto> outs(2);
    const uint16_t port = next_port();
    run_ranks(2, [&](int r) {
      auto w = make_worker(context(r, 2, port), "actor_rollout", c);
      auto* sm = w->sharding_manager();
      ASSERT_TRUE(sm->enter().ok());
      for (const auto& [name, t] : sm->rollout_model().parameter_map()) {
        EXPECT_TRUE(inside(t, sm->gathered_buffers())) << name;
        EXPECT_TRUE(at::equal(t, rollout::tp_slice(want.at(name), rollout::tp_split_of(name), 2, r))) << name;
      }
      const rollout::ReshardStats st = sm->last_reshard();
      EXPECT_EQ(st.handoff_copied_bytes, 0);
      EXPECT_LT(st.gathered_bytes, st.full_bytes);     // only this rank's slices are materialised
      EXPECT_GT(st.received_bytes, 0);
      EXPECT_LT(st.received_bytes, st.gathered_bytes);  // part of them came from its own shard
      ASSERT_TRUE(sm->exit().ok());
      auto out = w->generate_sequences((*halves)[static_cast<size_t>(r)]);
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      outs[static_cast<size_t>(r)] = *out;
    });
    ASSERT_EQ(outs[0].size() + outs[1].size(), prompts.size());
    auto joined = proto::DataProto::concat({outs[0], outs[1]});
    ASSERT_TRUE(joined.ok()) << joined.status().to_string();
    EXPECT_TRUE(at::equal(*joined->tensor("responses"), *single->tensor("responses")));
    EXPECT_TRUE(at::equal(*joined->tensor("attention_mask"), *single->tensor("attention_mask")));
    at::Tensor mask = single->tensor("attention_mask")->narrow(1, 8, 6).to(at::kFloat);
    for (const char* key : {"rollout_log_probs", "old_log_probs"}) {
      EXPECT_LE(((*joined->tensor(key) - *single->tensor(key)) * mask).abs().max().item<double>(), 1e-4) << key;
    }
  }
}

TEST(RolloutTensorParallel, RefusesATpSizeTheWorldOrTheModelCannotSplit) {
  json c = arr_config();
  c["rollout"]["tensor_model_parallel_size"] = 2;
  auto w = ActorRolloutRefWorker::create(context(0, 3, next_port()), json{{"role", "actor_rollout"}, {"config", c},
                                                                          {"comm_backend", "inproc"}});
  ASSERT_TRUE(w.ok());
  Status st = (*w)->init_model();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("tensor_model_parallel_size=2 does not divide the rollout world size 3"), std::string::npos)
      << st.to_string();
  c["rollout"]["tensor_model_parallel_size"] = 4;  // the tiny model has 2 KV heads
  std::vector<Status> results(4);
  const uint16_t port = next_port();
  run_ranks(4, [&](int r) {
    auto wr = ActorRolloutRefWorker::create(context(r, 4, port), json{{"role", "actor_rollout"}, {"config", c},
                                                                      {"comm_backend", "inproc"}});
    ASSERT_TRUE(wr.ok());
    results[static_cast<size_t>(r)] = (*wr)->init_model();
  });
  for (const auto& r : results) {
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.message().find("num_key_value_heads = 2"), std::string::npos) << r.to_string();
  }
}

}  // namespace
}  // namespace tessera::workers
