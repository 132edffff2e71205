// build_fsdp_module (workers/roles/worker_support.hpp) as the workers call it, on the HF decoder at
// world 2: a null optim block gives a frozen engine (0 optimizer bytes, step() refused naming the
// config path) whose eval outputs equal a trainable build's; FULL_SHARD (verl's default) frees
// each decoder layer after its forward (only the root unit is gathered when forward returns);
// SHARD_GRAD_OP keeps every unit gathered; both recompute the layers in backward (gradient
// checkpointing) and take the training step of SHARD_GRAD_OP without checkpointing, which keeps
// every activation.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "runtime/collective/communicator.hpp"
#include "tests/runtime/collective/collective_test_util.hpp"
#include "tests/workers/fsdp/fsdp_test_util.hpp"
#include "workers/models/decoder.hpp"
#include "workers/roles/worker_support.hpp"

namespace tessera::workers {
namespace {

using collective::Communicator;
using json = nlohmann::json;

std::shared_ptr<models::PretrainedModel> make_model() { return fsdp::testing::tiny_decoder("qwen2", 3, 5); }

json fsdp_config(const std::string& strategy) {
  return {{"mixed_precision", {{"param_dtype", "fp32"}, {"reduce_dtype", "fp32"}, {"buffer_dtype", "fp32"}}},
          {"sharding_strategy", strategy}};
}

std::shared_ptr<ppo::FsdpTrainableModule> build(Communicator& w, const std::string& strategy, bool trainable,
                                           bool gradient_checkpointing = true) {
  FsdpBuildOptions b;
  b.gradient_checkpointing = gradient_checkpointing;
  b.fsdp_config = fsdp_config(strategy);
  b.fsdp_config_path = trainable ? "actor_rollout_ref.actor.fsdp_config" : "actor_rollout_ref.ref.fsdp_config";
  if (trainable) b.optim = {{"lr", 1e-3}};
  b.optim_path = "actor_rollout_ref.actor.optim";
  auto world = std::shared_ptr<Communicator>(&w, [](Communicator*) {});
  auto m = build_fsdp_module(make_model(), world, b);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return m.ok() ? *m : nullptr;
}

struct Inputs {
  at::Tensor ids, mask, pos;
};

Inputs inputs(int rank) {
  at::Generator gen = at::detail::createCPUGenerator(40 + rank);
  at::Tensor ids = at::randint(32, {2, 6}, gen, at::kLong);
  return {ids, at::ones_like(ids), at::arange(6, at::kLong).expand({2, 6}).contiguous()};
}

int64_t shard_bytes(const fsdp::FsdpModule& e) {
  int64_t total = 0;
  for (size_t u = 0; u < e.layouts().size(); ++u) total += e.shard(static_cast<int>(u)).numel() * 4;
  return total;
}

TEST(BuildFsdpModule, NullOptimGivesAFrozenEngineWithoutOptimizerState) {
  collective::testing::with_world("inproc", 2, [&](int rank, Communicator& w) {
    auto ref = build(w, "FULL_SHARD", /*trainable=*/false);
    auto actor = build(w, "FULL_SHARD", /*trainable=*/true);
    ASSERT_TRUE(ref && actor);
    EXPECT_TRUE(ref->engine().frozen());
    EXPECT_FALSE(actor->engine().frozen());
    EXPECT_EQ(ref->engine().optimizer_state_bytes(), 0);
    EXPECT_EQ(actor->engine().optimizer_state_bytes(), 2 * shard_bytes(actor->engine()));
    auto step = ref->engine().step();
    ASSERT_FALSE(step.ok());
    EXPECT_NE(step.status().message().find("module 'actor_rollout_ref.ref.fsdp_config' is frozen"),
              std::string::npos)
        << step.status().message();
    Inputs in = inputs(rank);
    auto want = actor->forward(in.ids, in.mask, in.pos, ppo::ForwardMode::eval);
    auto got = ref->forward(in.ids, in.mask, in.pos, ppo::ForwardMode::eval);
    ASSERT_TRUE(want.ok() && got.ok());
    EXPECT_TRUE(at::equal(*got, *want));
    EXPECT_TRUE(ref->engine().gathered_units().empty());
  });
}

TEST(BuildFsdpModule, FullShardFreesEachDecoderLayerAfterItsForward) {
  using V = std::vector<int>;
  collective::testing::with_world("inproc", 2, [&](int rank, Communicator& w) {
    std::map<std::string, std::map<std::string, at::Tensor>> after_step;
    for (const std::string run : {"FULL_SHARD", "SHARD_GRAD_OP", "SHARD_GRAD_OP without checkpointing"}) {
      const bool checkpointing = run.find("without") == std::string::npos;
      const std::string strategy = run.substr(0, run.find(' '));
      auto m = build(w, strategy, /*trainable=*/true, checkpointing);
      ASSERT_TRUE(m);
      ASSERT_EQ(m->engine().layouts().size(), 4u);  // 3 layers + root
      EXPECT_EQ(static_cast<bool>(m->model().backbone().layer_runner()), checkpointing) << run;
      Inputs in = inputs(rank);
      auto logits = m->forward(in.ids, in.mask, in.pos, ppo::ForwardMode::train);
      ASSERT_TRUE(logits.ok()) << logits.status().to_string();
      EXPECT_EQ(m->engine().gathered_units(), strategy == "FULL_SHARD" ? V({3}) : V({0, 1, 2, 3})) << strategy;
      ASSERT_TRUE(m->backward(logits->pow(2).mean()).ok());
      EXPECT_TRUE(m->engine().gathered_units().empty());
      auto r = m->clip_and_step(1.0);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      after_step[run] = *m->engine().full_state_dict(at::kFloat);
    }
    // The recompute changes where the layers live and what forward keeps, not the maths.
    for (const auto& [name, t] : after_step["SHARD_GRAD_OP without checkpointing"]) {
      EXPECT_LE((after_step["FULL_SHARD"].at(name) - t).abs().max().item<double>(), 1e-6) << name;
      EXPECT_LE((after_step["SHARD_GRAD_OP"].at(name) - t).abs().max().item<double>(), 1e-6) << name;
    }
  });
}

// actor_rollout_ref.model.enable_gradient_checkpointing=false: no recompute, so FULL_SHARD keeps
// the layers gathered from forward to backward (the trade verl's flag makes: memory for compute).
TEST(BuildFsdpModule, WithoutGradientCheckpointingFullShardKeepsLayersUntilBackward) {
  using V = std::vector<int>;
  collective::testing::with_world("inproc", 2, [&](int rank, Communicator& w) {
    auto m = build(w, "FULL_SHARD", /*trainable=*/true, /*gradient_checkpointing=*/false);
    ASSERT_TRUE(m);
    EXPECT_FALSE(m->model().backbone().layer_runner());
    Inputs in = inputs(rank);
    auto logits = m->forward(in.ids, in.mask, in.pos, ppo::ForwardMode::train);
    ASSERT_TRUE(logits.ok()) << logits.status().to_string();
    EXPECT_EQ(m->engine().gathered_units(), V({0, 1, 2, 3}));
    ASSERT_TRUE(m->backward(logits->pow(2).mean()).ok());
    EXPECT_TRUE(m->engine().gathered_units().empty());
  });
}

TEST(ModelSection, EnableGradientCheckpointingIsReadLikeVerl) {
  auto on = parse_model_section(json{{"path", "/m"}, {"enable_gradient_checkpointing", true}}, "critic.model");
  auto absent = parse_model_section(json{{"path", "/m"}}, "critic.model");
  ASSERT_TRUE(on.ok() && absent.ok());
  EXPECT_TRUE(on->gradient_checkpointing);
  EXPECT_FALSE(absent->gradient_checkpointing);  // verl: config.model.get("enable_gradient_checkpointing", False)
  auto bad = parse_model_section(json{{"path", "/m"}, {"enable_gradient_checkpointing", "yes"}}, "critic.model");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("critic.model.enable_gradient_checkpointing"), std::string::npos)
      << bad.status().to_string();
}

// model.use_liger: off unless set; a non-boolean is an error naming the key. build_fsdp_module
// turns the model's fused layer switches on (they act on a GPU only: Note [Fused layers]).
TEST(ModelSection, UseLigerTurnsTheFusedLayersOn) {
  auto on = parse_model_section(json{{"path", "/m"}, {"use_liger", true}}, "actor_rollout_ref.model");
  auto absent = parse_model_section(json{{"path", "/m"}}, "actor_rollout_ref.model");
  ASSERT_TRUE(on.ok() && absent.ok());
  EXPECT_TRUE(on->use_liger);
  EXPECT_FALSE(absent->use_liger);
  auto bad = parse_model_section(json{{"path", "/m"}, {"use_liger", 1}}, "actor_rollout_ref.model");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("actor_rollout_ref.model.use_liger"), std::string::npos)
      << bad.status().to_string();

  collective::testing::with_world("inproc", 1, [&](int, Communicator& w) {
    auto model = make_model();
    FsdpBuildOptions b;
    b.fused_layers = true;
    auto module = build_fsdp_module(model, std::shared_ptr<Communicator>(&w, [](Communicator*) {}), b);
    ASSERT_TRUE(module.ok()) << module.status().to_string();
    int on = 0, off = 0;
    for (const auto& m : model->modules()) {
      if (auto* n = dynamic_cast<models::RMSNorm*>(m.get())) (n->fused ? on : off) += 1;
      if (auto* a = dynamic_cast<models::Attention*>(m.get())) (a->fused_rotary ? on : off) += 1;
      if (auto* p = dynamic_cast<models::MLP*>(m.get())) (p->fused_swiglu ? on : off) += 1;
    }
    EXPECT_GT(on, 0);
    EXPECT_EQ(off, 0);
  });
}

}  // namespace
}  // namespace tessera::workers
