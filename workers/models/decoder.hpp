// decoder.hpp: the decoder-only transformer shared by Llama, Qwen2 and Qwen3, as torch::nn modules
// whose parameters carry HF's names (q_proj.weight, input_layernorm.weight, ...).
//
// The maths follows HF's modeling_llama / modeling_qwen2 / modeling_qwen3 exactly:
//   RMSNorm     y = weight * (x_f32 * rsqrt(mean(x_f32^2) + eps)).to(x.dtype)
//   RoPE        inv_freq = 1 / theta^(arange(0, D, 2) / D), rescaled per config.rope_scaling
//               (linear, dynamic NTK, llama3; see RopeScaling in config.hpp); emb = cat(freqs, freqs);
//               x' = x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1)
//   Qwen3       q_norm / k_norm: RMSNorm over head_dim of every query / key head, after the
//               projection and before RoPE
//   biases      q/k/v when attention_bias (always for Qwen2); o_proj too for Llama and Qwen3
//   attention   softmax(q k^T * D^-0.5, masked) v through at::scaled_dot_product_attention, as
//               HF's sdpa path; GQA heads share K/V (enable_gqa) instead of repeat_kv copies
//   MLP         down(silu(gate(x)) * up(x))
// Masking: query t (cache column past + t) sees key column s iff s <= past + t and the key's
// attention-mask bit is 1. A query that would see nothing sees its own key (Note [No fully masked
// query] in decoder.cpp), so a left-padding position gets a finite, meaningless output, not NaN.
//
// Parameters are created uninitialised (at::empty) in the requested dtype; a loader or
// initialize_weights() fills them. Every module holds its parameter tensors as the same TensorImpl
// that named_parameters() returns, so Tensor::set_data on either swaps the storage for both.
//
// Thread-safety: a module may be used by one thread at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "workers/models/config.hpp"

namespace tessera::models {

class KVCache;

/// y = x W^T (+ b), with parameters "weight" [out, in] and optionally "bias" [out].
class Linear : public torch::nn::Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool with_bias, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x) const;
  at::Tensor weight;
  at::Tensor bias;  ///< Undefined when constructed without bias.
};

/// Token embedding table, parameter "weight" [vocab, hidden].
class Embedding : public torch::nn::Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& ids) const;
  at::Tensor weight;
};

/// HF LlamaRMSNorm / Qwen2RMSNorm, parameter "weight" [hidden].
class RMSNorm : public torch::nn::Module {
 public:
  RMSNorm(int64_t dim, double eps, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x) const;
  at::Tensor weight;
  double eps;
};

/// cos/sin tables for one batch of position ids, [B, 1, T, head_dim] in the compute dtype.
struct RotaryTables {
  at::Tensor cos;
  at::Tensor sin;
};

/// HF's inverse frequencies [head_dim / 2] (fp32, on position_ids' device) for one forward call
/// over `position_ids` [B, T]: config.rope_theta and config.rope_scaling, computed with the same
/// fp32 operations as transformers. "dynamic" uses seq_len = max(position_ids) + 1, as HF's
/// dynamic_rope_update does for each call (a KV-cache step's own positions), chosen on the device
/// without a host sync.
at::Tensor rotary_inv_freq(const at::Tensor& position_ids, const ModelConfig& config);

/// HF rotary embedding for `position_ids` [B, T] (computed in fp32, cast to `dtype`), with the
/// config's head_dim, rope_theta and rope_scaling (rotary_inv_freq).
RotaryTables make_rotary_tables(const at::Tensor& position_ids, const ModelConfig& config, c10::ScalarType dtype);

/// x * cos + rotate_half(x) * sin for x [B, heads, T, head_dim].
at::Tensor apply_rotary(const at::Tensor& x, const RotaryTables& tables);

/// Visibility [B, 1, T, past + T] (bool): key column s visible to query t iff s <= past + t and
/// key_mask[b, s] != 0; a query that sees no key sees its own (Note [No fully masked query]).
/// REQUIRES: key_mask is [B, past + T].
at::Tensor attention_visibility(const at::Tensor& key_mask, int64_t query_len, int64_t past_len);

/// Where one layer reads and writes its keys/values during incremental decoding.
struct LayerCacheView {
  at::Tensor key;    ///< [B, kv_heads, capacity, head_dim]
  at::Tensor value;  ///< [B, kv_heads, capacity, head_dim]
  int64_t past = 0;  ///< Columns already filled; new keys go to [past, past + T).
};

