// fsdp_test_util.hpp: a small transformer-ish LM, its data, a single-process reference trainer
// (plain LibTorch + torch::optim::AdamW + clip_grad_norm_), and an FSDP trainer per rank.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/collective/communicator.hpp"
#include "runtime/collective/device_mesh.hpp"
#include "tests/runtime/collective/collective_test_util.hpp"
#include "workers/fsdp/fsdp_module.hpp"
#include "workers/fsdp/optim.hpp"
#include "workers/fsdp/units.hpp"
#include "workers/models/config.hpp"
#include "workers/models/model.hpp"

namespace tessera::fsdp::testing {

constexpr int64_t kVocab = 11, kDim = 6, kSeq = 5, kGlobalBatch = 8, kLayers = 2;

/// A tiny HF decoder config (vocab 32, hidden 16, 4 heads over 2 KV heads of dim 4, 64 positions)
/// of `model_type` "llama" or "qwen2" (q/k/v biases) with `layers` decoder layers.
inline models::ModelConfig tiny_decoder_config(const std::string& model_type, int64_t layers) {
  models::ModelConfig c;
  c.architecture = model_type == "qwen2" ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
  c.model_type = model_type;
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 64;
  c.head_dim = 4;
  c.attention_bias = model_type == "qwen2" || model_type == "qwen2_moe";
  if (model_type == "qwen3_moe" || model_type == "qwen2_moe") {  // 4 experts of width 8, top 2
    c.moe.num_experts = 4;
    c.moe.num_experts_per_tok = 2;
    c.moe.moe_intermediate_size = 8;
    c.moe.norm_topk_prob = model_type == "qwen3_moe";
    if (model_type == "qwen2_moe") c.moe.shared_expert_intermediate_size = 8;
  }
  return c;
}

/// A CausalLM of tiny_decoder_config(model_type, layers) from models' HF init seeded with `seed`.
inline std::shared_ptr<models::CausalLM> tiny_decoder(const std::string& model_type, int64_t layers, uint64_t seed) {
  models::ModelInit init;
  init.seed = seed;
  auto m = models::CausalLM::create(tiny_decoder_config(model_type, layers), init);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return *m;
}

/// Pre-norm residual MLP block (a "decoder layer" stand-in).
struct TinyBlockImpl : torch::nn::Module {
  TinyBlockImpl() {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
    fc1 = register_module("fc1", torch::nn::Linear(kDim, 2 * kDim));
    fc2 = register_module("fc2", torch::nn::Linear(2 * kDim, kDim));
  }
  at::Tensor forward(const at::Tensor& x) { return x + fc2(torch::gelu(fc1(norm(x)))); }
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(TinyBlock);

/// Runs block i on h, possibly through FsdpModule::run_unit.
using LayerRunner = std::function<at::Tensor(int, const TinyBlock&, const at::Tensor&)>;

/// Embedding -> kLayers blocks -> final norm -> head; parameters named like a decoder.
struct TinyLM : torch::nn::Module {
  TinyLM() {
    embed = register_module("embed", torch::nn::Embedding(kVocab, kDim));
    layers = register_module("layers", torch::nn::ModuleList());
    for (int i = 0; i < kLayers; ++i) {
      blocks.push_back(TinyBlock());
      layers->push_back(blocks.back());
    }
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
    head = register_module("head", torch::nn::Linear(kDim, kVocab));
    register_buffer("scale", at::ones({1}, at::kDouble));  // exercises buffer_dtype
  }
  at::Tensor forward(const at::Tensor& ids, const LayerRunner& runner = nullptr) {
    at::Tensor h = embed(ids);
    for (int i = 0; i < kLayers; ++i) h = runner ? runner(i, blocks[i], h) : blocks[i]->forward(h);
    return head(norm(h));
  }
  torch::nn::Embedding embed{nullptr};
  torch::nn::ModuleList layers{nullptr};
  std::vector<TinyBlock> blocks;
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear head{nullptr};
};

/// A TinyLM with deterministic parameters (its own generator, no global RNG: thread-safe).
inline std::shared_ptr<TinyLM> make_model(uint64_t seed = 1234) {
  auto m = std::make_shared<TinyLM>();
  at::Generator gen = at::detail::createCPUGenerator(seed);
  torch::NoGradGuard no_grad;
  for (auto& p : m->parameters()) p.copy_(at::randn(p.sizes(), gen) * 0.5);
  return m;
}

/// Token ids and next-token targets of step `step` for the whole global batch.
struct Batch {
  at::Tensor ids, targets;
  Batch slice(int rank, int world) const {
    int64_t n = kGlobalBatch / world;
    return {ids.narrow(0, rank * n, n), targets.narrow(0, rank * n, n)};
  }
};
inline Batch make_batch(int step) {
  at::Generator gen = at::detail::createCPUGenerator(9000 + step);
  at::Tensor tokens = at::randint(kVocab, {kGlobalBatch, kSeq + 1}, gen, at::kLong);
  return {tokens.narrow(1, 0, kSeq).contiguous(), tokens.narrow(1, 1, kSeq).contiguous()};
}

inline at::Tensor lm_loss(const at::Tensor& logits, const at::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, kVocab}), targets.reshape(-1));
}

