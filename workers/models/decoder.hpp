// decoder.hpp: the decoder-only transformer shared by Llama, Qwen2, Qwen3, Qwen2-MoE, Qwen3-MoE,
// Mistral, Gemma2 and Gemma3, as torch::nn modules whose parameters carry HF's names (q_proj.weight,
// input_layernorm.weight, ...).
//
// The maths follows HF's modeling_llama / _qwen2 / _qwen3 / _mistral / _gemma2 / _gemma3 (transformers 5.24):
//   RMSNorm     y = weight * (x_f32 * rsqrt(mean(x_f32^2) + eps)).to(x.dtype)
//               Gemma2: y = (x_f32 * rsqrt(mean(x_f32^2) + eps) * (1 + weight_f32)).to(x.dtype)
//   RoPE        inv_freq = 1 / theta^(arange(0, D, 2) / D), rescaled per config.rope_scaling
//               (linear, dynamic NTK, llama3; see RopeScaling in config.hpp); emb = cat(freqs, freqs);
//               x' = x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1)
//   Qwen3       q_norm / k_norm: RMSNorm over head_dim of every query / key head, after the
//               projection and before RoPE
//   biases      q/k/v when attention_bias (always for Qwen2); o_proj too for Llama and Qwen3
//   attention   softmax(q k^T * D^-0.5, masked) v through at::scaled_dot_product_attention, as
//               HF's sdpa path; GQA heads share K/V (enable_gqa) instead of repeat_kv copies.
//               Gemma2: scale query_pre_attn_scalar^-0.5 and scores tanh(s / c) * c
//               (attn_logit_softcapping), computed as HF's eager path (softmax in fp32)
//   MLP         down(silu(gate(x)) * up(x)); Gemma2: gelu(tanh approximation) instead of silu
//   MoE         Qwen3-MoE/Qwen2-MoE sparse layers: sum over the router's top-k experts e of
//               p_e * expert_e(x), p = softmax(router(x)) in fp32 (renormalised over the top k when
//               norm_topk_prob), cast to x's dtype; Qwen2-MoE adds sigmoid(shared_gate(x)) * shared(x)
//   layer       x + attn(norm(x)), then x + mlp(norm(x)); Gemma2 ("sandwich"): x + norm(attn(norm(x))),
//               then x + norm(mlp(norm(x))) with post_attention / pre_feedforward /
//               post_feedforward layernorms
//   Gemma2      embeddings * sqrt(hidden_size) (a 0-dim fp32 tensor cast to the embedding's dtype),
//               logits tanh(l / c) * c (final_logit_softcapping) in the compute dtype
//   Mistral     Llama's maths with a sliding window
//   Gemma3      Gemma2's (no softcaps by default) with Qwen3's q_norm / k_norm in Gemma's (1 + weight)
//               form, and the sliding layers' RoPE on its own base (rope_local_theta, default type)
// Masking: query t (cache column past + t) sees key column s iff s <= past + t and the key's
// attention-mask bit is 1; a sliding layer (Mistral, Gemma2's even layers) further hides keys more
// than sliding_window visible keys back (Note [Sliding window] in decoder.cpp). A query that would
// see nothing sees its own key (Note [No fully masked query] in decoder.cpp), so a left-padding
// position gets a finite, meaningless output, not NaN.
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
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "workers/models/config.hpp"

namespace tessera::models {

class KVCache;

/// y = x W^T (+ b), with parameters "weight" [out, in] and optionally "bias" [out]; with a LoRA
/// adapter (lora.hpp) y += (x A^T) B^T * lora_scaling while the adapter is enabled.
class Linear : public torch::nn::Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool with_bias, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x) const { return forward(x, /*with_bias=*/true); }
  /// `with_bias` false leaves the bias out (a tensor-parallel caller adds it after its sum).
  at::Tensor forward(const at::Tensor& x, bool with_bias) const;
  at::Tensor weight;
  at::Tensor bias;  ///< Undefined when constructed without bias.
  /// PEFT's lora_A [r, in] and lora_B [out, r] ("<name>.lora_A.weight", ...); null without adapter.
  std::shared_ptr<Linear> lora_A, lora_B;
  double lora_scaling = 0.0;   ///< lora_alpha / r.
  bool adapter_enabled = true; ///< False: the base layer alone (verl's disable_adapter()).
};

