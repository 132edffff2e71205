// Plain-value pieces of tessera::fsdp against independent maths: flat layouts and re-cutting,
// verl's LR schedules (closed-form values), AdamW against torch::optim::AdamW, config parsing,
// and wrap policies.
#include "tests/workers/fsdp/fsdp_test_util.hpp"
#include "workers/fsdp/flat_param.hpp"
#include "workers/fsdp/optim.hpp"
#include "workers/fsdp/options.hpp"

namespace tessera::fsdp {
namespace {

using Shapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

TEST(FlatLayout, OffsetsAndPaddingToTheShardCount) {
  auto l = make_flat_layout("u", Shapes{{"a", {2, 3}}, {"b", {5}}, {"c", {}}}, 4);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->numel, 12);  // 6 + 5 + 1 (a scalar has one element)
  EXPECT_EQ(l->padded_numel, 12);
  EXPECT_EQ(l->params[1].offset, 6);
  EXPECT_EQ(l->params[2].offset, 11);
  auto l5 = l->with_shard_count(5);
  EXPECT_EQ(l5.padded_numel, 15);
  EXPECT_EQ(l5.shard_numel(), 3);
  EXPECT_EQ(l5.shard_range(4), (std::pair<int64_t, int64_t>{12, 15}));
}

TEST(FlatLayout, RejectsBadInput) {
  EXPECT_FALSE(make_flat_layout("u", Shapes{}, 2).ok());
  auto dup = make_flat_layout("u", Shapes{{"a", {1}}, {"a", {2}}}, 2);
  EXPECT_NE(dup.status().message().find("'a' appears twice"), std::string::npos);
  EXPECT_FALSE(make_flat_layout("u", Shapes{{"a", {-1}}}, 2).ok());
  EXPECT_FALSE(make_flat_layout("u", Shapes{{"a", {1}}}, 0).ok());
}

TEST(FlatLayout, JsonRoundTripAndCorruptionIsNamed) {
  auto l = *make_flat_layout("layer", Shapes{{"w", {3, 2}}, {"b", {3}}}, 2);
  auto back = flat_layout_from_json(flat_layout_to_json(l), "m.json");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->padded_numel, l.padded_numel);
  nlohmann::json bad = flat_layout_to_json(l);
  bad["params"][1]["offset"] = 5;
  auto err = flat_layout_from_json(bad, "m.json");
  EXPECT_EQ(err.status().code(), ErrorCode::corrupt_data);
  EXPECT_NE(err.status().message().find("m.json unit 'layer': parameter 'b' offset 5"), std::string::npos)
      << err.status().message();
  bad = flat_layout_to_json(l);
  bad.erase("numel");
  EXPECT_NE(flat_layout_from_json(bad, "m.json").status().message().find("missing field 'numel'"),
            std::string::npos);
}

// Re-cutting: cover every new shard of every (old K, new K) pair and compare with direct slicing.
TEST(FlatLayout, PiecesForRangeRecutsAnyShardCount) {
  auto base = *make_flat_layout("u", Shapes{{"a", {7}}, {"b", {3, 2}}}, 1);  // numel 13
  at::Tensor data = at::arange(base.numel, at::kFloat) + 1;
  for (int old_k : {1, 2, 3, 4}) {
    FlatLayout old_layout = base.with_shard_count(old_k);
    at::Tensor padded = at::zeros({old_layout.padded_numel});
    padded.narrow(0, 0, base.numel).copy_(data);
    std::vector<at::Tensor> old_shards = padded.chunk(old_k);
    for (int new_k : {1, 2, 4, 5}) {
      FlatLayout new_layout = base.with_shard_count(new_k);
      for (int k = 0; k < new_k; ++k) {
        auto [b, e] = new_layout.shard_range(k);
        at::Tensor got = at::zeros({e - b});
        for (const auto& p : pieces_for_range(old_layout, b, e)) {
          got.narrow(0, p.dest_offset, p.length).copy_(old_shards[p.shard].narrow(0, p.shard_offset, p.length));
        }
        at::Tensor want = at::zeros({e - b});
        for (int64_t i = b; i < std::min(e, base.numel); ++i) want[i - b] = static_cast<float>(i + 1);
        EXPECT_TRUE(at::equal(got, want)) << old_k << " -> " << new_k << " shard " << k;
      }
    }
  }
}

