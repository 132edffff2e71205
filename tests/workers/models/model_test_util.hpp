// model_test_util.hpp: shared helpers for models_test: tiny configs, verl-style left-padded
// batches, and an independent reference forward written with plain torch ops.
#pragma once

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/workers/models/tiny_config.hpp"
#include "workers/models/config.hpp"
#include "workers/models/model.hpp"

namespace tessera::models::testing {

/// A left-padded batch as verl builds it: `lengths[b]` real tokens right-aligned in width T.
struct Batch {
  at::Tensor input_ids, attention_mask, position_ids;
};

inline Batch left_padded_batch(const std::vector<int64_t>& lengths, int64_t T, int64_t vocab, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const int64_t B = static_cast<int64_t>(lengths.size());
  Batch b;
  b.input_ids = at::randint(3, vocab, {B, T}, gen, at::kLong);
  b.attention_mask = at::zeros({B, T}, at::kLong);
  for (int64_t i = 0; i < B; ++i) b.attention_mask[i].narrow(0, T - lengths[i], lengths[i]).fill_(1);
  b.input_ids.masked_fill_(b.attention_mask.eq(0), 0);
  b.position_ids = (b.attention_mask.cumsum(1) - 1).clamp_min(0);
  return b;
}

/// Max |a - b| over positions where mask [B, T] is 1 (a, b are [B, T, ...]).
inline double masked_max_diff(const at::Tensor& a, const at::Tensor& b, const at::Tensor& mask) {
  at::Tensor d = (a.to(at::kDouble) - b.to(at::kDouble)).abs();
  while (d.dim() > 2) d = std::get<0>(d.max(-1));
  return d.masked_select(mask.ne(0)).max().item<double>();
}

/// Randomises every parameter (biases and norms included) so no term is trivially zero or one.
/// Norms scale by about 1 (Gemma2's weight w scales by 1 + w, so it is drawn around 0).
inline void randomise(PretrainedModel& model, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  torch::NoGradGuard g;
  const double norm_base = model.config().gemma_norms() ? 0.0 : 1.0;
  for (auto& p : model.named_parameters()) {
    p.value().copy_(at::randn(p.value().sizes(), gen) * 0.2 + (p.key().find("norm") != std::string::npos ? norm_base : 0.0));
  }
}

/// RoPE inverse frequencies [head_dim / 2] in double, written from the formulas (config.hpp,
/// RopeScaling) frequency by frequency; "dynamic" takes seq_len = max(position_ids) + 1.
inline at::Tensor reference_inv_freq(const ModelConfig& c, const at::Tensor& position_ids) {
  const int64_t D = c.head_dim, half = D / 2;
  const RopeScaling& r = c.rope_scaling;
  const double M = static_cast<double>(c.max_position_embeddings);
  double theta = c.rope_theta;
  if (r.rope_type == "dynamic") {
    const double seq_len = position_ids.max().item<double>() + 1;
    if (seq_len > M) theta *= std::pow(r.factor * seq_len / M - (r.factor - 1), double(D) / double(D - 2));
  }
  std::vector<double> inv(static_cast<size_t>(half));
  const double old = r.original_max_position_embeddings > 0 ? double(r.original_max_position_embeddings) : M;
  for (int64_t i = 0; i < half; ++i) {
    double f = std::pow(theta, -2.0 * double(i) / double(D));
    if (r.rope_type == "linear") f /= r.factor;
    if (r.rope_type == "llama3") {
      const double wavelen = 2 * M_PI / f;
      if (wavelen > old / r.low_freq_factor) {
        f /= r.factor;
      } else if (wavelen >= old / r.high_freq_factor) {
        const double s = (old / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
        f = (1 - s) * f / r.factor + s * f;
      }
    }
    inv[static_cast<size_t>(i)] = f;
  }
  return at::tensor(inv, at::kDouble);
}

/// An independent reference forward: per-pair RoPE (with rope_scaling), repeat_interleave for GQA,
/// -inf masking, Qwen3's per-head q/k norms and any o_proj bias the parameters hold.
/// Meaningful only at positions where attention_mask is 1.
inline at::Tensor reference_hidden(const TensorMap& p, const ModelConfig& c, const Batch& batch) {
  const int64_t B = batch.input_ids.size(0), T = batch.input_ids.size(1), D = c.head_dim, half = D / 2;
  auto W = [&](const std::string& n) { return p.at(n).to(at::kDouble); };
  auto has = [&](const std::string& n) { return p.count(n) != 0; };
  auto rms = [&](const at::Tensor& x, const std::string& n) {
    return x / (x.pow(2).mean(-1, true) + c.rms_norm_eps).sqrt() * W(n);
  };
  at::Tensor pos = batch.position_ids.to(at::kDouble);
  at::Tensor inv = reference_inv_freq(c, batch.position_ids);
  at::Tensor ang = pos.unsqueeze(-1) * inv;  // [B, T, half]
  auto rope = [&](const at::Tensor& x) {     // x [B, T, heads, D]
    at::Tensor a = x.narrow(-1, 0, half), b = x.narrow(-1, half, half);
    at::Tensor cs = ang.cos().unsqueeze(2), sn = ang.sin().unsqueeze(2);
    return at::cat({a * cs - b * sn, b * cs + a * sn}, -1);
  };
  at::Tensor causal = at::ones({T, T}, at::kBool).tril();
  at::Tensor allowed = causal.unsqueeze(0) & batch.attention_mask.ne(0).unsqueeze(1);  // [B, T, T]
  at::Tensor h = W("model.embed_tokens.weight").index_select(0, batch.input_ids.reshape(-1)).view({B, T, -1});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    std::string pre = "model.layers." + std::to_string(l) + ".";
    at::Tensor x = rms(h, pre + "input_layernorm.weight");
    auto proj = [&](const std::string& n, int64_t heads) {
      at::Tensor y = at::matmul(x, W(pre + "self_attn." + n + ".weight").t());
      if (has(pre + "self_attn." + n + ".bias")) y = y + W(pre + "self_attn." + n + ".bias");
      return y.view({B, T, heads, D});
    };
    auto head_norm = [&](const at::Tensor& y, const std::string& n) {  // Qwen3: over D, per head
      return has(pre + "self_attn." + n + ".weight") ? rms(y, pre + "self_attn." + n + ".weight") : y;
    };
    at::Tensor q = rope(head_norm(proj("q_proj", c.num_attention_heads), "q_norm"));
    at::Tensor k = rope(head_norm(proj("k_proj", c.num_key_value_heads), "k_norm")).repeat_interleave(c.num_kv_groups(), 2);
    at::Tensor v = proj("v_proj", c.num_key_value_heads).repeat_interleave(c.num_kv_groups(), 2);
    at::Tensor s = at::einsum("bthd,bshd->bhts", {q, k}) / std::sqrt(static_cast<double>(D));
    s = s.masked_fill(allowed.unsqueeze(1).logical_not(), -INFINITY);
    at::Tensor o = at::einsum("bhts,bshd->bthd", {at::softmax(s, -1).nan_to_num(0.0), v}).reshape({B, T, -1});
    at::Tensor attn = at::matmul(o, W(pre + "self_attn.o_proj.weight").t());
    if (has(pre + "self_attn.o_proj.bias")) attn = attn + W(pre + "self_attn.o_proj.bias");
    h = h + attn;
    x = rms(h, pre + "post_attention_layernorm.weight");
    at::Tensor g = at::matmul(x, W(pre + "mlp.gate_proj.weight").t());
    at::Tensor u = at::matmul(x, W(pre + "mlp.up_proj.weight").t());
    h = h + at::matmul(g * at::sigmoid(g) * u, W(pre + "mlp.down_proj.weight").t());
  }
  return rms(h, "model.norm.weight");
}

/// Reference logits [B, T, V] (double) for a CausalLM's parameters.
inline at::Tensor reference_logits(const TensorMap& p, const ModelConfig& c, const Batch& batch) {
  const std::string head = c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  return at::matmul(reference_hidden(p, c, batch), p.at(head).to(at::kDouble).t());
}

/// A fresh empty temp directory, removed at scope exit.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "tessera_models_XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string path() const { return path_; }
  std::string operator/(const std::string& name) const { return (std::filesystem::path(path_) / name).string(); }

 private:
  std::string path_;
};

}  // namespace tessera::models::testing
