// Weights reach the engine by reference: data_ptr identity after create / create_from_tensors /
// load_weights_by_reference, generation follows the new weights, and a bad hand-over changes nothing.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/workers/rollout/rollout_test_util.hpp"

namespace tessera::rollout {
namespace {

using testing::get;

models::TensorMap engine_parameters(const KVCacheEngine& engine) {
  auto* step = dynamic_cast<CausalLMStepModel*>(&engine.step_model());
  EXPECT_NE(step, nullptr);
  return step->model().parameter_map();
}

// Every engine parameter shares storage with the tensor of the same name (and nothing was copied).
void expect_aliases(const models::TensorMap& engine_params, const models::TensorMap& given) {
  ASSERT_EQ(engine_params.size(), given.size());
  for (const auto& [name, t] : given) {
    ASSERT_TRUE(engine_params.count(name)) << name;
    EXPECT_EQ(engine_params.at(name).data_ptr(), t.data_ptr()) << name;
  }
}

// Fresh tensors (own storage) holding another model's weights.
models::TensorMap cloned_parameters(const models::CausalLM& model) {
  models::TensorMap out;
  for (const auto& [name, t] : model.parameter_map()) out.emplace(name, t.detach().clone());
  return out;
}

TEST(WeightsByReference, EngineSharesTheModelItWasGiven) {
  auto model = testing::tiny_model(21);
  auto engine = testing::make_engine(model, testing::test_config());
  expect_aliases(engine_parameters(*engine), model->parameter_map());
}

TEST(WeightsByReference, CreateFromTensorsAliasesThem) {
  models::TensorMap tensors = cloned_parameters(*testing::tiny_model(22));
  auto engine = KVCacheEngine::create_from_tensors(testing::tiny_config(), tensors, testing::test_config());
  ASSERT_TRUE(engine.ok()) << engine.status().to_string();
  expect_aliases(engine_parameters(**engine), tensors);
}

TEST(WeightsByReference, LoadSwapsWithoutCopyAndGenerationFollows) {
  auto first = testing::tiny_model(23), second = testing::tiny_model(24);
  RolloutConfig cfg = testing::test_config();
  cfg.do_sample = false;
  proto::DataProto prompts = testing::prompt_batch({6, 3, 8}, 8, 2, 95);
  at::Tensor expected = get(testing::generate(*testing::make_engine(second, cfg), prompts), "responses");

  auto engine = testing::make_engine(first, cfg);
  at::Tensor before = get(testing::generate(*engine, prompts), "responses");
  EXPECT_FALSE(before.equal(expected));
  models::TensorMap first_weights = cloned_parameters(*first);  // the engine will stop reading them
  models::TensorMap gathered = cloned_parameters(*second);  // what FSDP's gather would hand over
  ASSERT_TRUE(engine->load_weights_by_reference(gathered).ok());
  expect_aliases(engine_parameters(*engine), gathered);
  EXPECT_TRUE(get(testing::generate(*engine, prompts), "responses").equal(expected));

  // Writes through the caller's tensors are what the engine computes with (aliasing, not a snapshot).
  for (auto& [name, t] : gathered) {
    torch::NoGradGuard no_grad;
    t.copy_(first_weights.at(name));
  }
  EXPECT_TRUE(get(testing::generate(*engine, prompts), "responses").equal(before));
}

TEST(WeightsByReference, BadHandOverChangesNothing) {
  auto model = testing::tiny_model(25);
  auto engine = testing::make_engine(model, testing::test_config());
  models::TensorMap original = model->parameter_map();
  auto expect_rejected = [&](models::TensorMap tensors, const std::string& needle) {
    Status st = engine->load_weights_by_reference(tensors);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.to_string();
    expect_aliases(engine_parameters(*engine), original);
  };
  models::TensorMap good = cloned_parameters(*model);
  models::TensorMap missing = good;
  missing.erase("model.norm.weight");
  expect_rejected(missing, "model.norm.weight");
  models::TensorMap extra = good;
  extra.emplace("model.layers.9.mlp.up_proj.weight", at::zeros({64, 32}));
  expect_rejected(extra, "model.layers.9.mlp.up_proj.weight");
  models::TensorMap shape = good;
  shape["lm_head.weight"] = at::zeros({testing::kVocab, 16});
  expect_rejected(shape, "lm_head.weight");
  models::TensorMap dtype = good;
  dtype["model.embed_tokens.weight"] = dtype["model.embed_tokens.weight"].to(at::kBFloat16);
  expect_rejected(dtype, "model.embed_tokens.weight");
}

}  // namespace
}  // namespace tessera::rollout