/// Token embedding table, parameter "weight" [vocab, hidden].
class Embedding : public torch::nn::Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& ids) const;
  at::Tensor weight;
};

/// HF LlamaRMSNorm / Qwen2RMSNorm, or with `unit_offset` Gemma2RMSNorm; parameter "weight" [hidden].
class RMSNorm : public torch::nn::Module {
 public:
  RMSNorm(int64_t dim, double eps, const at::TensorOptions& options, bool unit_offset = false);
  at::Tensor forward(const at::Tensor& x) const;
  /// (residual + x, forward(residual + x)); without x, (residual, forward(residual)). Under no-grad
  /// on a GPU with `fused`, one kernel (Note [Fused residual norm] in fused_layers.cpp).
  std::pair<at::Tensor, at::Tensor> add_forward(const at::Tensor& residual, const at::Tensor& x) const;
  at::Tensor weight;
  double eps;
  bool unit_offset;  ///< Gemma2: scale by (1 + weight), in fp32.
  bool fused = false;  ///< On a GPU: one fused kernel (model.use_liger; Note [Fused layers]).
};

/// cos/sin tables for one batch of position ids, [B, 1, T, head_dim] in the compute dtype; Gemma3's
/// sliding layers rotate by their own base (ModelConfig::rope_local_theta): local_cos/local_sin,
/// undefined elsewhere.
struct RotaryTables {
  at::Tensor cos;
  at::Tensor sin;
  at::Tensor local_cos;
  at::Tensor local_sin;
};

/// HF's inverse frequencies [head_dim / 2] (fp32, on position_ids' device) for one forward call
/// over `position_ids` [B, T]: config.rope_theta and config.rope_scaling, computed with the same
/// fp32 operations as transformers. "dynamic" uses seq_len = max(position_ids) + 1, as HF's
/// dynamic_rope_update does for each call (a KV-cache step's own positions), chosen on the device
/// without a host sync; `max_position` (0-dim), when given, stands for max(position_ids) (a
/// sequence-parallel slice of a longer row).
at::Tensor rotary_inv_freq(const at::Tensor& position_ids, const ModelConfig& config,
                           const at::Tensor& max_position = at::Tensor());

/// HF's attention_scaling of cos and sin: yarn's attention_factor (given, or from factor, mscale
/// and mscale_all_dim as _compute_yarn_parameters infers it); 1 for every other RoPE type.
double rotary_attention_factor(const ModelConfig& config);

/// HF rotary embedding for `position_ids` [B, T] (computed in fp32, scaled by
/// rotary_attention_factor, cast to `dtype`), with the config's head_dim, rope_theta and
/// rope_scaling (rotary_inv_freq); with rope_local_theta also the sliding layers' tables.
RotaryTables make_rotary_tables(const at::Tensor& position_ids, const ModelConfig& config, c10::ScalarType dtype,
                                const at::Tensor& max_position = at::Tensor());

/// x * cos + rotate_half(x) * sin for x [B, heads, T, head_dim].
at::Tensor apply_rotary(const at::Tensor& x, const RotaryTables& tables);

/// Visibility [B, 1, T, past + T] (bool): key column s visible to query t iff s <= past + t and
/// key_mask[b, s] != 0, and with `window` > 0 fewer than `window` visible keys lie in (s, past + t]
/// (Note [Sliding window]); a query that sees no key sees its own (Note [No fully masked query]).
/// REQUIRES: key_mask is [B, past + T].
at::Tensor attention_visibility(const at::Tensor& key_mask, int64_t query_len, int64_t past_len, int64_t window = 0);

/// The sliding-window visibility [B, columns] (bool, contiguous) of ONE query at column
/// columns - 1 whose visible keys are `visible` [B, >= columns]: the last `window` of them.
at::Tensor last_query_window(const at::Tensor& visible, int64_t columns, int64_t window);

