// rollout_test_util.hpp: shared helpers for rollout_test: a tiny random model, verl-style
// left-padded prompt batches, and the independent reference (one full forward over the output).
#pragma once

#include <cmath>
#include <memory>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "proto/data_proto.hpp"
#include "tests/workers/models/tiny_config.hpp"
#include "workers/models/config.hpp"
#include "workers/models/model.hpp"
#include "workers/rollout/config.hpp"
#include "workers/rollout/kv_engine.hpp"

namespace tessera::rollout::testing {

constexpr int64_t kVocab = 96;

/// 2 layers, hidden 32, 4 query heads over 2 KV heads (GQA), Qwen2 (q/k/v biases): models' tiny
/// config with vocab kVocab, MLP 64 and no bos / eos token.
inline models::ModelConfig tiny_config() {
  models::ModelConfig c = models::testing::tiny_config("qwen2", /*kv_heads=*/2, /*tied=*/false, kVocab);
  c.intermediate_size = 64;
  c.bos_token_id.reset();
  c.eos_token_ids.clear();
  c.initializer_range = 0.2;  // large enough that greedy paths vary and logit gaps are wide
  return c;
}

/// A seeded tiny CausalLM (HF init with the config's initializer_range; biases randomised too).
inline std::shared_ptr<models::CausalLM> tiny_model(uint64_t seed) {
  auto model = models::CausalLM::create(tiny_config(), models::ModelInit{at::kFloat, seed});
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  at::Generator gen = at::detail::createCPUGenerator(seed + 1);
  torch::NoGradGuard no_grad;
  for (auto& p : (*model)->named_parameters()) {
    if (p.key().find(".bias") != std::string::npos) p.value().copy_(at::randn(p.value().sizes(), gen) * 0.1);
  }
  return *model;
}

/// A rollout config for tests: fp32, short lengths, greedy unless told otherwise.
inline RolloutConfig test_config(int64_t response_length = 12) {
  RolloutConfig c;
  c.dtype = "float32";
  c.prompt_length = 8;
  c.response_length = response_length;
  c.max_num_seqs = 4;
  c.max_num_batched_tokens = 64;
  return c;
}

/// verl's prompt batch: `lengths[b]` random tokens right-aligned in width P (pad 0, mask 0).
inline proto::DataProto prompt_batch(const std::vector<int64_t>& lengths, int64_t P, uint64_t seed,
                                     nlohmann::json eos = 2, int64_t pad = 0) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const int64_t B = static_cast<int64_t>(lengths.size());
  at::Tensor ids = at::randint(3, kVocab, {B, P}, gen, at::kLong);
  at::Tensor mask = at::zeros({B, P}, at::kLong);
  for (int64_t i = 0; i < B; ++i) mask[i].narrow(0, P - lengths[static_cast<size_t>(i)], lengths[static_cast<size_t>(i)]).fill_(1);
  ids.masked_fill_(mask.eq(0), pad);
  at::Tensor pos = (mask.cumsum(1) - 1).clamp_min(0);
  proto::TensorDict t{{"input_ids", ids}, {"attention_mask", mask}, {"position_ids", pos}};
  nlohmann::json meta = {{"eos_token_id", eos}, {"pad_token_id", pad}};
  auto data = proto::DataProto::from_dict(t, {}, meta);
  EXPECT_TRUE(data.ok()) << data.status().to_string();
  return *data;
}

inline std::unique_ptr<KVCacheEngine> make_engine(std::shared_ptr<models::CausalLM> model, RolloutConfig config,
                                                  uint64_t seed = 0) {
  auto engine = KVCacheEngine::create(std::move(model), std::move(config), EngineOptions{seed});
  EXPECT_TRUE(engine.ok()) << engine.status().to_string();
  return std::move(*engine);
}

inline proto::DataProto generate(KVCacheEngine& engine, const proto::DataProto& prompts) {
  auto out = engine.generate_sequences(prompts);
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  return out.ok() ? *out : proto::DataProto();
}

inline at::Tensor get(const proto::DataProto& d, const std::string& key) {
  auto t = d.tensor(key);
  EXPECT_TRUE(t.ok()) << t.status().to_string();
  return t.ok() ? *t : at::Tensor();
}

/// The reference: logits [B, P + R, V] of ONE full forward (no KV cache) over the output's
/// input_ids / attention_mask / position_ids. Causal attention makes the logits at column
/// P - 1 + t the prediction of response token t given everything before it: this is the
/// token-by-token recomputation, done in a single pass.
inline at::Tensor full_forward_logits(models::CausalLM& model, const proto::DataProto& out) {
  torch::NoGradGuard no_grad;
  return model.forward(get(out, "input_ids"), get(out, "attention_mask"), get(out, "position_ids"));
}

/// Number of valid response tokens per row: through the first EOS (the response mask's 1s).
inline std::vector<int64_t> valid_lengths(const proto::DataProto& out, int64_t P) {
  at::Tensor m = get(out, "attention_mask");
  at::Tensor counts = m.narrow(1, P, m.size(1) - P).sum(1);
  return std::vector<int64_t>(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + counts.numel());
}

}  // namespace tessera::rollout::testing
