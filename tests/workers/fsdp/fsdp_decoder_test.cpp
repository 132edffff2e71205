// The engine on the models helper's HF decoder, wrapped as the workers wrap it
// (make_decoder_units + install_layer_runner): every strategy at world 2 (HYBRID_SHARD at world
// 4) equals single-process training of the same CausalLM (losses, grad norms and parameters
// within 1e-5) with the layer runner active (every layer recomputed in backward), with and without
// forward prefetch; under FULL_SHARD
// each layer is gathered only while it runs (forward, and its recompute in backward) or is
// prefetched for the next one (Note [FSDP overlap]), so right after forward only the root unit is
// gathered, versus every unit under SHARD_GRAD_OP (read from the engine's own state).
// The MoE families (stacked experts viewed out of the flat buffers, the router, Qwen2-MoE's
// shared expert) train the same way under FULL_SHARD and SHARD_GRAD_OP.
#include "tests/workers/fsdp/fsdp_test_util.hpp"
#include "workers/models/model.hpp"

#if TESSERA_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace tessera::fsdp {
namespace {

using collective::Communicator;
using S = ShardingStrategy;

std::shared_ptr<models::CausalLM> make_decoder(const char* family = "llama") {
  return testing::tiny_decoder(family, 2, 11);
}

std::shared_ptr<Communicator> borrow(Communicator& c) {
  return std::shared_ptr<Communicator>(&c, [](Communicator*) {});
}

struct TokenBatch {
  at::Tensor ids, mask, pos;
};

TokenBatch llama_batch(int step, int rank, int world) {
  at::Generator gen = at::detail::createCPUGenerator(500 + step);
  at::Tensor ids = at::randint(32, {4, 7}, gen, at::kLong);
  int64_t n = 4 / world;
  ids = ids.narrow(0, rank * n, n).contiguous();
  return {ids, at::ones_like(ids), at::arange(7, at::kLong).expand({n, 7}).contiguous()};
}

at::Tensor llama_loss(models::CausalLM& m, const TokenBatch& b) {
  at::Tensor logits = m.forward(b.ids, b.mask, b.pos);
  return torch::nn::functional::cross_entropy(logits.narrow(1, 0, 6).reshape({-1, 32}),
                                              b.ids.narrow(1, 1, 6).reshape(-1));
}

OptimizerOptions decoder_optim() {
  OptimizerOptions o = testing::test_optim();
  // HF init gives weights of ~0.02; an lr of 5e-2 would let Adam's normalisation turn fp32
  // summation-order noise in near-zero gradients into lr-sized differences. 1e-3 is still far
  // above verl's defaults (1e-6 actor, 1e-5 critic).
  o.adamw.lr = 1e-3;
  return o;
}

/// The FSDP engine of one rank over `model`, wrapped the way build_fsdp_module wraps decoders.
std::unique_ptr<FsdpModule> wrap_decoder(std::shared_ptr<models::CausalLM> model,
                                         std::shared_ptr<Communicator> world, S strategy,
                                         int fsdp_size = -1, bool forward_prefetch = false,
                                         bool offload_activations = false) {
  auto units = make_decoder_units(*model, WrapPolicy{});
  EXPECT_TRUE(units.ok()) << units.status().to_string();
  FsdpOptions fo;
  fo.strategy = strategy;
  fo.mixed_precision.param_dtype = at::kFloat;
  fo.forward_prefetch = forward_prefetch;
  fo.offload_activations = offload_activations;
  auto mesh = collective::DeviceMesh::for_fsdp(world, fsdp_size);
  EXPECT_TRUE(mesh.ok()) << mesh.status().to_string();
  auto e = FsdpModule::wrap(model, *units, *mesh, fo, decoder_optim());
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  if (!e.ok()) return nullptr;
  Status st = install_layer_runner(**e, *model);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return std::move(*e);
}

/// Single-process LibTorch training of the same model on the whole batch.
testing::RunResult reference_decoder_run(int steps, const char* family) {
  auto ref = make_decoder(family);
  return testing::reference_train(*ref, decoder_optim(), steps,
                                  [&](int s) { return llama_loss(*ref, llama_batch(s, 0, 1)); });
}

struct DecoderCase {
  S strategy;
  int world;
  int fsdp_size;
  bool forward_prefetch = false;
  const char* family = "llama";  ///< qwen3_moe / qwen2_moe: stacked experts in the layer units.
};

class FsdpDecoder : public ::testing::TestWithParam<DecoderCase> {};

TEST_P(FsdpDecoder, CausalLMMatchesSingleProcessWithLayerRunner) {
  constexpr int kSteps = 3;
  const DecoderCase c = GetParam();
  testing::RunResult want = reference_decoder_run(kSteps, c.family);
  collective::testing::with_world("inproc", c.world, [&](int rank, Communicator& w) {
    auto model = make_decoder(c.family);
    auto e = wrap_decoder(model, borrow(w), c.strategy, c.fsdp_size, c.forward_prefetch);
    ASSERT_TRUE(e);
    ASSERT_EQ(e->layouts().size(), 3u);
    EXPECT_EQ(e->layouts()[0].unit, "model.layers.0");
    EXPECT_EQ(e->layouts()[2].unit, "root");
    ASSERT_TRUE(model->backbone().layer_runner());
    testing::expect_training_matches(*e, w, want, [&](int s) { return llama_loss(*model, llama_batch(s, rank, c.world)); });
    auto got = e->full_state_dict(at::kFloat);
    ASSERT_TRUE(got.ok());
    EXPECT_LE(testing::max_relative_error(*got, want.params), 1e-5);
  });
}

INSTANTIATE_TEST_SUITE_P(Strategies, FsdpDecoder,
                         ::testing::Values(DecoderCase{S::full_shard, 2, -1}, DecoderCase{S::full_shard, 2, -1, true},
                                           DecoderCase{S::shard_grad_op, 2, -1}, DecoderCase{S::no_shard, 2, -1},
                                           DecoderCase{S::hybrid_shard, 4, 2},
                                           DecoderCase{S::hybrid_shard, 4, 2, true},
                                           DecoderCase{S::full_shard, 2, -1, true, "qwen3_moe"},
                                           DecoderCase{S::shard_grad_op, 2, -1, false, "qwen2_moe"}),
                         [](const ::testing::TestParamInfo<DecoderCase>& info) {
                           return std::string(to_string(info.param.strategy)) + "_world" + std::to_string(info.param.world) +
                                  (info.param.forward_prefetch ? "_prefetch" : "") +
                                  (std::string(info.param.family) == "llama" ? "" : "_" + std::string(info.param.family));
                         });

// Wraps the installed runner so every layer call records which units are gathered while it runs.
void record_gathered_in_calls(FsdpModule& e, models::CausalLM& model, std::vector<std::vector<int>>& log) {
  models::LayerRunner inner = model.backbone().layer_runner();
  model.backbone().set_layer_runner([inner, &e, &log](int64_t i, models::LayerCall call, const at::Tensor& h) {
    return inner(i, [call, &e, &log](const at::Tensor& x) {
      log.push_back(e.gathered_units());
      return call(x);
    }, h);
  });
}

TEST(FsdpDecoderMemory, FullShardGathersALayerAndItsPrefetchShardGradOpKeepsThemAll) {
  using V = std::vector<int>;
  collective::testing::with_world("inproc", 2, [&](int rank, Communicator& w) {
    for (S strategy : {S::full_shard, S::shard_grad_op}) {
      for (bool prefetch : {false, true}) {
        SCOPED_TRACE(::testing::Message() << to_string(strategy) << " forward_prefetch=" << prefetch);
        auto model = make_decoder();
        auto e = wrap_decoder(model, borrow(w), strategy, -1, prefetch);
        ASSERT_TRUE(e);
        std::vector<V> log;
        record_gathered_in_calls(*e, *model, log);
        ASSERT_TRUE(e->begin_forward(ForwardMode::train).ok());
        at::Tensor loss = llama_loss(*model, llama_batch(0, rank, 2));
        const V after_forward = e->gathered_units();
        ASSERT_TRUE(e->backward(loss).ok());
        EXPECT_TRUE(e->gathered_units().empty());
        if (strategy == S::full_shard) {
          EXPECT_EQ(after_forward, (V{2})) << "only the root stays gathered";
          // Forward: layer 0 (with layer 1 prefetched when asked), layer 1; backward recomputes
          // layer 1 with layer 0 prefetched, then layer 0: at most two layers at a time.
          const V first = prefetch ? V{0, 1, 2} : V{0, 2};
          EXPECT_EQ(log, (std::vector<V>{first, {1, 2}, {0, 1, 2}, {0, 2}}));
        } else {
          EXPECT_EQ(after_forward, (V{0, 1, 2}));
          // Forward keeps every layer; backward recomputes layer 1, then layer 0 (no second
          // gather), each layer freed once its backward is done.
          EXPECT_EQ(log, (std::vector<V>{{0, 1, 2}, {0, 1, 2}, {0, 1, 2}, {0, 2}}));
        }
        // Eval: under FULL_SHARD each layer is freed after its forward too; end_forward() frees
        // what stays gathered (the root; every unit under SHARD_GRAD_OP).
        log.clear();
        ASSERT_TRUE(e->begin_forward(ForwardMode::eval).ok());
        {
          torch::NoGradGuard no_grad;
          llama_loss(*model, llama_batch(1, rank, 2));
        }
        if (strategy == S::full_shard) {
          EXPECT_EQ(log, (std::vector<V>{prefetch ? V{0, 1, 2} : V{0, 2}, {1, 2}}));
        }
        EXPECT_EQ(e->gathered_units(), strategy == S::full_shard ? V({2}) : V({0, 1, 2}));
        ASSERT_TRUE(e->end_forward().ok());
        EXPECT_TRUE(e->gathered_units().empty());
      }
    }
  });
}

// verl configs name HF's layer classes (their _no_split_modules): each MoE family's matches
// Tessera's DecoderLayer, one unit per layer.
TEST(FsdpDecoderUnits, HfMoeLayerClassNamesWrapEachLayer) {
  for (const char* family : {"qwen3_moe", "qwen2_moe"}) {
    auto model = make_decoder(family);
    WrapPolicy policy;
    policy.transformer_layer_cls_to_wrap = {std::string(family) == "qwen3_moe" ? "Qwen3MoeDecoderLayer"
                                                                               : "Qwen2MoeDecoderLayer"};
    auto units = make_decoder_units(*model, policy);
    ASSERT_TRUE(units.ok()) << units.status().to_string();
    ASSERT_EQ(units->size(), 3u) << family;
    EXPECT_TRUE((*units)[0].recompute);
  }
}

// Every whole decoder layer is recomputed in backward (activation checkpointing), whatever the
// strategy: FULL_SHARD and HYBRID_SHARD also free it after forward (FsdpDecoderMemory above),
// SHARD_GRAD_OP and NO_SHARD keep it gathered and recompute it without a second gather (the
// strategies' training equals the single process's: FsdpDecoder).
TEST(FsdpDecoderUnits, EveryWholeDecoderLayerIsRecomputed) {
  auto model = make_decoder();
  auto all = make_decoder_units(*model, WrapPolicy{});
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 3u);
  EXPECT_TRUE((*all)[0].recompute);
  EXPECT_TRUE((*all)[1].recompute);
  EXPECT_FALSE((*all)[2].recompute);
  // A size-based policy that cuts a layer apart: no unit is a whole layer, none is recomputed.
  WrapPolicy by_size;
  by_size.min_num_params = 300;
  auto units = make_decoder_units(*model, by_size);
  ASSERT_TRUE(units.ok());
  bool any_layer_part = false;
  for (const auto& u : *units) {
    EXPECT_FALSE(u.recompute) << u.name;
    any_layer_part |= u.name.rfind("model.layers.0.", 0) == 0;
  }
  EXPECT_TRUE(any_layer_part);
}