/// Ulysses sequence parallelism (DeepSpeed-Ulysses; verl's ulysses_sequence_parallel_size): the
/// size() ranks of a group each hold an equal slice of one packed row's tokens, and attention
/// trades heads for tokens around itself (Note [Ulysses attention] in decoder.cpp). The exchange
/// is the caller's (it owns the group's communicator); both directions are differentiable, each
/// the other's backward, take inputs of any memory layout and may return strided views (tokens
/// outermost suits the varlen attention call). Implementations throw on a failed exchange.
class SequenceParallelExchange {
 public:
  virtual ~SequenceParallelExchange() = default;
  /// This rank's place in the group and the group's size.
  virtual int64_t rank() const = 0;
  virtual int64_t size() const = 0;
  /// x [1, H, n, D] (this rank's n tokens, every head) -> [1, H / size(), size() * n, D]: every
  /// rank's tokens, in rank order, of this rank's heads [rank() * H / size(), (rank() + 1) * H / size()).
  virtual at::Tensor gather_tokens(const at::Tensor& x) const = 0;
  /// The inverse: [1, H / size(), size() * n, D] -> [1, H, n, D].
  virtual at::Tensor scatter_tokens(const at::Tensor& x) const = 0;
};

/// Sequences packed end to end in one row, without padding (verl's use_remove_padding): sequence i
/// is tokens [starts[i], starts[i + 1]) of the row, and attends causally within itself only.
/// Offsets are on the host (the attention loops over them). See Note [Packed sequences].
struct PackedSegments {
  std::vector<int64_t> starts;  ///< Non-decreasing; starts.front() == 0, starts.back() == N.
  /// Optional: `starts` as int32 on the device the tokens are on (varlen flash attention's
  /// cumulative lengths), uploaded once for every layer by whoever packs; else each layer uploads.
  /// Whoever changes `starts` afterwards resets it.
  at::Tensor device_starts;
  /// With Ulysses sequence parallelism: `starts` describe the whole row of N tokens, which is cut
  /// into size() equal slices (N divisible by size()); a forward's tokens are this rank's slice.
  std::shared_ptr<const SequenceParallelExchange> sequence_parallel;
  /// With sequence parallelism: the largest position id of the whole row (0-dim, on the tokens'
  /// device), which dynamic RoPE scales by (rotary_inv_freq) where a slice alone would show less.
  at::Tensor max_position;
  /// Tokens of the row this rank's forward takes: N, or N / size() with sequence parallelism.
  int64_t local_tokens() const {
    const int64_t n = starts.empty() ? 0 : starts.back();
    return sequence_parallel ? n / sequence_parallel->size() : n;
  }
};

/// Why `config` cannot run with Ulysses groups of `size` ranks (as verl requires: the query heads
/// divide evenly, and so do the key/value heads, or the group size is a multiple of them and they
/// are repeated), or OK. `key` names the setting in the error.
Status check_sequence_parallel(const ModelConfig& config, int64_t size, const std::string& key);

/// Where one layer reads and writes its keys/values during incremental decoding.
struct LayerCacheView {
  at::Tensor key;    ///< [B, kv_heads, capacity, head_dim]
  at::Tensor value;  ///< [B, kv_heads, capacity, head_dim]
  int64_t past = 0;  ///< Columns already filled; new keys go to [past, past + T).
};

