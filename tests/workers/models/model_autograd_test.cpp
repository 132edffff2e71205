// Autograd: a few SGD steps lower the loss on a fixed batch, for the LM and the value head, and
// every parameter receives a gradient.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/workers/models/model_test_util.hpp"
#include "workers/models/model.hpp"

namespace tessera::models {
namespace {

at::Tensor lm_loss(CausalLM& model, const testing::Batch& b) {
  at::Tensor logits = model.forward(b.input_ids, b.attention_mask, b.position_ids);
  const int64_t V = logits.size(-1);
  at::Tensor pred = logits.narrow(1, 0, logits.size(1) - 1).reshape({-1, V});
  at::Tensor target = b.input_ids.narrow(1, 1, b.input_ids.size(1) - 1).reshape(-1);
  at::Tensor mask = b.attention_mask.narrow(1, 1, b.attention_mask.size(1) - 1).reshape(-1).to(at::kFloat);
  at::Tensor nll = torch::nn::functional::cross_entropy(
      pred, target, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  return (nll * mask).sum() / mask.sum();
}

// Every family trains: Qwen2, Mistral (sliding window), Gemma2 (softcaps, sandwich norms, scaled
// tied embeddings) and the MoE families (router, grouped expert GEMMs, shared expert) have finite
// gradients on every parameter, and SGD lowers the loss.
TEST(ModelAutograd, SgdStepsLowerTheLmLoss) {
  for (const char* type : {"qwen2", "mistral", "gemma2", "gemma3_text", "qwen3_moe", "qwen2_moe"}) {
    SCOPED_TRACE(type);
    auto model = CausalLM::create(testing::tiny_config(type, 2), ModelInit{at::kFloat, 3});
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    testing::Batch b = testing::left_padded_batch({8, 6, 3}, 8, 64, 4);
    torch::optim::SGD opt((*model)->parameters(), torch::optim::SGDOptions(0.5));
    double first = 0, last = 0;
    for (int step = 0; step < 8; ++step) {
      opt.zero_grad();
      at::Tensor loss = lm_loss(**model, b);
      loss.backward();
      for (const auto& p : (*model)->named_parameters()) {
        ASSERT_TRUE(p.value().grad().defined()) << p.key();
        ASSERT_TRUE(p.value().grad().isfinite().all().item<bool>()) << p.key();
      }
      if (step == 0) first = loss.item<double>();
      last = loss.item<double>();
      opt.step();
    }
    std::printf("[autograd %s] LM loss %.4f -> %.4f over 8 SGD steps\n", type, first, last);
    EXPECT_LT(last, first - 0.1);
  }
}

TEST(ModelAutograd, SgdStepsLowerTheValueLoss) {
  auto model = ValueModel::create(testing::tiny_config("llama", 2), ModelInit{at::kFloat, 5});
  ASSERT_TRUE(model.ok());
  testing::Batch b = testing::left_padded_batch({6, 4}, 6, 64, 6);
  at::Tensor target = at::linspace(-1, 1, 12).view({2, 6});
  at::Tensor mask = b.attention_mask.to(at::kFloat);
  // lr below 2 / (largest curvature of the score head, about 2 |h|^2 = 2 * hidden) keeps SGD stable.
  torch::optim::SGD opt((*model)->parameters(), torch::optim::SGDOptions(0.02));
  double first = 0, last = 0;
  for (int step = 0; step < 20; ++step) {
    opt.zero_grad();
    at::Tensor v = (*model)->forward(b.input_ids, b.attention_mask, b.position_ids);
    at::Tensor loss = ((v - target).pow(2) * mask).sum() / mask.sum();
    loss.backward();
    if (step == 0) first = loss.item<double>();
    last = loss.item<double>();
    std::printf("%s%.4f", step == 0 ? "[autograd] value loss trajectory: " : " ", last);
    opt.step();
  }
  std::printf("\n[autograd] value loss %.4f -> %.4f over 20 SGD steps\n", first, last);
  EXPECT_LT(last, 0.7 * first);
}

}  // namespace
}  // namespace tessera::models
