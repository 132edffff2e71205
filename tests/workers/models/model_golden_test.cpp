// Golden: the HF-tiny checkpoints (computed independently of Tessera) load and give HF's logits
// to within 1e-5 wherever attention_mask is 1.
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "tests/workers/models/model_test_util.hpp"
#include "workers/models/model_io.hpp"

namespace tessera::models {
namespace {

constexpr double kTolerance = 1e-5;

std::string golden_dir() {
  if (const char* d = std::getenv("TESSERA_GOLDEN_HF_TINY")) return d;
  const char* shared = std::getenv("TESSERA_SHARED_DIR");
  return std::string(shared != nullptr ? shared : "/work/shared") + "/golden/hf-tiny";
}

at::Tensor to_tensor(const nlohmann::json& j, at::ScalarType dtype) {
  std::vector<int64_t> shape;
  for (const nlohmann::json* p = &j; p->is_array(); p = &(*p)[0]) shape.push_back(static_cast<int64_t>(p->size()));
  std::vector<double> flat;
  std::function<void(const nlohmann::json&)> walk = [&](const nlohmann::json& v) {
    if (v.is_array()) {
      for (const auto& e : v) walk(e);
    } else {
      flat.push_back(v.get<double>());
    }
  };
  walk(j);
  return at::tensor(flat, at::kDouble).view(shape).to(dtype);
}

void check_golden(const std::string& family) {
  std::string dir = golden_dir() + "/" + family;
  auto model = load_causal_lm(dir);
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  std::ifstream in(dir + "/logits_case.json");
  ASSERT_TRUE(in) << "cannot open " << dir << "/logits_case.json";
  nlohmann::json c = nlohmann::json::parse(in);
  testing::Batch batch{to_tensor(c["input_ids"], at::kLong), to_tensor(c["attention_mask"], at::kLong),
                       to_tensor(c["position_ids"], at::kLong)};
  at::Tensor expected = to_tensor(c["logits"], at::kDouble);
  torch::NoGradGuard no_grad;
  at::Tensor logits = (*model)->forward(batch.input_ids, batch.attention_mask, batch.position_ids);
  ASSERT_EQ(logits.sizes(), expected.sizes());
  EXPECT_EQ(logits.scalar_type(), at::kFloat);
  double diff = testing::masked_max_diff(logits, expected, batch.attention_mask);
  std::printf("[golden hf-tiny/%s] max |logits - HF| over attended positions = %.3g (tolerance %.0e)\n",
              family.c_str(), diff, kTolerance);
  EXPECT_LT(diff, kTolerance);
  EXPECT_FALSE(logits.isnan().any().item<bool>()) << "padded rows must not produce NaN";
}

TEST(ModelGolden, Qwen2MatchesHfLogits) { check_golden("qwen2"); }

TEST(ModelGolden, LlamaMatchesHfLogits) { check_golden("llama"); }

TEST(ModelGolden, GoldenCheckpointsHaveTheExpectedLayouts) {
  auto qwen = load_causal_lm(golden_dir() + "/qwen2");
  auto llama = load_causal_lm(golden_dir() + "/llama");
  ASSERT_TRUE(qwen.ok() && llama.ok());
  TensorMap q = (*qwen)->parameter_map();
  TensorMap l = (*llama)->parameter_map();
  EXPECT_EQ(q.count("model.layers.0.self_attn.q_proj.bias"), 1u);
  EXPECT_EQ(q.at("model.layers.0.self_attn.k_proj.weight").size(0), 2 * 8);  // 2 KV heads x head_dim 8
  EXPECT_EQ(q.count("lm_head.weight"), 1u);
  EXPECT_EQ(l.count("lm_head.weight"), 0u);  // tied
  EXPECT_EQ(l.count("model.layers.0.self_attn.q_proj.bias"), 0u);
  EXPECT_EQ((*llama)->lm_head_weight().data_ptr(), l.at("model.embed_tokens.weight").data_ptr());
}

}  // namespace
}  // namespace tessera::models