/// HF LlamaAttention / Qwen2Attention / Qwen3Attention / MistralAttention / Gemma2Attention: q/k/v/o
/// projections (biases as config.attention_bias and ModelConfig::o_proj_bias say), for Qwen3
/// q_norm / k_norm, for Gemma2 its scale and score softcap. Layer `layer_index` picks the window.
class Attention : public torch::nn::Module {
 public:
  Attention(const ModelConfig& config, const at::TensorOptions& options, int64_t layer_index = 0);
  /// x [B, T, hidden]; visible [B, 1, T, S]; cache null for a full forward (S == T). With
  /// `output_bias` false the o_proj bias (if any) is left out, for a caller that adds it after a
  /// tensor-parallel sum of the partial outputs.
  /// With `packed` (x [1, N, hidden], no cache), `visible` is ignored: each packed sequence
  /// attends causally (and within the window) to itself.
  at::Tensor forward(const at::Tensor& x, const RotaryTables& rope, const at::Tensor& visible,
                     const LayerCacheView* cache, bool output_bias = true,
                     const PackedSegments* packed = nullptr) const;
  /// Queries [B, heads, T, D] and keys [B, kv_heads, T, D] of x [B, T, hidden]: projected,
  /// per-head normed (Qwen3) and rotated.
  std::pair<at::Tensor, at::Tensor> queries_and_keys(const at::Tensor& x, const RotaryTables& rope) const;
  /// Values [B, kv_heads, T, D] of x [B, T, hidden].
  at::Tensor values(const at::Tensor& x) const;
  /// o_proj of the attention output [B, T, heads * D] (bias included when `output_bias`).
  at::Tensor output(const at::Tensor& attended, bool output_bias = true) const;
  /// Attention of queries q [B, heads, T, D] over keys/values [B, kv_heads, S, D] where
  /// `visible` [B, 1, T, S] (bool) is true, with this layer's scale and softcap: [B, heads, T, D].
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& visible) const;

  /// Scores scaled by head_dim^-0.5 with no softcap: what a plain SDPA kernel computes.
  bool plain_scores() const { return plain_scores_; }
  /// The score scale (head_dim^-0.5; Gemma2: query_pre_attn_scalar^-0.5) and softcap (Gemma2).
  double scaling() const { return scaling_; }
  std::optional<double> softcap() const { return softcap_; }
  /// The sliding window of this layer (0: none).
  int64_t window() const { return window_; }

  std::shared_ptr<Linear> q_proj, k_proj, v_proj, o_proj;
  std::shared_ptr<RMSNorm> q_norm, k_norm;  ///< Qwen3 only ([head_dim] weights); null otherwise.
  bool fused_rotary = false;  ///< On a GPU: one rotary kernel (model.use_liger; Note [Fused layers]).

 private:
  at::Tensor softcapped_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& visible) const;
  at::Tensor packed_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const PackedSegments& packed) const;
  at::Tensor ulysses_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const PackedSegments& packed) const;
  int64_t num_heads_, num_kv_heads_, head_dim_;
  double scaling_;
  std::optional<double> softcap_;
  int64_t window_ = 0;
  bool plain_scores_ = true;
  bool local_rope_ = false;  ///< RotaryTables::local_cos/local_sin (ModelConfig::layer_local_rope).
};

/// HF LlamaMLP (SwiGLU): down_proj(silu(gate_proj(x)) * up_proj(x)); Gemma2MLP (GeGLU) with
/// gelu(approximate="tanh") in place of silu.
class MLP : public torch::nn::Module {
 public:
  /// `intermediate_size` 0: the config's (a MoE model's shared expert has its own).
  MLP(const ModelConfig& config, const at::TensorOptions& options, int64_t intermediate_size = 0);
  at::Tensor forward(const at::Tensor& x) const;
  std::shared_ptr<Linear> gate_proj, up_proj, down_proj;
  bool fused_swiglu = false;  ///< On a GPU, SwiGLU only: one kernel (model.use_liger; Note [Fused layers]).

 private:
  bool gelu_tanh_ = false;
};

/// HF Qwen3MoeSparseMoeBlock / Qwen2MoeSparseMoeBlock, the "mlp." of a sparse layer (MoeConfig):
///   gate.weight            [E, hidden]     the router (a parameter, not a Linear: PEFT leaves it alone)
///   experts.gate_proj      [E, I, hidden]  every expert's gate_proj.weight, stacked
///   experts.up_proj        [E, I, hidden]
///   experts.down_proj      [E, hidden, I]
///   shared_expert.*        Qwen2-MoE: an MLP of shared_expert_intermediate_size
///   shared_expert_gate     Qwen2-MoE: Linear [1, hidden]
/// HF checkpoints name the experts one by one (experts.<e>.gate_proj.weight; transformers 5 holds
/// them fused as experts.gate_up_proj): the loader stacks them and the HF writers unstack them
/// (load_hf_decoder_weights / to_hf_checkpoint_tensors in weight_loader.hpp). Note [MoE experts] in
/// decoder.cpp says how tokens reach their experts.
class SparseMoeBlock : public torch::nn::Module {
 public:
  SparseMoeBlock(const ModelConfig& config, const at::TensorOptions& options);
  /// x [..., hidden] -> [..., hidden].
  at::Tensor forward(const at::Tensor& x) const;
  at::Tensor router;                              ///< "gate.weight"
  at::Tensor gate_proj, up_proj, down_proj;       ///< "experts.gate_proj", ...
  std::shared_ptr<MLP> shared_expert;             ///< Qwen2-MoE only.
  std::shared_ptr<Linear> shared_expert_gate;     ///< Qwen2-MoE only.
  bool fused_swiglu = false;  ///< On a GPU: the experts' SwiGLU in one kernel (model.use_liger).

