// Value head: HF *ForTokenClassification(num_labels=1) layout, [B, T] outputs, critic init from an
// actor checkpoint (lm_head ignored, score seeded), and save/load of a value checkpoint.
#include <fstream>
#include <optional>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "tests/workers/models/model_test_util.hpp"
#include "workers/models/model_io.hpp"

namespace tessera::models {
namespace {

using testing::TempDir;

TEST(ValueModel, ShapesAndHfNames) {
  auto model = ValueModel::create(testing::tiny_config("qwen2", 2), ModelInit{at::kFloat, 5});
  ASSERT_TRUE(model.ok()) << model.status().to_string();
  EXPECT_EQ((*model)->config().architecture, "Qwen2ForTokenClassification");
  TensorMap p = (*model)->parameter_map();
  ASSERT_EQ(p.count("score.weight"), 1u);
  EXPECT_EQ(p.at("score.weight").sizes(), (std::vector<int64_t>{1, 32}));
  EXPECT_EQ(p.at("score.bias").sizes(), (std::vector<int64_t>{1}));
  EXPECT_EQ(p.count("lm_head.weight"), 0u);
  testing::Batch b = testing::left_padded_batch({5, 2, 4}, 5, 64, 3);
  at::Tensor v = (*model)->forward(b.input_ids, b.attention_mask, b.position_ids);
  EXPECT_EQ(v.sizes(), (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(v.scalar_type(), at::kFloat);
  // values = hidden . score.weight + score.bias, checked against the reference backbone.
  torch::NoGradGuard g;
  testing::randomise(**model, 8);
  v = (*model)->forward(b.input_ids, b.attention_mask, b.position_ids);
  at::Tensor h = testing::reference_hidden((*model)->parameter_map(), (*model)->config(), b);
  at::Tensor want = at::matmul(h, p.at("score.weight").to(at::kDouble).t()).squeeze(-1) + p.at("score.bias").item<double>();
  EXPECT_LT(testing::masked_max_diff(v.unsqueeze(-1), want.unsqueeze(-1), b.attention_mask), 1e-5);
}

TEST(ValueModel, CriticInitFromActorCheckpointIgnoresLmHeadAndSeedsScore) {
  auto actor = CausalLM::create(testing::tiny_config("llama"), ModelInit{at::kFloat, 1});
  ASSERT_TRUE(actor.ok());
  TempDir dir;
  ASSERT_TRUE(save_pretrained(**actor, dir.path()).ok());
  LoadOptions opts;
  opts.score_seed = 42;
  auto critic = load_value_model(dir.path(), opts);
  ASSERT_TRUE(critic.ok()) << critic.status().to_string();
  auto again = load_value_model(dir.path(), opts);
  opts.score_seed = 43;
  auto other = load_value_model(dir.path(), opts);
  ASSERT_TRUE(again.ok() && other.ok());
  TensorMap c = (*critic)->parameter_map();
  EXPECT_EQ(c.count("lm_head.weight"), 0u);
  EXPECT_TRUE(at::equal(c.at("model.layers.1.mlp.up_proj.weight"),
                        (*actor)->parameter_map().at("model.layers.1.mlp.up_proj.weight")));
  EXPECT_TRUE(at::equal(c.at("score.weight"), (*again)->parameter_map().at("score.weight")));
  EXPECT_FALSE(at::equal(c.at("score.weight"), (*other)->parameter_map().at("score.weight")));
  EXPECT_EQ(c.at("score.bias").item<float>(), 0.0f);
  double stdev = c.at("score.weight").std().item<double>();
  EXPECT_GT(stdev, 0.005);
  EXPECT_LT(stdev, 0.05);  // normal(0, initializer_range = 0.02)
}

TEST(ValueModel, SavedValueCheckpointReloadsExactly) {
  auto model = ValueModel::create(testing::tiny_config("qwen2", 2), ModelInit{at::kFloat, 9});
  ASSERT_TRUE(model.ok());
  testing::randomise(**model, 10);
  TempDir dir;
  ASSERT_TRUE(save_pretrained(**model, dir.path()).ok());
  std::ifstream in(dir / "config.json");
  nlohmann::json cfg = nlohmann::json::parse(in);
  EXPECT_EQ(cfg["architectures"][0], "Qwen2ForTokenClassification");
  EXPECT_EQ(cfg["id2label"].size(), 1u);
  auto reloaded = load_value_model(dir.path());
  ASSERT_TRUE(reloaded.ok()) << reloaded.status().to_string();
  for (const auto& [name, t] : (*model)->parameter_map()) {
    EXPECT_TRUE(at::equal(t, (*reloaded)->parameter_map().at(name))) << name;
  }
  auto as_lm = load_causal_lm(dir.path());
  ASSERT_FALSE(as_lm.ok());
  EXPECT_NE(as_lm.status().message().find("value model"), std::string::npos);
}

TEST(ValueModel, CheckpointWithoutScoreBiasKeepsThatLayout) {
  auto model = ValueModel::create(testing::tiny_config("llama"), ModelInit{at::kFloat, 2, /*score_bias=*/false});
  ASSERT_TRUE(model.ok());
  EXPECT_EQ((*model)->parameter_map().count("score.bias"), 0u);
  TempDir dir;
  ASSERT_TRUE(save_pretrained(**model, dir.path()).ok());
  auto reloaded = load_value_model(dir.path());
  ASSERT_TRUE(reloaded.ok()) << reloaded.status().to_string();
  EXPECT_EQ((*reloaded)->parameter_map().count("score.bias"), 0u);
}

// Loading onto a GPU uploads each checkpoint tensor in its own dtype and converts it there: a bf16
// checkpoint (untied and tied embeddings) loaded as an fp32 model (the actor), in its own dtype
// (the reference: a plain upload from the mmap'd file) and as a value model with a seeded head (the
// critic) equals the host load bit for bit, with every parameter on the device.
TEST(ModelIo, OnCudaLoadConvertsOnTheDeviceAndEqualsTheHostLoad) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU here";
  const c10::Device cuda("cuda:0");
  auto expect_same = [&](const TensorMap& got, const TensorMap& want, c10::ScalarType dtype) {
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [name, t] : want) {
      const at::Tensor& g = got.at(name);
      EXPECT_EQ(g.device(), cuda) << name;
      EXPECT_EQ(g.scalar_type(), dtype) << name;
      EXPECT_TRUE(at::equal(g.cpu(), t)) << name;
    }
  };
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    auto actor = CausalLM::create(testing::tiny_config("qwen2", 2, tied), ModelInit{at::kBFloat16, 3});
    ASSERT_TRUE(actor.ok()) << actor.status().to_string();
    TempDir dir;
    ASSERT_TRUE(save_pretrained(**actor, dir.path()).ok());
    for (std::optional<c10::ScalarType> dtype : {std::optional<c10::ScalarType>(at::kFloat),
                                                 std::optional<c10::ScalarType>()}) {
      LoadOptions host;
      host.dtype = dtype;
      host.score_seed = 7;
      LoadOptions device = host;
      device.device = cuda;
      const c10::ScalarType want_dtype = dtype.value_or(at::kBFloat16);
      auto on_host = load_causal_lm(dir.path(), host), on_device = load_causal_lm(dir.path(), device);
      ASSERT_TRUE(on_host.ok() && on_device.ok()) << on_device.status().to_string();
      expect_same((*on_device)->parameter_map(), (*on_host)->parameter_map(), want_dtype);
      EXPECT_EQ((*on_device)->lm_head_weight().device(), cuda);
      auto critic_host = load_value_model(dir.path(), host), critic_device = load_value_model(dir.path(), device);
      ASSERT_TRUE(critic_host.ok() && critic_device.ok()) << critic_device.status().to_string();
      expect_same((*critic_device)->parameter_map(), (*critic_host)->parameter_map(), want_dtype);
    }
  }
}

}  // namespace
}  // namespace tessera::models