inline OptimizerOptions test_optim() {
  OptimizerOptions o;
  o.adamw.lr = 5e-2;
  o.adamw.weight_decay = 0.1;
  o.adamw.beta2 = 0.99;
  o.clip_grad = 0.5;  // small enough that clipping is active in some steps
  o.schedule.kind = LrScheduleKind::cosine;
  o.schedule.warmup_steps = 1;
  o.schedule.total_training_steps = 6;
  o.schedule.min_lr_ratio = 0.1;
  return o;
}

/// What a run produced: the global loss of each step and the final parameters.
struct RunResult {
  std::vector<double> losses;
  std::vector<double> grad_norms;  ///< Global norm before clipping (catches gradient scale errors,
                                   ///< which AdamW's scale invariance would hide).
  std::map<std::string, at::Tensor> params;
};

/// Single-process LibTorch training of `model`: `steps` steps of torch::optim::AdamW (o.adamw),
/// each on loss_at(step), with clip_grad_norm_(o.clip_grad) and o's lr schedule; records the
/// losses, the pre-clip gradient norms and the final parameters.
template <class Model>
RunResult reference_train(Model& model, const OptimizerOptions& o, int steps,
                          const std::function<at::Tensor(int step)>& loss_at) {
  torch::optim::AdamW opt(model.parameters(), torch::optim::AdamWOptions(o.adamw.lr)
                                                  .betas({o.adamw.beta1, o.adamw.beta2})
                                                  .eps(o.adamw.eps)
                                                  .weight_decay(o.adamw.weight_decay));
  LrScheduler schedule(o.adamw.lr, o.schedule);
  RunResult r;
  for (int s = 0; s < steps; ++s) {
    opt.zero_grad();
    at::Tensor loss = loss_at(s);
    loss.backward();
    r.grad_norms.push_back(torch::nn::utils::clip_grad_norm_(model.parameters(), o.clip_grad));
    for (auto& group : opt.param_groups()) {
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(schedule.current_lr());
    }
    opt.step();
    schedule.step();
    r.losses.push_back(loss.item<double>());
  }
  for (const auto& item : model.named_parameters()) r.params[item.key()] = item.value().detach().clone();
  return r;
}

/// The single-process reference: plain LibTorch on the whole global batch.
inline RunResult reference_run(int steps, const OptimizerOptions& o = test_optim()) {
  auto model = make_model();
  return reference_train(*model, o, steps, [&](int s) {
    Batch b = make_batch(s);
    return lm_loss(model->forward(b.ids), b.targets);
  });
}