 private:
  int64_t top_k_;
  bool norm_topk_prob_;
};

/// Rows of a MoE block's grouped GEMMs start each expert's group on a multiple of this.
inline constexpr int64_t kExpertGroupRows = 8;

/// Where the rows of a MoE block go (Note [MoE experts] in decoder.cpp), for `sorted_ids` [R]
/// (int64, ascending, each in [0, num_experts)): row p of the sorted rows goes to row
/// destination[p] of a buffer of `capacity` rows, in which expert e's group is rows
/// [ends[e-1], ends[e]) (ends: int32 [E], the grouped GEMM's offsets). Every group but the last
/// starts and ends on a multiple of kExpertGroupRows; the last ends at capacity =
/// R + E * (kExpertGroupRows - 1).
/// Computed on the ids' device without reading them on the host.
struct ExpertGroups {
  at::Tensor destination;  ///< int64 [R]
  at::Tensor ends;         ///< int32 [E]
  int64_t capacity = 0;
};
ExpertGroups group_rows_by_expert(const at::Tensor& sorted_ids, int64_t num_experts);

/// One pre-norm block: x + attn(norm(x)), then x + mlp(norm(x)); Gemma2 norms the attention and
/// MLP outputs too (decoder.hpp's header). The steps are public so the rollout engine can put its
/// tensor-parallel reductions between them.
class DecoderLayer : public torch::nn::Module {
 public:
  DecoderLayer(const ModelConfig& config, const at::TensorOptions& options, int64_t layer_index = 0);
  /// `visible` is the full-attention visibility, `visible_window` the sliding one (undefined when
  /// no layer slides); the layer uses the one its attention needs.
  at::Tensor forward(const at::Tensor& x, const RotaryTables& rope, const at::Tensor& visible,
                     const at::Tensor& visible_window, const LayerCacheView* cache,
                     const PackedSegments* packed = nullptr) const;
  /// h + (post-norm of) the attention output `attn`.
  at::Tensor add_attention(const at::Tensor& h, const at::Tensor& attn) const;
  /// The MLP's input: post_attention_layernorm(h), Gemma2 pre_feedforward_layernorm(h).
  at::Tensor mlp_input(const at::Tensor& h) const;
  /// h + (post-norm of) the MLP output `m`.
  at::Tensor add_mlp(const at::Tensor& h, const at::Tensor& m) const;
  /// The MLP (or, on a sparse layer, the MoE block) of its input x.
  at::Tensor feed_forward(const at::Tensor& x) const { return moe ? moe->forward(x) : mlp->forward(x); }

  std::shared_ptr<RMSNorm> input_layernorm, post_attention_layernorm;
  std::shared_ptr<RMSNorm> pre_feedforward_layernorm, post_feedforward_layernorm;  ///< Gemma2 only.
  std::shared_ptr<Attention> self_attn;
  std::shared_ptr<MLP> mlp;             ///< A dense layer's; null on a sparse layer.
  std::shared_ptr<SparseMoeBlock> moe;  ///< A sparse layer's ("mlp."); null on a dense layer.
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

  /// The token embeddings [B, T, hidden] of input_ids (Gemma2: times sqrt(hidden_size)).
  at::Tensor embed(const at::Tensor& input_ids) const;

  /// The visibility a layer with `window` needs (attention_visibility); an undefined tensor when
  /// no layer slides.
  at::Tensor window_visibility(const at::Tensor& key_mask, int64_t query_len, int64_t past_len) const;

  /// Final-norm hidden states [B, T, hidden] for a whole (left-padded) batch.
  /// REQUIRES: input_ids, attention_mask, position_ids are [B, T] integer tensors.
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                     const at::Tensor& position_ids) const;

  /// Final-norm hidden states [1, N, hidden] of sequences packed without padding: input_ids and
  /// position_ids [1, N] (each sequence's own positions), `packed` the sequence boundaries.
  at::Tensor forward_packed(const at::Tensor& input_ids, const at::Tensor& position_ids,
                            std::shared_ptr<const PackedSegments> packed) const;

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
                        const at::Tensor& visible_window, KVCache* cache,
                        std::shared_ptr<const PackedSegments> packed = nullptr) const;
  ModelConfig config_;
  LayerRunner layer_runner_;
};

}  // namespace tessera::models
