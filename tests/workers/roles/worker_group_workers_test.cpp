// The worker classes through WorkerGroups on the embedded runtime (2 CPU "devices", Gloo
// collectives over loopback): actor_rollout + ref colocated in one actor per device (verl's
// hybrid engine layout), generate_sequences dispatched DP_COMPUTE_PROTO, the recomputed
// old_log_probs equal to compute_log_prob through the group and to the reference policy before
// any update, then update_actor metrics collected from both ranks.
#include "dispatch/worker_group.hpp"
#include "runtime/runtime.hpp"
#include "tests/workers/roles/worker_test_util.hpp"
#include "workers/roles/registry.hpp"

namespace tessera::workers {
namespace {

using namespace testing;  // NOLINT
using dispatch::Value;
using dispatch::WorkerGroup;

TEST(WorkerGroupWorkers, HybridEngineGeneratesScoresAndUpdatesThroughGroups) {
  runtime::RuntimeConfig cfg;
  cfg.embedded_devices = "cpu:2";
  auto rt = runtime::Runtime::start(cfg, worker_registry());
  ASSERT_TRUE(rt.ok()) << rt.status().to_string();
  auto pool = (*rt)->resource_pool();
  ASSERT_TRUE(pool.ok());
  const json config = arr_config(/*mini=*/4, /*micro=*/1);
  const std::string actor_init = json{{"role", "actor_rollout"}, {"config", config}, {"seed", 1}}.dump();
  const std::string ref_init = json{{"role", "ref"}, {"config", config}, {"seed", 1}}.dump();
  auto fused = WorkerGroup::spawn(**rt, "actor_rollout_ref", *pool,
                                  {{"actor_rollout", "actor_rollout_ref", actor_init}, {"ref", "actor_rollout_ref", ref_init}});
  ASSERT_TRUE(fused.ok()) << fused.status().to_string();
  auto actor = (*fused)->role("actor_rollout");
  auto ref = (*fused)->role("ref");
  ASSERT_TRUE(actor.ok() && ref.ok());
  auto init = (*actor)->call("init_model", {});
  ASSERT_TRUE(init.ok()) << init.status().to_string();
  ASSERT_TRUE((*ref)->call("init_model", {}).ok());

  proto::DataProto prompts = make_prompts({3, 8, 5, 1}, 8, 41, kVocab);
  auto gen = (*actor)->call("generate_sequences", {Value(prompts)});
  ASSERT_TRUE(gen.ok()) << gen.status().to_string();
  proto::DataProto out = gen->proto();
  ASSERT_EQ(out.size(), 4);
  EXPECT_EQ(out.meta_info().at("metrics").at("timing_s/reshard").size(), 2u);  // one figure per rank
  out.meta_info().erase("metrics");  // the driver pops it, as verl pops "timing"
  at::Tensor old_lp = *out.tensor("old_log_probs");
  at::Tensor mask = out.tensor("attention_mask")->narrow(1, 8, 6).to(at::kFloat);
  EXPECT_LE(((*out.tensor("rollout_log_probs") - old_lp) * mask).abs().max().item<double>(), 1e-4);

  auto lp = (*actor)->call("compute_log_prob", {Value(out)});
  ASSERT_TRUE(lp.ok()) << lp.status().to_string();
  EXPECT_LE(max_diff(*lp->proto().tensor("old_log_probs"), old_lp), 1e-6);
  auto ref_lp = (*ref)->call("compute_ref_log_prob", {Value(out)});
  ASSERT_TRUE(ref_lp.ok()) << ref_lp.status().to_string();
  EXPECT_LE(max_diff(*ref_lp->proto().tensor("ref_log_prob"), old_lp), 1e-6);  // same weights before any update

  ASSERT_TRUE(out.set_tensor("advantages", at::randn({4, 6}) * mask).ok());
  auto upd = (*actor)->call("update_actor", {Value(out)});
  ASSERT_TRUE(upd.ok()) << upd.status().to_string();
  const json& m = upd->proto().meta_info().at("metrics");
  EXPECT_EQ(m.at("actor/grad_norm").size(), 2u);
  EXPECT_EQ(m.at("actor/grad_norm")[0], m.at("actor/grad_norm")[1]);  // the global norm on every rank
  EXPECT_EQ(m.at("actor/pg_loss").size(), 4u);  // 2 micro-batches per rank
  auto after = (*actor)->call("compute_log_prob", {Value(out)});
  ASSERT_TRUE(after.ok());
  EXPECT_GT(max_diff(*after->proto().tensor("old_log_probs"), old_lp), 1e-5);  // the policy moved
}

}  // namespace
}  // namespace tessera::workers
