// FSDP over a LoRA-adapted HF decoder (Note [Attached units]): each layer is its frozen base unit
// plus an attached adapter unit, and training every strategy at world 2 (HYBRID_SHARD at 4)
// equals single-process LibTorch training of the same adapted model (torch AdamW over the
// parameters that require grad): losses, grad norms and adapters within 1e-5, base weights
// bitwise unchanged; AdamW moments exist for the adapters only; a layer and its adapters are
// gathered and freed together (FULL_SHARD recompute); checkpoints round-trip; bad attachments
// are refused.
#include <algorithm>
#include <filesystem>

#include "tests/workers/fsdp/fsdp_test_util.hpp"
#include "workers/fsdp/checkpoint.hpp"
#include "workers/models/lora.hpp"
#include "workers/models/model.hpp"

namespace tessera::fsdp {
namespace {

using collective::Communicator;
using S = ShardingStrategy;

constexpr double kScale = 2.0;  // alpha 8 / rank 4

std::shared_ptr<models::CausalLM> make_adapted() {
  auto m = testing::tiny_decoder("qwen2", 2, 11);
  models::LoraConfig c;
  c.rank = 4;
  c.alpha = 8;
  c.target.all_linear = true;
  Status st = models::apply_lora(*m, c, "model");
  EXPECT_TRUE(st.ok()) << st.to_string();
  // B starts at zero, which would leave A without gradient in the first step.
  at::Generator gen = at::detail::createCPUGenerator(77);
  torch::NoGradGuard no_grad;
  for (auto& item : m->named_parameters()) {
    if (item.key().find(".lora_B.") != std::string::npos) item.value().copy_(at::randn(item.value().sizes(), gen) * 0.05);
  }
  return m;
}

std::shared_ptr<Communicator> borrow(Communicator& c) {
  return std::shared_ptr<Communicator>(&c, [](Communicator*) {});
}

struct TokenBatch {
  at::Tensor ids, mask, pos;
};

TokenBatch batch(int step, int rank, int world) {
  at::Generator gen = at::detail::createCPUGenerator(700 + step);
  at::Tensor ids = at::randint(32, {4, 7}, gen, at::kLong);
  const int64_t n = 4 / world;
  ids = ids.narrow(0, rank * n, n).contiguous();
  return {ids, at::ones_like(ids), at::arange(7, at::kLong).expand({n, 7}).contiguous()};
}

at::Tensor loss_of(models::CausalLM& m, const TokenBatch& b) {
  at::Tensor logits = m.forward(b.ids, b.mask, b.pos);
  return torch::nn::functional::cross_entropy(logits.narrow(1, 0, 6).reshape({-1, 32}), b.ids.narrow(1, 1, 6).reshape(-1));
}

OptimizerOptions optim() {
  OptimizerOptions o = testing::test_optim();
  o.adamw.lr = 1e-2;
  return o;
}

enum class Policy { layers, disable, by_size };

WrapPolicy wrap_policy(Policy p) {
  WrapPolicy w;
  w.disable = p == Policy::disable;
  if (p == Policy::by_size) w.min_num_params = 300;  // cuts the layers apart
  return w;
}

std::unique_ptr<FsdpModule> wrap(std::shared_ptr<models::CausalLM> model, std::shared_ptr<Communicator> world, S strategy,
                                 int fsdp_size = -1, bool prefetch = false, Policy policy = Policy::layers,
                                 bool optimizer_offload = false) {
  auto units = make_decoder_units(*model, wrap_policy(policy));
  EXPECT_TRUE(units.ok()) << units.status().to_string();
  FsdpOptions fo;
  fo.strategy = strategy;
  fo.mixed_precision.param_dtype = at::kFloat;
  fo.forward_prefetch = prefetch;
  fo.optimizer_offload = optimizer_offload;
  auto mesh = collective::DeviceMesh::for_fsdp(world, fsdp_size);
  EXPECT_TRUE(mesh.ok()) << mesh.status().to_string();
  auto e = FsdpModule::wrap(model, *units, *mesh, fo, optim());
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  if (!e.ok()) return nullptr;
  EXPECT_TRUE(install_layer_runner(**e, *model).ok());
  return std::move(*e);
}

struct Case {
  S strategy;
  int world;
  int fsdp_size;
  bool prefetch = false;
  Policy policy = Policy::layers;
  bool optimizer_offload = false;
};

class FsdpLora : public ::testing::TestWithParam<Case> {};

TEST_P(FsdpLora, AdaptersTrainAsInOneProcessAndTheBaseStaysBitwise) {
  constexpr int kSteps = 3;
  const Case c = GetParam();
  auto ref = make_adapted();
  const models::TensorMap initial = [&] {
    models::TensorMap out;
    for (const auto& [name, t] : ref->parameter_map()) out[name] = t.detach().clone();
    return out;
  }();
  testing::RunResult want =
      testing::reference_train(*ref, optim(), kSteps, [&](int s) { return loss_of(*ref, batch(s, 0, 1)); });
  collective::testing::with_world("inproc", c.world, [&](int rank, Communicator& w) {
    auto model = make_adapted();
    auto e = wrap(model, borrow(w), c.strategy, c.fsdp_size, c.prefetch, c.policy, c.optimizer_offload);
    ASSERT_TRUE(e);
    std::vector<std::string> units;
    for (const auto& l : e->layouts()) units.push_back(l.unit);
    if (c.policy == Policy::layers) {
      EXPECT_EQ(units, (std::vector<std::string>{"model.layers.0", "model.layers.0.lora", "model.layers.1",
                                                 "model.layers.1.lora", "root"}));
    } else if (c.policy == Policy::disable) {
      EXPECT_EQ(units, (std::vector<std::string>{"root", "root.lora"}));
    }
    // Moments for the adapters only: 2 x fp32 per adapter element of this rank's shards.
    int64_t adapter_shard = 0;
    for (const auto& l : e->layouts()) {
      const bool adapters = std::all_of(l.params.begin(), l.params.end(),
                                        [](const auto& p) { return models::is_lora_parameter(p.name); });
      if (adapters) adapter_shard += l.shard_numel();
    }
    EXPECT_GT(adapter_shard, 0);
    EXPECT_EQ(e->optimizer_state_bytes(), 2 * 4 * adapter_shard);
    testing::expect_training_matches(*e, w, want, [&](int s) { return loss_of(*model, batch(s, rank, c.world)); });
    auto got = e->full_state_dict(at::kFloat);
    ASSERT_TRUE(got.ok());
    EXPECT_LE(testing::max_relative_error(*got, want.params), 1e-5);
    for (const auto& [name, t] : initial) {
      if (models::is_lora_parameter(name)) {
        EXPECT_FALSE(at::equal(got->at(name), t)) << name << " did not train";
      } else {
        EXPECT_TRUE(at::equal(got->at(name), t)) << name << " changed";
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Strategies, FsdpLora,
                         ::testing::Values(Case{S::full_shard, 2, -1}, Case{S::full_shard, 2, -1, true},
                                           Case{S::shard_grad_op, 2, -1}, Case{S::no_shard, 2, -1},
                                           Case{S::hybrid_shard, 4, 2},
                                           Case{S::full_shard, 2, -1, false, Policy::layers, /*optimizer_offload=*/true},
                                           Case{S::full_shard, 2, -1, false, Policy::disable},
                                           Case{S::full_shard, 2, -1, false, Policy::by_size}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const Case& c = info.param;
                           return std::string(to_string(c.strategy)) + "_world" + std::to_string(c.world) +
                                  (c.prefetch ? "_prefetch" : "") + (c.optimizer_offload ? "_optimizer_offload" : "") +
                                  (c.policy == Policy::disable   ? "_one_unit"
                                   : c.policy == Policy::by_size ? "_by_size"
                                                                 : "");
                         });

TEST(FsdpLoraUnits, ALayerAndItsAdaptersAreGatheredAndFreedTogether) {
  using V = std::vector<int>;
  collective::testing::with_world("inproc", 2, [&](int rank, Communicator& w) {
    auto model = make_adapted();
    auto e = wrap(model, borrow(w), S::full_shard);
    ASSERT_TRUE(e);
    std::vector<V> log;
    models::LayerRunner inner = model->backbone().layer_runner();
    model->backbone().set_layer_runner([inner, &e, &log](int64_t i, models::LayerCall call, const at::Tensor& h) {
      return inner(i, [call, &e, &log](const at::Tensor& x) {
        log.push_back(e->gathered_units());
        return call(x);
      }, h);
    });
    ASSERT_TRUE(e->begin_forward(ForwardMode::train).ok());
    at::Tensor loss = loss_of(*model, batch(0, rank, 2));
    EXPECT_EQ(e->gathered_units(), (V{4}));  // the root only
    ASSERT_TRUE(e->backward(loss).ok());
    EXPECT_TRUE(e->gathered_units().empty());
    // Forward layer 0, layer 1; backward recomputes layer 1 (layer 0 prefetched), then layer 0.
    EXPECT_EQ(log, (std::vector<V>{{0, 1, 4}, {2, 3, 4}, {0, 1, 2, 3, 4}, {0, 1, 4}}));
    // An attached unit is never run on its own.
    ASSERT_TRUE(e->begin_forward(ForwardMode::eval).ok());
    auto out = e->run_unit(1, [](const at::Tensor& x) { return x; }, at::zeros({1}));
    ASSERT_FALSE(out.ok());
    EXPECT_NE(out.status().message().find("attached to 'model.layers.0'"), std::string::npos)
        << out.status().message();
    ASSERT_TRUE(e->end_forward().ok());
  });
}

TEST(FsdpLoraUnits, CheckpointsRoundTripAndHoldMomentsOfTheAdaptersOnly) {
  const std::string dir = (std::filesystem::temp_directory_path() / "tessera_fsdp_lora_ckpt").string();
  std::filesystem::remove_all(dir);
  collective::testing::with_world("inproc", 2, [&](int rank, Communicator& w) {
    auto model = make_adapted();
    auto e = wrap(model, borrow(w), S::full_shard);
    ASSERT_TRUE(e);
    for (int s = 0; s < 2; ++s) {
      ASSERT_TRUE(e->begin_forward(ForwardMode::train).ok());
      ASSERT_TRUE(e->backward(loss_of(*model, batch(s, rank, 2))).ok());
      ASSERT_TRUE(e->step().ok());
    }
    ASSERT_TRUE(save_checkpoint(*e, dir).ok());
    auto saved = e->full_state_dict(at::kFloat);
    ASSERT_TRUE(saved.ok());
    // Offload and reload the optimizer: the frozen units have nothing to move.
    ASSERT_TRUE(e->offload_optimizer().ok());
    ASSERT_TRUE(e->load_optimizer().ok());
    auto fresh_model = make_adapted();
    auto fresh = wrap(fresh_model, borrow(w), S::full_shard);
    ASSERT_TRUE(fresh);
    Status st = load_checkpoint(*fresh, dir);
    ASSERT_TRUE(st.ok()) << st.to_string();
    auto loaded = fresh->full_state_dict(at::kFloat);
    ASSERT_TRUE(loaded.ok());
    for (const auto& [name, t] : *saved) EXPECT_TRUE(at::equal(loaded->at(name), t)) << name;
    // The next step is the same in both.
    for (FsdpModule* m : {e.get(), fresh.get()}) {
      ASSERT_TRUE(m->begin_forward(ForwardMode::train).ok());
      ASSERT_TRUE(m->backward(loss_of(static_cast<models::CausalLM&>(m->module()), batch(5, rank, 2))).ok());
      ASSERT_TRUE(m->step().ok());
    }
    auto a = e->full_state_dict(at::kFloat), b = fresh->full_state_dict(at::kFloat);
    for (const auto& [name, t] : *a) EXPECT_TRUE(at::equal(b->at(name), t)) << name;
    // A checkpoint of the adapted model does not load into the plain one.
    auto plain = testing::tiny_decoder("qwen2", 2, 11);
    auto plain_units = make_decoder_units(*plain, WrapPolicy{});
    auto mesh = collective::DeviceMesh::for_fsdp(borrow(w), -1);
    auto pe = FsdpModule::wrap(plain, *plain_units, *mesh, FsdpOptions{}, optim());
    ASSERT_TRUE(pe.ok());
    EXPECT_FALSE(load_checkpoint(**pe, dir).ok());
  });
  std::filesystem::remove_all(dir);
}

// Note [Clean offload], per unit: a step writes the adapters only, so offloading after it copies
// the adapter units back and leaves the frozen base's host buffers alone.
TEST(FsdpLoraUnits, OffloadAfterAStepCopiesTheAdaptersOnly) {
  collective::testing::with_world("inproc", 2, [&](int rank, Communicator& w) {
    auto model = make_adapted();
    auto e = wrap(model, borrow(w), S::full_shard);
    ASSERT_TRUE(e);
    const FsdpModule& view = *e;  // const access: reads that do not mark the shards written
    ASSERT_TRUE(e->offload_params().ok());
    ASSERT_TRUE(e->load_params().ok());
    for (int u = 0; u < 5; ++u) view.unit_state(u).offload_shard.fill_(7.0f);  // markers
    ASSERT_TRUE(e->begin_forward(ForwardMode::train).ok());
    ASSERT_TRUE(e->backward(loss_of(*model, batch(0, rank, 2))).ok());
    ASSERT_TRUE(e->step().ok());
    std::vector<at::Tensor> shards;
    for (int u = 0; u < 5; ++u) shards.push_back(view.unit_state(u).shard.clone());
    ASSERT_TRUE(e->offload_params().ok());
    for (int u = 0; u < 5; ++u) {
      const at::Tensor& host = view.unit_state(u).offload_shard;
      const bool adapters = e->layouts()[static_cast<size_t>(u)].unit.find(".lora") != std::string::npos;
      if (adapters) {
        EXPECT_TRUE(at::equal(host, shards[static_cast<size_t>(u)])) << e->layouts()[static_cast<size_t>(u)].unit;
      } else {
        EXPECT_TRUE(at::equal(host, at::full_like(host, 7.0f))) << e->layouts()[static_cast<size_t>(u)].unit << " copied back";
      }
    }
  });
}

// FsdpOptions::frozen_units_in_param_dtype: the frozen base kept in bf16 (param_dtype) trains
// exactly as the base kept in fp32 and cast at every gather (the same rounding, once), holds half
// the bytes, and its checkpoints load either way.
TEST(FsdpLoraUnits, AFrozenBaseInParamDtypeTrainsBitwiseAsInModelDtype) {
  const std::string dir = (std::filesystem::temp_directory_path() / "tessera_fsdp_lora_bf16_base").string();
  std::filesystem::remove_all(dir);
  collective::testing::with_world("inproc", 2, [&](int rank, Communicator& w) {
    std::vector<std::unique_ptr<FsdpModule>> engines;
    std::vector<std::shared_ptr<models::CausalLM>> models_;
    for (bool in_param_dtype : {false, true}) {
      auto model = make_adapted();
      auto units = make_decoder_units(*model, WrapPolicy{});
      ASSERT_TRUE(units.ok());
      FsdpOptions fo;
      fo.mixed_precision.param_dtype = at::kBFloat16;
      fo.frozen_units_in_param_dtype = in_param_dtype;
      auto mesh = collective::DeviceMesh::for_fsdp(borrow(w), -1);
      auto e = FsdpModule::wrap(model, *units, *mesh, fo, optim());
      ASSERT_TRUE(e.ok()) << e.status().to_string();
      ASSERT_TRUE(install_layer_runner(**e, *model).ok());
      engines.push_back(std::move(*e));
      models_.push_back(model);
    }
    const FsdpModule& bf16 = *engines[1];
    for (size_t u = 0; u < bf16.layouts().size(); ++u) {
      const bool adapters = is_adapter_unit(bf16.layouts()[u]);
      EXPECT_EQ(bf16.shard(static_cast<int>(u)).scalar_type(), adapters ? at::kFloat : at::kBFloat16) << bf16.layouts()[u].unit;
      EXPECT_EQ(engines[0]->shard(static_cast<int>(u)).scalar_type(), at::kFloat);
    }
    EXPECT_LT(engines[1]->resident_bytes(), engines[0]->resident_bytes());
    for (int s = 0; s < 2; ++s) {
      std::vector<double> norms;
      for (size_t k = 0; k < 2; ++k) {
        ASSERT_TRUE(engines[k]->begin_forward(ForwardMode::train).ok());
        ASSERT_TRUE(engines[k]->backward(loss_of(*models_[k], batch(s, rank, 2)).to(at::kFloat)).ok());
        auto r = engines[k]->step();
        ASSERT_TRUE(r.ok());
        norms.push_back(r->grad_norm);
      }
      EXPECT_EQ(norms[0], norms[1]) << "step " << s;
    }
    auto a = engines[0]->full_state_dict(at::kFloat), b = engines[1]->full_state_dict(at::kFloat);
    ASSERT_TRUE(a.ok() && b.ok());
    for (const auto& [name, t] : *a) {
      if (models::is_lora_parameter(name)) {
        EXPECT_TRUE(at::equal(b->at(name), t)) << name;
      } else {  // the bf16 base holds the fp32 base rounded once
        EXPECT_TRUE(at::equal(b->at(name), t.to(at::kBFloat16).to(at::kFloat))) << name;
      }
    }
    // A checkpoint of the bf16 base loads into the fp32-base engine (and back): the adapters
    // exactly, the base in each engine's own dtype.
    ASSERT_TRUE(save_checkpoint(*engines[1], dir).ok());
    ASSERT_TRUE(load_checkpoint(*engines[0], dir).ok());
    auto c = engines[0]->full_state_dict(at::kFloat);
    ASSERT_TRUE(c.ok());
    for (const auto& [name, t] : *b) EXPECT_TRUE(at::equal(c->at(name), t)) << name;
    EXPECT_EQ(engines[0]->shard(0).scalar_type(), at::kFloat);
  });
  std::filesystem::remove_all(dir);
}

TEST(FsdpLoraUnits, AttachmentsMustNameAUnitOfItsOwn) {
  collective::testing::with_world("inproc", 1, [&](int, Communicator& w) {
    auto mesh = collective::DeviceMesh::for_fsdp(borrow(w), -1);
    ASSERT_TRUE(mesh.ok());
    auto try_wrap = [&](std::vector<UnitSpec> units) {
      auto model = make_adapted();
      auto e = FsdpModule::wrap(model, std::move(units), *mesh, FsdpOptions{}, optim());
      return e.ok() ? std::string() : e.status().message();
    };
    auto model = make_adapted();
    auto units = make_decoder_units(*model, WrapPolicy{});
    ASSERT_TRUE(units.ok());
    auto bad = *units;
    bad[1].owner = "model.layers.7";
    EXPECT_NE(try_wrap(bad).find("not a unit of its own"), std::string::npos);
    bad = *units;
    bad[1].owner = "model.layers.0.lora";
    EXPECT_NE(try_wrap(bad).find("not a unit of its own"), std::string::npos);
    bad = *units;
    bad[1].recompute = true;
    EXPECT_NE(try_wrap(bad).find("cannot be recomputed on its own"), std::string::npos);
    // A unit mixing base weights and adapters is refused (frozen and trainable parameters).
    bad = *units;
    bad[0].param_names.insert(bad[0].param_names.end(), bad[1].param_names.begin(), bad[1].param_names.end());
    bad.erase(bad.begin() + 1);
    EXPECT_NE(try_wrap(bad).find("mixes trainable and frozen"), std::string::npos);
  });
}

}  // namespace
}  // namespace tessera::fsdp