// The grad norm's sum of squares, widened to float64 a chunk at a time, equals the float64 sum
// of the whole tensor for every chunk size (the last chunk partial or whole).
TEST(GradNorm, ChunkedFloat64SumOfSquaresEqualsTheWholeSum) {
  const at::Tensor g = at::randn({1000}, at::detail::createCPUGenerator(7)) * 1e3;
  const double want = g.to(at::kDouble).pow(2).sum().item<double>();
  for (int64_t chunk : {int64_t{1}, int64_t{7}, int64_t{100}, int64_t{1000}, int64_t{4096}}) {
    at::Tensor total = at::zeros({1}, at::kDouble);
    add_sum_of_squares(total, g, chunk);
    add_sum_of_squares(total, g.narrow(0, 0, 0), chunk);  // an empty shard adds nothing
    EXPECT_NEAR(total.item<double>(), want, 1e-12 * want) << "chunk " << chunk;
  }
}

TEST(LrSchedule, CosineMatchesVerlClosedForm) {
  LrScheduleOptions o;
  o.kind = LrScheduleKind::cosine;
  o.warmup_steps = 2;
  o.total_training_steps = 10;
  o.min_lr_ratio = 0.1;
  // Warmup rises linearly from min_lr_ratio; then 0.55 + 0.45 cos(pi * progress).
  EXPECT_DOUBLE_EQ(lr_lambda(o, 0), 0.1);
  EXPECT_DOUBLE_EQ(lr_lambda(o, 1), 0.55);
  EXPECT_DOUBLE_EQ(lr_lambda(o, 2), 1.0);
  EXPECT_NEAR(lr_lambda(o, 6), 0.55, 1e-12);   // progress 1/2: cos = 0
  EXPECT_NEAR(lr_lambda(o, 10), 0.1, 1e-12);   // progress 1: cos = -1
  EXPECT_NEAR(lr_lambda(o, 4), 0.55 + 0.45 * std::sqrt(0.5), 1e-12);  // progress 1/4
  o.num_cycles = 1.0;  // a full wave comes back up
  EXPECT_NEAR(lr_lambda(o, 10), 1.0, 1e-12);
}

TEST(LrSchedule, ConstantWithWarmupAndWarmupRatio) {
  LrScheduleOptions o;
  o.warmup_steps = 4;
  std::vector<double> want = {0.0, 0.25, 0.5, 0.75, 1.0, 1.0};
  for (int s = 0; s < 6; ++s) EXPECT_DOUBLE_EQ(lr_lambda(o, s), want[s]);
  o.warmup_steps = -1;
  o.warmup_steps_ratio = 0.25;
  o.total_training_steps = 10;
  EXPECT_EQ(resolve_warmup_steps(o), 2);  // int(2.5)
  LrScheduler sched(2e-3, o);
  EXPECT_DOUBLE_EQ(sched.current_lr(), 0.0);
  sched.step();
  EXPECT_DOUBLE_EQ(sched.current_lr(), 1e-3);
  sched.step();
  EXPECT_DOUBLE_EQ(sched.current_lr(), 2e-3);
}

// The fused kernel against LibTorch's own (unfused) AdamW over several shards at once, fp32
// master weights: equal up to float rounding (the kernel orders the same formula differently).
TEST(AdamW, FusedStepEqualsTorchAdamW) {
  AdamWOptions o{3e-2, 0.8, 0.95, 1e-6, 0.2};
  at::Generator gen = at::detail::createCPUGenerator(5);
  std::vector<at::Tensor> refs, mine;
  for (int64_t n : {37, 1, 300}) {
    at::Tensor start = at::randn({n}, gen);
    refs.push_back(start.clone().requires_grad_(true));
    mine.push_back(start.clone());
  }
  torch::optim::AdamW opt(refs, torch::optim::AdamWOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(o.weight_decay));
  std::vector<AdamWState> states(mine.size());
  std::vector<AdamWState*> state_ptrs;
  for (auto& s : states) state_ptrs.push_back(&s);
  for (int t = 1; t <= 6; ++t) {
    std::vector<at::Tensor> grads;
    for (size_t i = 0; i < refs.size(); ++i) {
      grads.push_back(at::randn(refs[i].sizes(), gen));
      refs[i].mutable_grad() = grads.back().clone();
    }
    opt.step();
    adamw_step(mine, grads, state_ptrs, o, o.lr, t);
    for (size_t i = 0; i < refs.size(); ++i) {
      const double err = (mine[i] - refs[i].detach()).abs().max().item<double>();
      EXPECT_LE(err, 2e-6) << "step " << t << " tensor " << i;
    }
  }
  EXPECT_TRUE(states[0].exp_avg.defined());
}