TEST(FsdpDecoderRunner, ErrorsNameTheLayerAndOutlivingTheEngineFailsCleanly) {
  collective::testing::with_world("inproc", 1, [&](int, Communicator& w) {
    auto model = make_decoder();
    auto e = wrap_decoder(model, borrow(w), S::full_shard);
    ASSERT_TRUE(e);
    auto other = make_decoder();
    Status st = install_layer_runner(*e, *other);
    EXPECT_NE(st.message().find("does not wrap this model"), std::string::npos) << st.message();
    // The runner as the backbone calls it (a forward would fail earlier, at the empty embedding).
    models::LayerRunner runner = model->backbone().layer_runner();
    ASSERT_TRUE(runner);
    at::Tensor h = at::zeros({1, 7, 16});
    models::LayerCall identity = [](const at::Tensor& x) { return x; };
    try {  // without begin_forward(), run_unit refuses; the error names the layer
      runner(0, identity, h);
      ADD_FAILURE() << "a layer call without begin_forward did not fail";
    } catch (const std::exception& ex) {
      std::string what = ex.what();
      EXPECT_NE(what.find("decoder layer 0"), std::string::npos) << what;
      EXPECT_NE(what.find("begin_forward"), std::string::npos) << what;
    }
    e.reset();  // the model outlives its engine
    try {
      runner(1, identity, h);
      ADD_FAILURE() << "a layer call after the engine was destroyed did not fail";
    } catch (const std::exception& ex) {
      EXPECT_NE(std::string(ex.what()).find("was destroyed"), std::string::npos) << ex.what();
    }
  });
}

