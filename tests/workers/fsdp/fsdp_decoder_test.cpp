// The engine on the models helper's HF decoder, unchanged: default wrap policy (one unit per
// DecoderLayer plus the root), FULL_SHARD at world 2 equals single-process training of the same
// CausalLM (losses, grad norms and parameters within 1e-5).
#include "tests/workers/fsdp/fsdp_test_util.hpp"
#include "workers/models/model.hpp"

namespace tessera::fsdp {
namespace {

models::ModelConfig tiny_llama() {
  models::ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.model_type = "llama";
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 64;
  c.head_dim = 4;
  return c;
}

std::shared_ptr<models::CausalLM> make_llama() {
  models::ModelInit init;
  init.seed = 11;
  auto m = models::CausalLM::create(tiny_llama(), init);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return *m;
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

TEST(FsdpDecoder, CausalLMFullShardMatchesSingleProcess) {
  constexpr int kSteps = 3;
  OptimizerOptions o = testing::test_optim();
  // HF init gives weights of ~0.02; an lr of 5e-2 would let Adam's normalisation turn fp32
  // summation-order noise in near-zero gradients into lr-sized differences. 1e-3 is still far
  // above verl's defaults (1e-6 actor, 1e-5 critic).
  o.adamw.lr = 1e-3;
  // Reference.
  auto ref = make_llama();
  torch::optim::AdamW opt(ref->parameters(), torch::optim::AdamWOptions(o.adamw.lr)
                                                 .betas({o.adamw.beta1, o.adamw.beta2})
                                                 .eps(o.adamw.eps)
                                                 .weight_decay(o.adamw.weight_decay));
  LrScheduler schedule(o.adamw.lr, o.schedule);
  std::vector<double> want_loss, want_norm;
  for (int s = 0; s < kSteps; ++s) {
    opt.zero_grad();
    at::Tensor loss = llama_loss(*ref, llama_batch(s, 0, 1));
    loss.backward();
    want_norm.push_back(torch::nn::utils::clip_grad_norm_(ref->parameters(), o.clip_grad));
    for (auto& g : opt.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(schedule.current_lr());
    opt.step();
    schedule.step();
    want_loss.push_back(loss.item<double>());
  }
  std::map<std::string, at::Tensor> want;
  for (const auto& item : ref->named_parameters()) want[item.key()] = item.value().detach();

  collective::testing::with_world("inproc", 2, [&](int rank, collective::Communicator& w) {
    auto world = std::shared_ptr<collective::Communicator>(&w, [](collective::Communicator*) {});
    auto model = make_llama();
    auto units = make_units(*model, WrapPolicy{});
    ASSERT_TRUE(units.ok());
    ASSERT_EQ(units->size(), 3u);
    EXPECT_EQ((*units)[0].name, "model.layers.0");
    EXPECT_EQ((*units)[2].name, "root");
    FsdpOptions fo;
    fo.mixed_precision.param_dtype = at::kFloat;
    auto e = FsdpModule::wrap(model, *units, *collective::DeviceMesh::for_fsdp(world, -1), fo, o);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    for (int s = 0; s < kSteps; ++s) {
      ASSERT_TRUE((*e)->begin_forward(ForwardMode::train).ok());
      at::Tensor loss = llama_loss(*model, llama_batch(s, rank, 2));
      at::Tensor l = at::tensor({loss.item<double>()}, at::kDouble);
      ASSERT_TRUE((*e)->backward(loss).ok());
      auto r = (*e)->step();
      ASSERT_TRUE(r.ok());
      (*e)->lr_scheduler_step();
      ASSERT_TRUE(w.all_reduce(l, collective::ReduceOp::avg).ok());
      EXPECT_NEAR(l.item<double>(), want_loss[s], 1e-5 * want_loss[s]) << "step " << s;
      EXPECT_NEAR(r->grad_norm, want_norm[s], 1e-5 * want_norm[s]) << "step " << s;
    }
    auto got = (*e)->full_state_dict(at::kFloat);
    ASSERT_TRUE(got.ok());
    EXPECT_LE(testing::max_relative_error(*got, want), 1e-5);
  });
}

}  // namespace
}  // namespace tessera::fsdp