TEST(Config, VerlFsdpKeys) {
  auto j = nlohmann::json::parse(R"({
    "fsdp_size": 2, "param_offload": true, "optimizer_offload": false,
    "mixed_precision": {"param_dtype": "bf16", "reduce_dtype": "fp32", "buffer_dtype": "float32"},
    "model_dtype": "fp32", "wrap_policy": {"min_num_params": 0}, "strategy": "fsdp2",
    "forward_prefetch": false})");
  auto c = parse_fsdp_config(j, "actor.fsdp_config");
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_TRUE(c->param_offload);
  EXPECT_EQ(c->mixed_precision.param_dtype, at::kBFloat16);
  EXPECT_EQ(resolve_strategy(*c, 4), ShardingStrategy::hybrid_shard);  // 0 < 2 < 4
  EXPECT_EQ(resolve_strategy(*c, 2), ShardingStrategy::full_shard);    // fsdp_size >= world
  FsdpOptions o = fsdp_options_from_config(*c, 4);
  EXPECT_EQ(o.strategy, ShardingStrategy::hybrid_shard);
  EXPECT_TRUE(o.param_offload);

  auto z2 = parse_fsdp_config(nlohmann::json::parse(R"({"reshard_after_forward": false})"), "c");
  EXPECT_EQ(resolve_strategy(*z2, 4), ShardingStrategy::shard_grad_op);
  auto ns = parse_fsdp_config(nlohmann::json::parse(R"({"reshard_after_forward": true, "sharding_strategy": "NO_SHARD"})"), "c");
  EXPECT_EQ(resolve_strategy(*ns, 4), ShardingStrategy::no_shard);

  auto bad = parse_fsdp_config(nlohmann::json::parse(R"({"mixed_precision": {"parm_dtype": "bf16"}})"), "a.fsdp_config");
  EXPECT_EQ(bad.status().message(), "a.fsdp_config.mixed_precision.parm_dtype: unknown key");
  bad = parse_fsdp_config(nlohmann::json::parse(R"({"model_dtype": "int8"})"), "c");
  EXPECT_NE(bad.status().message().find("c.model_dtype: unknown dtype 'int8'"), std::string::npos);
  bad = parse_fsdp_config(nlohmann::json::parse(R"({"offload_policy": true})"), "c");
  EXPECT_EQ(bad.status().code(), ErrorCode::unimplemented);
  bad = parse_fsdp_config(nlohmann::json::parse(R"({"fsdp_size": 0})"), "c");
  EXPECT_FALSE(bad.ok());
}

TEST(Config, VerlOptimKeys) {
  auto j = nlohmann::json::parse(R"({"lr": 1e-5, "betas": [0.9, 0.95], "weight_decay": 0.0,
    "lr_warmup_steps": -1, "lr_warmup_steps_ratio": 0.1, "total_training_steps": 100,
    "warmup_style": "cosine", "min_lr_ratio": 0.05, "num_cycles": 0.5})");
  auto o = parse_optim_config(j, "actor.optim");
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  EXPECT_EQ(o->schedule.kind, LrScheduleKind::cosine);
  EXPECT_EQ(resolve_warmup_steps(o->schedule), 10);
  EXPECT_DOUBLE_EQ(o->adamw.beta2, 0.95);
  auto bad = parse_optim_config(nlohmann::json::parse(R"({"warmup_style": "linear"})"), "actor.optim");
  EXPECT_NE(bad.status().message().find("actor.optim.warmup_style: 'linear'"), std::string::npos);
  bad = parse_optim_config(nlohmann::json::parse(R"({"betas": [0.9]})"), "o");
  EXPECT_FALSE(bad.ok());
  bad = parse_optim_config(nlohmann::json::parse(R"({"lrr": 1})"), "o");
  EXPECT_EQ(bad.status().message(), "o.lrr: unknown key");
}

TEST(WrapPolicy, LayerClassesSizeBasedAndDisabled) {
  auto model = testing::make_model();
  WrapPolicy layers;
  layers.transformer_layer_cls_to_wrap = {"TinyBlockImpl"};
  auto u = make_units(*model, layers, /*recompute_layers=*/true);
  ASSERT_TRUE(u.ok());
  ASSERT_EQ(u->size(), 3u);
  EXPECT_EQ((*u)[0].name, "layers.0");
  EXPECT_TRUE((*u)[0].recompute);
  EXPECT_EQ((*u)[0].param_names.front(), "layers.0.norm.weight");
  EXPECT_EQ((*u)[2].name, "root");
  EXPECT_FALSE((*u)[2].recompute);
  EXPECT_EQ((*u)[2].param_names.size(), 5u);  // embed, norm (2), head (2)
  WrapPolicy off;
  off.disable = true;
  auto one = make_units(*model, off);
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ(one->front().param_names.size(), model->parameters().size());
  WrapPolicy by_size;
  by_size.min_num_params = 100;  // a block has 6*12+12+12*6+6+12 = 174 parameters
  auto sized = make_units(*model, by_size);
  ASSERT_TRUE(sized.ok());
  EXPECT_EQ(sized->size(), 3u);
  EXPECT_EQ((*sized)[1].name, "layers.1");
}

}  // namespace
}  // namespace tessera::fsdp
