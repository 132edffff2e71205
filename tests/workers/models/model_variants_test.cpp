// GQA, q/k/v(/o) bias, tied-embedding, Qwen3 (q_norm/k_norm, head_dim != hidden / heads) and RoPE
// scaling (linear, dynamic, llama3) variants against an independent reference forward, plus the
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
    // HF: LlamaAttention's o_proj has bias=attention_bias; Qwen2Attention's never has one.
    EXPECT_EQ(p.count("model.layers.0.self_attn.o_proj.bias"), c.model_type == "qwen2" ? 0u : 1u) << c.model_type;
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

ModelConfig tiny_qwen3(bool attention_bias) {
  ModelConfig c = testing::tiny_config("qwen3", 2);
  c.head_dim = 16;  // Qwen3 sets head_dim freely: 4 heads x 16 != hidden 32
  c.attention_bias = attention_bias;
  return c;
}

at::Tensor logits_of(CausalLM& model, uint64_t seed) {
  testing::Batch b = testing::left_padded_batch({8, 5, 2}, 8, model.config().vocab_size, seed);
  torch::NoGradGuard no_grad;
  return model.forward(b.input_ids, b.attention_mask, b.position_ids);
}

TEST(ModelVariants, Qwen3QkNormIsUsedAndNamedLikeHf) {
  for (bool bias : {false, true}) {
    SCOPED_TRACE(bias ? "attention_bias" : "no bias");
    auto model = make(tiny_qwen3(bias), 21);
    TensorMap p = model->parameter_map();
    const std::string pre = "model.layers.1.self_attn.";
    for (const char* n : {"q_norm", "k_norm"}) {
      ASSERT_EQ(p.count(pre + n + ".weight"), 1u) << n;
      EXPECT_EQ(p.at(pre + n + ".weight").sizes(), (std::vector<int64_t>{16})) << n;
    }
    EXPECT_EQ(p.at(pre + "q_proj.weight").sizes(), (std::vector<int64_t>{64, 32}));
    EXPECT_EQ(p.at(pre + "o_proj.weight").sizes(), (std::vector<int64_t>{32, 64}));
    for (const char* n : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
      EXPECT_EQ(p.count(pre + n + ".bias"), bias ? 1u : 0u) << n;
    }
    double d = diff_vs_reference(*model, 22);
    std::printf("[qwen3 bias=%d] max |ours - reference| = %.3g\n", static_cast<int>(bias), d);
    EXPECT_LT(d, kTolerance);
    // The norms matter: changing one changes the logits.
    at::Tensor before = logits_of(*model, 23);
    {
      torch::NoGradGuard g;
      model->parameter_map().at("model.layers.0.self_attn.k_norm.weight").mul_(1.5);
    }
    EXPECT_GT((before - logits_of(*model, 23)).abs().max().item<double>(), 1e-4);
  }
  // Saved and reloaded: same names, head_dim and logits.
  auto model = make(tiny_qwen3(false), 24);
  testing::TempDir dir;
  ASSERT_TRUE(save_pretrained(*model, dir.path()).ok());
  auto reloaded = load_causal_lm(dir.path());
  ASSERT_TRUE(reloaded.ok()) << reloaded.status().to_string();
  EXPECT_EQ((*reloaded)->config().architecture, "Qwen3ForCausalLM");
  EXPECT_EQ((*reloaded)->config().head_dim, 16);
  EXPECT_TRUE(at::equal(logits_of(*model, 25), logits_of(**reloaded, 25)));
}

// Each scaling type against the reference (its own formulas, in double) and against plain RoPE on
// the same weights (it must make a difference). Batch width 8: positions up to 7.
TEST(ModelVariants, RopeScalingMatchesReferenceAndChangesTheLogits) {
  for (const std::string type : {"linear", "dynamic", "llama3"}) {
    SCOPED_TRACE(type);
    ModelConfig c = testing::tiny_config("llama", 2);
    c.rope_scaling.rope_type = type;
    if (type == "linear") c.rope_scaling.factor = 4.0;
    if (type == "dynamic") {
      c.rope_scaling.factor = 2.0;
      c.max_position_embeddings = 6;  // seq_len 8 > 6: the NTK base is recomputed
    }
    if (type == "llama3") {
      // theta 100, head_dim 8: wavelengths 6.3, 20, 63, 199 against 64 / 4 and 64 / 1: one kept,
      // two smoothed, one divided by the factor.
      c.rope_theta = 100.0;
      c.rope_scaling.factor = 8.0;
      c.rope_scaling.low_freq_factor = 1.0;
      c.rope_scaling.high_freq_factor = 4.0;
      c.rope_scaling.original_max_position_embeddings = 64;
    }
    auto model = make(c, 30);
    double d = diff_vs_reference(*model, 31);
    std::printf("[rope %s] max |ours - reference| = %.3g\n", type.c_str(), d);
    EXPECT_LT(d, kTolerance);
    ModelConfig plain_config = c;
    plain_config.rope_scaling = RopeScaling();
    auto plain = CausalLM::from_parameters(plain_config, model->parameter_map());
    ASSERT_TRUE(plain.ok()) << plain.status().to_string();
    EXPECT_GT((logits_of(*model, 31) - logits_of(**plain, 31)).abs().max().item<double>(), 1e-3);
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