// Note [Activation offload]: on a GPU, training whose recomputed layers park their inputs in host
// memory takes the same steps, bit for bit, as training that keeps them on the device (the values
// only travel), under every strategy (SHARD_GRAD_OP and NO_SHARD recompute without freeing), with
// two micro-batches accumulated per step; the strategies agree with each other; on the CPU, where
// the inputs stay in their slots as they are, the slots' bookkeeping runs through the same steps.
void expect_offloaded_activations_train_alike(const c10::Device& device) {
  collective::testing::with_world("inproc", 1, [&](int, Communicator& w) {
    std::map<std::string, at::Tensor> first;
    for (S strategy : {S::full_shard, S::shard_grad_op, S::no_shard}) {
      SCOPED_TRACE(to_string(strategy));
      std::vector<std::map<std::string, at::Tensor>> after;
      for (bool offload : {false, true}) {
        auto model = make_decoder();
        model->to(device);
        auto e = wrap_decoder(model, borrow(w), strategy, -1, false, offload);
        ASSERT_TRUE(e);
        for (int s = 0; s < 3; ++s) {
          for (int micro = 0; micro < 2; ++micro) {
            TokenBatch b = llama_batch(2 * s + micro, 0, 1);
            b = {b.ids.to(device), b.mask.to(device), b.pos.to(device)};
            ASSERT_TRUE(e->begin_forward(ForwardMode::train).ok());
            ASSERT_TRUE(e->backward(llama_loss(*model, b) * 0.5).ok());
          }
          ASSERT_TRUE(e->step().ok());
        }
        auto state = e->full_state_dict(at::kFloat);
        ASSERT_TRUE(state.ok());
        after.push_back(*state);
      }
      for (const auto& [name, t] : after[0]) EXPECT_TRUE(at::equal(after[1].at(name).cpu(), t.cpu())) << name;
      if (first.empty()) first = after[0];
      for (const auto& [name, t] : first) {
        EXPECT_LE((after[0].at(name).cpu() - t.cpu()).abs().max().item<double>(), 1e-6) << name;
      }
    }
  });
}

