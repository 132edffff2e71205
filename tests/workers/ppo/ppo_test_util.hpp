// ppo_test_util.hpp: tiny models and verl-shaped PPO batches for ppo_test, plus an independent
// full-batch forward (plain torch ops) that the actor and critic are checked against.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "proto/data_proto.hpp"
#include "tests/workers/models/tiny_config.hpp"
#include "tests/workers/ppo/rollout_batch_util.hpp"
#include "workers/ppo/dp_actor.hpp"
#include "workers/ppo/dp_critic.hpp"
#include "workers/models/config.hpp"
#include "workers/models/model.hpp"

namespace tessera::ppo::testing {

using tessera::testing::max_diff;
using tessera::testing::rollout_tensors;

constexpr int64_t kVocab = 64;

/// The standard test batch: prompt length kP, response length kR, and varied per-row lengths so
/// padding is exercised everywhere.
inline const std::vector<int64_t> kPromptLens = {6, 2, 4, 5, 3, 6, 1, 4};
inline const std::vector<int64_t> kResponseLens = {5, 3, 1, 4, 5, 2, 5, 3};
constexpr int64_t kP = 6, kR = 5;

/// A 2-layer Qwen2-style config: hidden 32, 4 heads over 2 KV heads, vocab kVocab.
inline models::ModelConfig tiny_config() {
  return models::testing::tiny_config("qwen2", /*kv_heads=*/2, /*tied=*/false, kVocab);
}

/// Scales every matrix so logits are far from uniform (HF init, std 0.02, makes them nearly flat).
inline void sharpen(models::PretrainedModel& model, double factor) {
  torch::NoGradGuard g;
  for (auto& p : model.named_parameters()) {
    if (p.key().find("norm") == std::string::npos) p.value().mul_(factor);
  }
}

/// A tiny `Model` (models::CausalLM or models::ValueModel) from models' seeded HF init, sharpened.
template <class Model>
inline std::shared_ptr<Model> tiny_sharpened(uint64_t seed) {
  models::ModelInit init;
  init.seed = seed;
  auto m = Model::create(tiny_config(), init);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  sharpen(**m, 10.0);
  return *m;
}

/// A tiny CausalLM (policy), see tiny_sharpened.
inline std::shared_ptr<models::CausalLM> tiny_policy(uint64_t seed) { return tiny_sharpened<models::CausalLM>(seed); }

/// A tiny ValueModel (critic), see tiny_sharpened.
inline std::shared_ptr<models::ValueModel> tiny_critic(uint64_t seed) { return tiny_sharpened<models::ValueModel>(seed); }

/// A verl-shaped rollout batch: prompts left-padded to P (lengths prompt_lens), responses
/// right-padded to R (lengths response_lens). Keys input_ids, attention_mask, position_ids,
/// responses, response_mask.
inline proto::DataProto make_batch(const std::vector<int64_t>& prompt_lens, const std::vector<int64_t>& response_lens,
                                   int64_t P, int64_t R, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  auto d = proto::DataProto::from_dict(rollout_tensors(prompt_lens, response_lens, P, R, kVocab, gen));
  EXPECT_TRUE(d.ok()) << d.status().to_string();
  return *d;
}

/// Independent log-probs / entropies of the response tokens from ONE full-batch forward:
/// log_softmax / softmax written out with plain torch ops.
inline std::pair<at::Tensor, at::Tensor> reference_log_probs(models::CausalLM& model, const proto::DataProto& d,
                                                             double temperature) {
  torch::NoGradGuard g;
  model.eval();
  at::Tensor ids = *d.tensor("input_ids"), responses = *d.tensor("responses");
  at::Tensor logits = model.forward(ids, *d.tensor("attention_mask"), *d.tensor("position_ids"));
  const int64_t T = ids.size(1), R = responses.size(1);
  at::Tensor z = logits.slice(1, T - R - 1, T - 1).to(at::kDouble) / temperature;
  at::Tensor logp = z - z.logsumexp(-1, /*keepdim=*/true);
  at::Tensor lp = logp.gather(-1, responses.unsqueeze(-1)).squeeze(-1);
  at::Tensor ent = -(logp.exp() * logp).sum(-1);
  return {lp.to(at::kFloat), ent.to(at::kFloat)};
}

/// Max |a - b| / max(1, |b|): fp32 resolution scales with magnitude (ulp(16) = 1.9e-6), so
/// "equal within 1e-6" is checked relative to values above 1.
inline double max_rel_diff(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor bd = b.to(at::kDouble);
  return ((a.to(at::kDouble) - bd).abs() / bd.abs().clamp_min(1.0)).max().item<double>();
}

/// Tolerance of max_rel_diff when only the batching differs (micro-batch size, token budget):
/// OpenBLAS picks its fp32 GEMM kernels by CPU and by matrix shape, so a 3-row micro-batch sums
/// in another order than an 8-row one (up to 1.3e-6 seen on an AMD EPYC, under 1e-6 on Intel).
/// A batching bug (a row paired with another's mask or position ids) moves values by 1e-2 and
/// more.
inline constexpr double kBatchingTolerance = 1e-5;

/// Every parameter, cloned (for before/after comparisons).
inline std::vector<at::Tensor> snapshot(models::PretrainedModel& model) {
  std::vector<at::Tensor> out;
  for (const auto& p : model.parameters()) out.push_back(p.detach().clone());
  return out;
}

/// Max |a_i - b_i| over two snapshots (NaN if any value is NaN).
inline double max_param_diff(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    double d = max_diff(a[i], b[i]);
    if (std::isnan(d)) return d;
    m = std::max(m, d);
  }
  return m;
}

/// A sequence-level meta_info for compute_log_prob / compute_values.
inline nlohmann::json forward_meta(double temperature, int64_t micro_batch_size, bool dynamic,
                                   int64_t max_token_len = 0) {
  nlohmann::json m = {{"temperature", temperature}, {"use_dynamic_bsz", dynamic}, {"micro_batch_size", micro_batch_size}};
  if (dynamic) m["max_token_len"] = max_token_len;
  return m;
}

/// Unwraps a Result in a test, failing with its message.
template <class T>
T unwrap(Result<T> r) {
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (!r.ok()) throw std::runtime_error(r.status().to_string());
  return std::move(r).value();
}

}  // namespace tessera::ppo::testing
