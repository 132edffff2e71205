// The colocated HybridEngine: FsdpShardingManager hands each gathered FSDP unit to the engine by
// reference (pointer identity, zero bytes copied), frees everything on exit (storage released,
// FSDP resident bytes and offload state as before), swaps the RNG like verl; generate_sequences
// through the worker recomputes old_log_probs equal to the engine's rollout_log_probs within 1e-4.
#include <c10/util/intrusive_ptr.h>

#include "tests/workers/worker_test_util.hpp"
#include "workers/actor_rollout_ref_worker.hpp"
#include "workers/models/model_io.hpp"
#include "workers/rollout/contract.hpp"

namespace tessera::workers {
namespace {

using namespace testing;  // NOLINT
constexpr int64_t kVocab = 40;

std::unique_ptr<ActorRolloutRefWorker> make_worker(const runtime::WorkerContext& ctx, const std::string& role,
                                                   const json& config) {
  auto w = ActorRolloutRefWorker::create(ctx, json{{"role", role}, {"config", config}, {"seed", 3},
                                                   {"comm_backend", "inproc"}});
  EXPECT_TRUE(w.ok()) << w.status().to_string();
  Status st = (*w)->init_model();
  EXPECT_TRUE(st.ok()) << st.to_string();
  return std::move(*w);
}

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
  models::LoadOptions lo;
  lo.dtype = at::kFloat;
  auto file = models::load_causal_lm(tiny_model_dir(), lo);
  ASSERT_TRUE(file.ok());
  const auto want = (*file)->parameter_map();
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

}  // namespace
}  // namespace tessera::workers
