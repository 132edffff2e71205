// GQA, q/k/v bias and tied-embedding variants against an independent reference forward, plus the
// parameter-swapping contract (Note [Swapping parameters]).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/workers/models/model_test_util.hpp"
#include "workers/models/model.hpp"
#include "workers/models/model_io.hpp"
#include "workers/models/safetensors.hpp"

namespace tessera::models {
namespace {

constexpr double kTolerance = 1e-5;

std::shared_ptr<CausalLM> make(const ModelConfig& c, uint64_t seed) {
  auto m = CausalLM::create(c, ModelInit{at::kFloat, seed});
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  testing::randomise(**m, seed);
  return *m;
}

double diff_vs_reference(CausalLM& model, uint64_t seed) {
  testing::Batch b = testing::left_padded_batch({8, 5, 2}, 8, model.config().vocab_size, seed);
  torch::NoGradGuard no_grad;
  at::Tensor got = model.forward(b.input_ids, b.attention_mask, b.position_ids);
  at::Tensor want = testing::reference_logits(model.parameter_map(), model.config(), b);
  return testing::masked_max_diff(got, want, b.attention_mask);
}

TEST(ModelVariants, GqaEqualsReferenceWithKvHeadsExpandedByHand) {
  for (int64_t kv : {4, 2, 1}) {
    auto model = make(testing::tiny_config("llama", kv), 100 + kv);
    EXPECT_EQ(model->parameter_map().at("model.layers.1.self_attn.v_proj.weight").size(0), kv * 8);
    double d = diff_vs_reference(*model, 5);
    std::printf("[gqa kv_heads=%ld] max |ours - reference| = %.3g\n", kv, d);
    EXPECT_LT(d, kTolerance);
  }
}

TEST(ModelVariants, QkvBiasIsUsedAndNamedLikeHf) {
  ModelConfig llama_bias = testing::tiny_config("llama");
  llama_bias.attention_bias = true;
  for (const ModelConfig& c : {testing::tiny_config("qwen2", 2), llama_bias}) {
    auto model = make(c, 9);
    TensorMap p = model->parameter_map();
    for (const char* n : {"q_proj", "k_proj", "v_proj"}) {
      EXPECT_EQ(p.count(std::string("model.layers.0.self_attn.") + n + ".bias"), 1u) << n;
    }
    EXPECT_EQ(p.count("model.layers.0.self_attn.o_proj.bias"), 0u);
    double d = diff_vs_reference(*model, 6);
    std::printf("[bias %s] max |ours - reference| = %.3g\n", c.model_type.c_str(), d);
    EXPECT_LT(d, kTolerance);
    // The bias matters: zeroing it changes the logits.
    at::Tensor before = model->forward(at::ones({1, 3}, at::kLong), at::ones({1, 3}, at::kLong),
                                       at::arange(3, at::kLong).unsqueeze(0));
    torch::NoGradGuard g;
    model->parameter_map().at("model.layers.0.self_attn.v_proj.bias").zero_();
    at::Tensor after = model->forward(at::ones({1, 3}, at::kLong), at::ones({1, 3}, at::kLong),
                                      at::arange(3, at::kLong).unsqueeze(0));
    EXPECT_GT((before - after).abs().max().item<double>(), 1e-4);
  }
}

TEST(ModelVariants, TiedHeadAliasesEmbeddingAndIsNotSaved) {
  auto model = make(testing::tiny_config("qwen2", 2, /*tied=*/true), 4);
  TensorMap p = model->parameter_map();
  EXPECT_EQ(p.count("lm_head.weight"), 0u);
  EXPECT_EQ(model->lm_head_weight().data_ptr(), p.at("model.embed_tokens.weight").data_ptr());
  EXPECT_LT(diff_vs_reference(*model, 8), kTolerance);
  testing::TempDir dir;
  ASSERT_TRUE(save_pretrained(*model, dir.path()).ok());
  auto file = read_safetensors(dir / "model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  EXPECT_EQ(file->tensors.count("lm_head.weight"), 0u);
  EXPECT_EQ(file->tensors.size(), p.size());
  auto reloaded = load_causal_lm(dir.path());
  ASSERT_TRUE(reloaded.ok()) << reloaded.status().to_string();
  EXPECT_TRUE((*reloaded)->config().tie_word_embeddings);
  EXPECT_EQ((*reloaded)->lm_head_weight().data_ptr(),
            (*reloaded)->parameter_map().at("model.embed_tokens.weight").data_ptr());
}

TEST(ModelVariants, UntiedCheckpointWithoutLmHeadIsAnError) {
  auto model = make(testing::tiny_config("llama"), 2);
  testing::TempDir dir;
  ASSERT_TRUE(save_pretrained(*model, dir.path()).ok());
  TensorMap t = model->parameter_map();
  t.erase("lm_head.weight");
  ASSERT_TRUE(write_safetensors(dir / "model.safetensors", t).ok());
  auto r = load_causal_lm(dir.path());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'lm_head.weight' missing"), std::string::npos) << r.status().to_string();
  EXPECT_NE(r.status().message().find(dir.path()), std::string::npos);
}

TEST(ModelSwap, SetParameterAliasesWithoutCopy) {
  auto model = make(testing::tiny_config("qwen2", 2), 1);
  at::Tensor replacement = at::randn({64, 32});
  ASSERT_TRUE(model->set_parameter("model.embed_tokens.weight", replacement).ok());
  at::Tensor param = model->parameter_map().at("model.embed_tokens.weight");
  EXPECT_EQ(param.data_ptr(), replacement.data_ptr());
  EXPECT_EQ(model->backbone().embed_tokens->weight.data_ptr(), replacement.data_ptr());
  EXPECT_TRUE(param.requires_grad());
  // A write through the external tensor is seen by the model.
  replacement.mul_(0);
  at::Tensor h = model->backbone().embed_tokens->forward(at::tensor({3}, at::kLong));
  EXPECT_EQ(h.abs().sum().item<double>(), 0.0);
  Status wrong_shape = model->set_parameter("model.norm.weight", at::ones({31}));
  EXPECT_EQ(wrong_shape.code(), ErrorCode::invalid_argument);
  EXPECT_NE(wrong_shape.message().find("model.norm.weight"), std::string::npos);
  EXPECT_EQ(model->set_parameter("model.nope.weight", at::ones({1})).code(), ErrorCode::not_found);
}

TEST(ModelSwap, FromParametersBuildsOnGivenTensors) {
  auto source = make(testing::tiny_config("llama", 2), 3);
  TensorMap tensors;
  for (const auto& [name, t] : source->parameter_map()) tensors.emplace(name, t.detach().clone());
  auto model = CausalLM::from_parameters(source->config(), tensors);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  for (const auto& [name, t] : (*model)->parameter_map()) EXPECT_EQ(t.data_ptr(), tensors.at(name).data_ptr()) << name;
  testing::Batch b = testing::left_padded_batch({4, 2}, 4, 64, 1);
  torch::NoGradGuard g;
  EXPECT_TRUE(at::equal(source->forward(b.input_ids, b.attention_mask, b.position_ids),
                        (*model)->forward(b.input_ids, b.attention_mask, b.position_ids)));
  tensors.erase("model.norm.weight");
  auto incomplete = CausalLM::from_parameters(source->config(), tensors);
  ASSERT_FALSE(incomplete.ok());
  EXPECT_NE(incomplete.status().message().find("model.norm.weight"), std::string::npos);
}

TEST(ModelSwap, Bf16ParametersComputeInBf16AndReturnFp32Logits) {
  auto model = make(testing::tiny_config("qwen2", 2), 12);
  testing::Batch b = testing::left_padded_batch({6, 3}, 6, 64, 2);
  torch::NoGradGuard g;
  at::Tensor fp32 = model->forward(b.input_ids, b.attention_mask, b.position_ids);
  for (const auto& [name, t] : model->parameter_map()) ASSERT_TRUE(model->set_parameter(name, t.to(at::kBFloat16)).ok());
  at::Tensor bf16 = model->forward(b.input_ids, b.attention_mask, b.position_ids);
  EXPECT_EQ(bf16.scalar_type(), at::kFloat);
  double d = testing::masked_max_diff(bf16, fp32, b.attention_mask);
  double scale = fp32.abs().max().item<double>();
  std::printf("[bf16] max |bf16 - fp32| = %.3g (logit scale %.3g)\n", d, scale);
  EXPECT_LT(d, 0.05 * scale);
  EXPECT_GT(d, 0.0);
}

}  // namespace
}  // namespace tessera::models