/// Builds the FSDP engine of one rank over `world` for `strategy` (mesh from fsdp_size), with the
/// model on `device`.
inline std::unique_ptr<FsdpModule> make_engine(std::shared_ptr<collective::Communicator> world,
                                               ShardingStrategy strategy, bool recompute,
                                               int fsdp_size = -1,
                                               c10::ScalarType param_dtype = at::kFloat,
                                               const OptimizerOptions& o = test_optim(),
                                               bool optimizer_offload = false,
                                               c10::Device device = c10::Device(c10::DeviceType::CPU)) {
  auto model = make_model();
  model->to(device);
  auto mesh = collective::DeviceMesh::for_fsdp(world, fsdp_size);
  EXPECT_TRUE(mesh.ok()) << mesh.status().to_string();
  WrapPolicy policy;
  policy.transformer_layer_cls_to_wrap = {"TinyBlockImpl"};
  auto units = make_units(*model, policy, recompute);
  EXPECT_TRUE(units.ok()) << units.status().to_string();
  FsdpOptions options;
  options.strategy = strategy;
  options.mixed_precision.param_dtype = param_dtype;
  options.optimizer_offload = optimizer_offload;
  auto engine = FsdpModule::wrap(model, *units, *mesh, options, o);
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  return engine.ok() ? std::move(*engine) : nullptr;
}

inline TinyLM& model_of(FsdpModule& e) { return static_cast<TinyLM&>(e.module()); }

/// One FSDP training step on this rank's slice; returns the global (rank-averaged) loss.
inline double fsdp_step(FsdpModule& e, collective::Communicator& world, int step,
                        bool use_runner, StepResult* result = nullptr, double loss_scale = 1.0) {
  Batch b = make_batch(step).slice(world.rank(), world.size());
  EXPECT_TRUE(e.begin_forward(ForwardMode::train).ok());
  LayerRunner runner = [&](int i, const TinyBlock& block, const at::Tensor& h) {
    TinyBlock blk = block;  // captured by value: kept until backward
    auto out = e.run_unit(i, [blk](const at::Tensor& x) mutable { return blk->forward(x); }, h);
    EXPECT_TRUE(out.ok()) << out.status().to_string();
    return *out;
  };
  at::Tensor loss = lm_loss(model_of(e).forward(b.ids, use_runner ? runner : nullptr), b.targets) * loss_scale;
  double local = loss.item<double>();
  Status st = e.backward(loss);
  EXPECT_TRUE(st.ok()) << st.to_string();
  auto r = e.step();
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (result && r.ok()) *result = *r;
  e.lr_scheduler_step();
  at::Tensor l = at::tensor({local}, at::kDouble);
  EXPECT_TRUE(world.all_reduce(l, collective::ReduceOp::avg).ok());
  return l.item<double>();
}

/// Trains `e` (a decoder wrapped with its layer runner) for want.losses.size() steps, step s on
/// loss_at(s), this rank's share of the batch: the rank-averaged losses and the grad norms equal
/// `want`'s within 1e-5 (relative), and so do the final parameters.
inline void expect_training_matches(FsdpModule& e, collective::Communicator& w, const RunResult& want,
                                    const std::function<at::Tensor(int step)>& loss_at) {
  for (int s = 0; s < static_cast<int>(want.losses.size()); ++s) {
    ASSERT_TRUE(e.begin_forward(ForwardMode::train).ok());
    at::Tensor loss = loss_at(s);
    at::Tensor l = at::tensor({loss.item<double>()}, at::kDouble);
    Status st = e.backward(loss);
    ASSERT_TRUE(st.ok()) << st.to_string();
    auto r = e.step();
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    e.lr_scheduler_step();
    ASSERT_TRUE(w.all_reduce(l, collective::ReduceOp::avg).ok());
    EXPECT_NEAR(l.item<double>(), want.losses[s], 1e-5 * want.losses[s]) << "step " << s;
    EXPECT_NEAR(r->grad_norm, want.grad_norms[s], 1e-5 * want.grad_norms[s]) << "step " << s;
  }
}

/// Max |a - b| / max |b| over every parameter (the "relative" of the equivalence tests).
inline double max_relative_error(const std::map<std::string, at::Tensor>& got,
                                 const std::map<std::string, at::Tensor>& want) {
  double worst = 0;
  for (const auto& [name, w] : want) {
    auto it = got.find(name);
    if (it == got.end()) return INFINITY;
    double denom = std::max(w.abs().max().item<double>(), 1e-12);
    worst = std::max(worst, (it->second.to(at::kFloat) - w).abs().max().item<double>() / denom);
  }
  return worst;
}

}  // namespace tessera::fsdp::testing