/// HF LlamaAttention / Qwen2Attention / Qwen3Attention: q/k/v/o projections (biases as
/// config.attention_bias and ModelConfig::o_proj_bias say) and, for Qwen3, q_norm / k_norm.
class Attention : public torch::nn::Module {
 public:
  Attention(const ModelConfig& config, const at::TensorOptions& options);
  /// x [B, T, hidden]; visible [B, 1, T, S]; cache null for a full forward (S == T). With
  /// `output_bias` false the o_proj bias (if any) is left out, for a caller that adds it after a
  /// tensor-parallel sum of the partial outputs.
  at::Tensor forward(const at::Tensor& x, const RotaryTables& rope, const at::Tensor& visible,
                     const LayerCacheView* cache, bool output_bias = true) const;
  /// Queries [B, heads, T, D] and keys [B, kv_heads, T, D] of x [B, T, hidden]: projected,
  /// per-head normed (Qwen3) and rotated.
  std::pair<at::Tensor, at::Tensor> queries_and_keys(const at::Tensor& x, const RotaryTables& rope) const;
  /// Values [B, kv_heads, T, D] of x [B, T, hidden].
  at::Tensor values(const at::Tensor& x) const;
  /// o_proj of the attention output [B, T, heads * D] (bias included when `output_bias`).
  at::Tensor output(const at::Tensor& attended, bool output_bias = true) const;

  std::shared_ptr<Linear> q_proj, k_proj, v_proj, o_proj;
  std::shared_ptr<RMSNorm> q_norm, k_norm;  ///< Qwen3 only ([head_dim] weights); null otherwise.

 private:
  int64_t num_heads_, num_kv_heads_, head_dim_;
};

/// HF LlamaMLP (SwiGLU): down_proj(silu(gate_proj(x)) * up_proj(x)).
class MLP : public torch::nn::Module {
 public:
  MLP(const ModelConfig& config, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x) const;
  std::shared_ptr<Linear> gate_proj, up_proj, down_proj;
};

/// One pre-norm block: x + attn(norm(x)), then x + mlp(norm(x)).
class DecoderLayer : public torch::nn::Module {
 public:
  DecoderLayer(const ModelConfig& config, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x, const RotaryTables& rope, const at::Tensor& visible,
                     const LayerCacheView* cache) const;
  std::shared_ptr<RMSNorm> input_layernorm, post_attention_layernorm;
  std::shared_ptr<Attention> self_attn;
  std::shared_ptr<MLP> mlp;
};

/// One decoder layer's forward on a hidden state h [B, T, hidden], with everything else it needs
/// (the layer, rotary tables, visibility) captured by value: calling it again on the same h gives
/// the same result, so it may be kept and re-run later (recompute).
using LayerCall = std::function<at::Tensor(const at::Tensor& h)>;

/// Runs layer `index` of a full forward: must return what `call(h)` returns, and may wrap the
/// call (FSDP gathers the layer's parameters around it and frees them after). Exceptions
/// propagate out of DecoderBackbone::forward.
using LayerRunner = std::function<at::Tensor(int64_t index, LayerCall call, const at::Tensor& h)>;

/// HF LlamaModel / Qwen2Model ("model."): embed_tokens, layers.N, norm.
class DecoderBackbone : public torch::nn::Module {
 public:
  DecoderBackbone(const ModelConfig& config, const at::TensorOptions& options);

  /// Routes every layer of forward() through `runner` (null: layers are called directly, the
  /// default). forward_step() (KV-cache decoding) always calls the layers directly.
  void set_layer_runner(LayerRunner runner) { layer_runner_ = std::move(runner); }
  /// The installed runner (null when none).
  const LayerRunner& layer_runner() const { return layer_runner_; }

  /// Final-norm hidden states [B, T, hidden] for a whole (left-padded) batch.
  /// REQUIRES: input_ids, attention_mask, position_ids are [B, T] integer tensors.
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                     const at::Tensor& position_ids) const;

  /// Appends T new tokens to `cache` and returns their hidden states [B, T, hidden].
  /// `cache_mask` is [B, >= cache.length() + T]; its first cache.length() + T columns say which
  /// cache columns each row may attend to. Runs without autograd. See KVCache for the contract.
  at::Tensor forward_step(const at::Tensor& input_ids, const at::Tensor& position_ids, KVCache& cache,
                          const at::Tensor& cache_mask) const;

  std::shared_ptr<Embedding> embed_tokens;
  std::vector<std::shared_ptr<DecoderLayer>> layers;  ///< Registered as "layers.0", "layers.1", ...
  std::shared_ptr<RMSNorm> norm;

 private:
  at::Tensor run_layers(at::Tensor h, const at::Tensor& position_ids, const at::Tensor& visible,
                        KVCache* cache) const;
  ModelConfig config_;
  LayerRunner layer_runner_;
};

}  // namespace tessera::models