TEST(FsdpDecoderActivationOffload, ParkedLayerInputsTrainAsResidentOnes) {
  expect_offloaded_activations_train_alike(c10::Device(c10::DeviceType::CPU));
}

TEST(FsdpDecoderActivationOffload, OnCudaParkedLayerInputsTrainAsResidentOnes) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU here";
  expect_offloaded_activations_train_alike(c10::Device("cuda:0"));
}

#if TESSERA_WITH_CUDA
// What the option is for: right after a training forward of 6 layers over 4096 tokens (8 MB a
// layer input), the device holds at least 4 layer inputs fewer than without it (the last layer's
// input stays, as verl keeps it), and backward still trains alike, to the bit. The resident run
// goes twice: should the offloaded run differ, the first comparison says whether the resident path
// itself repeats to the bit at this size.
TEST(FsdpDecoderActivationOffload, OnCudaLayerInputsLeaveTheDeviceDuringForward) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU here";
  const c10::Device cuda("cuda:0");
  models::ModelConfig c = testing::tiny_decoder_config("llama", 6);
  c.hidden_size = 512;
  c.intermediate_size = 1024;
  c.head_dim = 128;
  c.max_position_embeddings = 1024;
  const int64_t rows = 8, tokens = 512, input_bytes = rows * tokens * c.hidden_size * 4;
  at::Generator gen = at::detail::createCPUGenerator(5);
  const at::Tensor ids = at::randint(c.vocab_size, {rows, tokens}, gen, at::kLong).to(cuda);
  const at::Tensor mask = at::ones_like(ids), pos = at::arange(tokens, ids.options()).expand({rows, tokens}).contiguous();
  collective::testing::with_world("inproc", 1, [&](int, Communicator& w) {
    std::vector<int64_t> after_forward;
    std::vector<std::map<std::string, at::Tensor>> states;
    for (bool offload : {false, false, true}) {
      auto model = models::CausalLM::create(c, models::ModelInit{at::kFloat, 3});
      ASSERT_TRUE(model.ok()) << model.status().to_string();
      (*model)->to(cuda);
      auto e = wrap_decoder(*model, borrow(w), S::full_shard, -1, false, offload);
      ASSERT_TRUE(e);
      ASSERT_TRUE(e->begin_forward(ForwardMode::train).ok());
      at::Tensor logits = (*model)->forward(ids, mask, pos);
      at::Tensor loss = torch::nn::functional::cross_entropy(logits.narrow(1, 0, tokens - 1).reshape({-1, c.vocab_size}),
                                                             ids.narrow(1, 1, tokens - 1).reshape(-1));
      torch::cuda::synchronize();
      const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
      after_forward.push_back(stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current);
      ASSERT_TRUE(e->backward(loss).ok());
      ASSERT_TRUE(e->step().ok());
      auto state = e->full_state_dict(at::kFloat);
      ASSERT_TRUE(state.ok());
      // On the host, so that an earlier run's weights do not count in a later run's device memory.
      for (auto& [name, t] : *state) t = t.cpu();
      states.push_back(*state);
    }
    // Against the second resident run, so that what the first set up once counts on both sides.
    EXPECT_GE(after_forward[1] - after_forward[2], 4 * input_bytes)
        << "without offload " << after_forward[1] << " bytes, with " << after_forward[2];
    for (const auto& [name, t] : states[0]) {
      EXPECT_TRUE(at::equal(states[1].at(name), t)) << name << ": the resident run does not repeat itself";
      EXPECT_TRUE(at::equal(states[2].at(name), t)) << name;
    }
  });
}
#endif

}  // namespace
}  // namespace tessera::fsdp
