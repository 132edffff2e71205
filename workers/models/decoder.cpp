// decoder.cpp: the forward maths. See decoder.hpp for the formulas and the masking rule.
#include "workers/models/decoder.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "proto/device.hpp"
#include "proto/host_transfer.hpp"
#include "workers/models/fused_layers.hpp"
#include "workers/models/kv_cache.hpp"

namespace tessera::models {

Linear::Linear(int64_t in_features, int64_t out_features, bool with_bias, const at::TensorOptions& options) {
  weight = register_parameter("weight", at::empty({out_features, in_features}, options));
  if (with_bias) bias = register_parameter("bias", at::empty({out_features}, options));
}

at::Tensor Linear::forward(const at::Tensor& x, bool with_bias) const {
  at::Tensor y = at::linear(x, weight, with_bias ? bias : at::Tensor());
  if (!lora_A || !adapter_enabled) return y;
  // PEFT's LoraLayer, result + lora_B(lora_A(x)) * scaling (lora_dropout 0, as verl configures
  // it), with the scale and the sum inside lora_B's GEMM: one kernel instead of three, and no
  // [.., out] temporary.
  const at::Tensor xa = at::linear(x, lora_A->weight);
  return at::addmm(y.reshape({-1, y.size(-1)}), xa.reshape({-1, xa.size(-1)}), lora_B->weight.t(), 1.0, lora_scaling)
      .view(y.sizes());
}

namespace {

// Whether a layer with its fused switch `on` runs the fused kernel on x: on a GPU, once the
// kernels have passed their check for x's device and dtype (Note [Fused layers]).
bool use_fused(bool on, const at::Tensor& x, Status (*check)(c10::Device, c10::ScalarType) = check_fused_layers) {
  if (!on || !x.is_cuda()) return false;
  const Status checked = check(x.device(), x.scalar_type());
  TORCH_CHECK(checked.ok(), checked.to_string());
  return true;
}

}  // namespace

Embedding::Embedding(int64_t num_embeddings, int64_t dim, const at::TensorOptions& options) {
  weight = register_parameter("weight", at::empty({num_embeddings, dim}, options));
}

at::Tensor Embedding::forward(const at::Tensor& ids) const { return at::embedding(weight, ids); }

RMSNorm::RMSNorm(int64_t dim, double eps_, const at::TensorOptions& options, bool unit_offset_)
    : eps(eps_), unit_offset(unit_offset_) {
  weight = register_parameter("weight", at::empty({dim}, options));
}

at::Tensor RMSNorm::forward(const at::Tensor& x) const {
  if (!unit_offset && use_fused(fused, x)) {
    // One kernel each way (PyTorch's fused RMSNorm, fp32 inside, its own backward) for the seven
    // element-wise ops below; the weight multiply stays in x's dtype after the cast, as in HF.
    return weight * std::get<0>(at::_fused_rms_norm(x, {x.size(-1)}, std::nullopt, eps));
  }
  at::Tensor h = x.to(at::kFloat);
  at::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * at::rsqrt(variance + eps);
  // Gemma2 scales in fp32 and casts after; Llama casts first (HF PR 29402).
  if (unit_offset) return (h * (weight.to(at::kFloat) + 1.0)).to(x.scalar_type());
  return weight * h.to(x.scalar_type());
}

std::pair<at::Tensor, at::Tensor> RMSNorm::add_forward(const at::Tensor& residual, const at::Tensor& x) const {
  if (!unit_offset && !at::GradMode::is_enabled() && fused_add_rms_norm_takes(residual, x, weight) &&
      use_fused(fused, residual, check_fused_residual_norm)) {
    return fused_add_rms_norm(residual, x, weight, eps);
  }
  at::Tensor sum = x.defined() ? residual + x : residual;
  return {sum, forward(sum)};
}

namespace {

// Each formula below repeats transformers' fp32 tensor operations one for one (modeling_rope_utils.py:
// `1.0 / t` is t.reciprocal(), `x / t` is t.reciprocal() * x), so the frequencies agree bit for bit.

// _compute_llama3_parameters on the default frequencies.
at::Tensor llama3_inv_freq(const at::Tensor& inv_freq, const ModelConfig& c) {
  const RopeScaling& r = c.rope_scaling;
  const double old_context = static_cast<double>(c.rope_original_context());
  const double low_freq_wavelen = old_context / r.low_freq_factor;
  const double high_freq_wavelen = old_context / r.high_freq_factor;
  at::Tensor wavelen = inv_freq.reciprocal() * (2.0 * M_PI);
  // wavelen > low_freq_wavelen: divided by factor; < high_freq_wavelen: kept; otherwise smoothed.
  at::Tensor scaled = at::where(wavelen.gt(low_freq_wavelen), inv_freq / r.factor, inv_freq);
  at::Tensor smooth = (wavelen.reciprocal() * old_context - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  at::Tensor smoothed = at::rsub(smooth, 1.0) * scaled / r.factor + smooth * scaled;
  at::Tensor medium = wavelen.ge(high_freq_wavelen).logical_and(wavelen.le(low_freq_wavelen));
  return at::where(medium, smoothed, scaled);
}

// _compute_yarn_parameters' frequencies: the interpolated (/ factor) and original ones blended
// along a linear ramp over the dimensions [low, high] that turn beta_fast and beta_slow times over
// the original context (in double, as Python computes them), the blend in fp32 tensor ops.
at::Tensor yarn_inv_freq(const at::Tensor& exponent, const ModelConfig& c) {
  const RopeScaling& r = c.rope_scaling;
  const double dim = static_cast<double>(c.head_dim), base = c.rope_theta;
  const double original = static_cast<double>(c.rope_original_context());
  const auto correction_dim = [&](double rotations) {
    return (dim * std::log(original / (rotations * 2.0 * M_PI))) / (2.0 * std::log(base));
  };
  double low = correction_dim(r.beta_fast), high = correction_dim(r.beta_slow);
  if (r.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1.0);
  if (low == high) high += 0.001;  // HF: prevents the ramp's singularity
  at::Tensor pos_freqs = at::pow(base, exponent);
  at::Tensor extrapolation = pos_freqs.reciprocal();
  at::Tensor interpolation = (pos_freqs * r.factor).reciprocal();  // 1.0 / (factor * pos_freqs)
  at::Tensor ramp = ((at::arange(c.head_dim / 2, exponent.options()) - low) / (high - low)).clamp(0, 1);
  at::Tensor extrapolation_factor = at::rsub(ramp, 1.0);
  return interpolation * at::rsub(extrapolation_factor, 1.0) + extrapolation * extrapolation_factor;
}

// _compute_dynamic_ntk_parameters as dynamic_rope_update applies it to one call: the frequencies
// for seq_len = max(position_ids) + 1 when that exceeds max_position_embeddings, else the ones HF
// computes at construction (seq_len = max_position_embeddings, in double). Both are computed and
// the choice is made on the device, so no host sync.
at::Tensor dynamic_inv_freq(const at::Tensor& position_ids, const at::Tensor& exponent, const ModelConfig& c,
                            const at::Tensor& max_position) {
  const double factor = c.rope_scaling.factor, dim = static_cast<double>(c.head_dim);
  const double max_positions = static_cast<double>(c.max_position_embeddings);
  const double initial_base =
      c.rope_theta * std::pow(factor * max_positions / max_positions - (factor - 1.0), dim / (dim - 2.0));
  at::Tensor initial = at::pow(initial_base, exponent).reciprocal();
  at::Tensor seq_len = (max_position.defined() ? max_position : position_ids.max()) + 1;  // 0-dim long
  at::Tensor grown_base =
      at::pow(seq_len.to(at::kFloat) * factor / max_positions - (factor - 1.0), dim / (dim - 2.0)) * c.rope_theta;
  at::Tensor grown = at::pow(grown_base, exponent).reciprocal();
  return at::where(seq_len.gt(c.max_position_embeddings), grown, initial);
}

}  // namespace

namespace {

// HF's arange(0, D, 2) / D in fp32, on `device`.
at::Tensor rope_exponent(const ModelConfig& c, const c10::Device& device) {
  auto long_opts = at::TensorOptions().dtype(at::kLong).device(device);
  return at::arange(0, c.head_dim, 2, long_opts).to(at::kFloat) / static_cast<double>(c.head_dim);
}

// cos and sin [B, 1, T, D] of `position_ids` under `inv_freq`, times `scale` in fp32, cast to `dtype`.
std::pair<at::Tensor, at::Tensor> cos_sin(const at::Tensor& position_ids, const at::Tensor& inv_freq, double scale,
                                          c10::ScalarType dtype) {
  at::Tensor freqs = position_ids.to(at::kFloat).unsqueeze(-1) * inv_freq;             // [B, T, D/2]
  at::Tensor emb = at::cat({freqs, freqs}, -1).unsqueeze(1);                           // [B, 1, T, D]
  if (scale == 1.0) return {emb.cos().to(dtype), emb.sin().to(dtype)};
  return {(emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)};
}

}  // namespace

at::Tensor rotary_inv_freq(const at::Tensor& position_ids, const ModelConfig& c, const at::Tensor& max_position) {
  at::Tensor exponent = rope_exponent(c, position_ids.device());
  const std::string& type = c.rope_scaling.rope_type;
  if (type == "dynamic") return dynamic_inv_freq(position_ids, exponent, c, max_position);
  at::Tensor inv_freq = at::pow(c.rope_theta, exponent).reciprocal();                   // [D/2]
  if (type == "linear") return inv_freq / c.rope_scaling.factor;
  if (type == "llama3") return llama3_inv_freq(inv_freq, c);
  if (type == "yarn") return yarn_inv_freq(exponent, c);
  // parse_model_config refuses every other type naming config.json; reaching here is a bug.
  TORCH_CHECK(type == "default", "rotary_inv_freq: rope_scaling type '", type, "' got past parse_model_config");
  return inv_freq;
}

double rotary_attention_factor(const ModelConfig& c) {
  const RopeScaling& r = c.rope_scaling;
  if (r.rope_type != "yarn") return 1.0;
  if (r.attention_factor) return *r.attention_factor;
  const auto mscale = [&](double m) { return r.factor <= 1.0 ? 1.0 : 0.1 * m * std::log(r.factor) + 1.0; };
  if (r.mscale != 0.0 && r.mscale_all_dim != 0.0) return mscale(r.mscale) / mscale(r.mscale_all_dim);
  return mscale(1.0);
}

RotaryTables make_rotary_tables(const at::Tensor& position_ids, const ModelConfig& config, c10::ScalarType dtype,
                                const at::Tensor& max_position) {
  RotaryTables tables;
  // HF scales yarn's cos and sin in fp32 before the cast.
  const double scale = config.rope_scaling.rope_type == "yarn" ? rotary_attention_factor(config) : 1.0;
  std::tie(tables.cos, tables.sin) =
      cos_sin(position_ids, rotary_inv_freq(position_ids, config, max_position), scale, dtype);
  if (config.rope_local_theta) {  // Gemma3's sliding layers: default RoPE on their own base
    at::Tensor local_inv_freq = at::pow(*config.rope_local_theta, rope_exponent(config, position_ids.device())).reciprocal();
    std::tie(tables.local_cos, tables.local_sin) = cos_sin(position_ids, local_inv_freq, 1.0, dtype);
  }
  return tables;
}

at::Tensor apply_rotary(const at::Tensor& x, const RotaryTables& tables) {
  int64_t half = x.size(-1) / 2;
  at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * tables.cos + rotated * tables.sin;
}

// Note [No fully masked query]: a query that sees no key at all sees its own. A left-padding
// position, or a row with holes in its KV cache columns, may have all of its keys masked; attention over
// nothing is NaN in most SDPA kernels, and a NaN that reaches a cached value poisons every later
// read of that cache (a masked key still costs 0 x NaN). Those positions' outputs are never read,
// so letting them see themselves changes no result and keeps every value finite; every other
// query keeps its mask exactly. Done once per forward here, not per layer.
//
// Note [Sliding window]
// HF masks a sliding layer's key column kv_idx for query column q_idx unless
// kv_idx > q_idx - sliding_window (masking_utils.sliding_window_overlay), on batches whose rows are
// left-padded and then contiguous, so q_idx - kv_idx is the number of the row's tokens in
// (kv_idx, q_idx]. We count those tokens instead of columns: key s stays visible iff fewer than
// `window` visible keys lie in (s, q]. On every batch HF builds the two rules agree; the count
// also stays right where a row's columns have holes (a KVCache row may have them, kv_cache.hpp).
at::Tensor attention_visibility(const at::Tensor& key_mask, int64_t query_len, int64_t past_len, int64_t window) {
  int64_t total = past_len + query_len;
  auto long_opts = at::TensorOptions().dtype(at::kLong).device(key_mask.device());
  at::Tensor query_col = at::arange(past_len, total, long_opts).unsqueeze(1);  // [T, 1]
  at::Tensor key_col = at::arange(0, total, long_opts).unsqueeze(0);           // [1, S]
  at::Tensor causal = key_col.le(query_col);                                   // [T, S]
  at::Tensor keys = key_mask.ne(0).view({key_mask.size(0), 1, 1, total});     // [B, 1, 1, S]
  at::Tensor visible = causal.view({1, 1, query_len, total}).logical_and(keys);  // [B, 1, T, S]
  if (window > 0) {
    at::Tensor seen = keys.to(at::kLong).cumsum(-1);                            // [B, 1, 1, S] keys in [0, s]
    at::Tensor at_query = seen.narrow(-1, past_len, query_len).transpose(-1, -2);  // [B, 1, T, 1]
    visible = visible.logical_and((at_query - seen).lt(window));               // [B, 1, T, S]
  }
  at::Tensor blind = visible.any(-1, /*keepdim=*/true).logical_not();          // [B, 1, T, 1]
  return visible.logical_or(blind.logical_and(key_col.eq(query_col).view({1, 1, query_len, total})));
}

at::Tensor last_query_window(const at::Tensor& visible, int64_t columns, int64_t window) {
  at::Tensor keys = visible.narrow(1, 0, columns).to(at::kBool);
  at::Tensor seen = keys.to(at::kLong).cumsum(1);                               // [B, columns]
  at::Tensor total = seen.narrow(1, columns - 1, 1);                            // [B, 1]
  return keys.logical_and((total - seen).lt(window)).contiguous();
}

namespace {

// [B, T, heads * D] -> [B, heads, T, D]
at::Tensor split_heads(const at::Tensor& x, int64_t heads, int64_t head_dim) {
  return x.view({x.size(0), x.size(1), heads, head_dim}).transpose(1, 2);
}

}  // namespace

// Registration order is HF's (q, k, v, o, q_norm, k_norm): FSDP flattens parameters in this order.
Attention::Attention(const ModelConfig& c, const at::TensorOptions& options, int64_t layer_index)
    : num_heads_(c.num_attention_heads),
      num_kv_heads_(c.num_key_value_heads),
      head_dim_(c.head_dim),
      scaling_(1.0 / std::sqrt(static_cast<double>(c.head_dim))),
      softcap_(c.attn_logit_softcapping) {
  if (c.layer_slides(layer_index)) window_ = *c.sliding_window;
  local_rope_ = c.layer_local_rope(layer_index);
  // HF Gemma2: config.query_pre_attn_scalar**-0.5 (Python's pow).
  if (c.query_pre_attn_scalar > 0.0) scaling_ = std::pow(c.query_pre_attn_scalar, -0.5);
  plain_scores_ = !softcap_ && c.query_pre_attn_scalar <= 0.0;
  q_proj = register_module("q_proj", std::make_shared<Linear>(c.hidden_size, num_heads_ * head_dim_, c.attention_bias, options));
  k_proj = register_module("k_proj", std::make_shared<Linear>(c.hidden_size, num_kv_heads_ * head_dim_, c.attention_bias, options));
  v_proj = register_module("v_proj", std::make_shared<Linear>(c.hidden_size, num_kv_heads_ * head_dim_, c.attention_bias, options));
  o_proj = register_module("o_proj", std::make_shared<Linear>(num_heads_ * head_dim_, c.hidden_size, c.o_proj_bias(), options));
  if (c.qk_norm()) {
    q_norm = register_module("q_norm", std::make_shared<RMSNorm>(head_dim_, c.rms_norm_eps, options, c.gemma_norms()));
    k_norm = register_module("k_norm", std::make_shared<RMSNorm>(head_dim_, c.rms_norm_eps, options, c.gemma_norms()));
  }
}

std::pair<at::Tensor, at::Tensor> Attention::queries_and_keys(const at::Tensor& x, const RotaryTables& rope) const {
  // [B, heads, T, D]: RMSNorm over the last dim is per head and position, as HF's norm on [B, T, heads, D].
  at::Tensor q = split_heads(q_proj->forward(x), num_heads_, head_dim_);
  at::Tensor k = split_heads(k_proj->forward(x), num_kv_heads_, head_dim_);
  if (q_norm) q = q_norm->forward(q);
  if (k_norm) k = k_norm->forward(k);
  const at::Tensor& cos = local_rope_ ? rope.local_cos : rope.cos;
  const at::Tensor& sin = local_rope_ ? rope.local_sin : rope.sin;
  TORCH_CHECK(cos.defined(), "Attention: no local RoPE tables for a Gemma3 sliding layer (make_rotary_tables)");
  if (use_fused(fused_rotary, q) && q.scalar_type() == cos.scalar_type()) {
    return {models::fused_rotary(q, cos, sin), models::fused_rotary(k, cos, sin)};
  }
  const RotaryTables tables{cos, sin, {}, {}};
  return {apply_rotary(q, tables), apply_rotary(k, tables)};
}

at::Tensor Attention::values(const at::Tensor& x) const {
  return split_heads(v_proj->forward(x), num_kv_heads_, head_dim_);
}

at::Tensor Attention::output(const at::Tensor& attended, bool output_bias) const {
  return o_proj->forward(attended, output_bias);
}

at::Tensor Attention::forward(const at::Tensor& x, const RotaryTables& rope, const at::Tensor& visible,
                              const LayerCacheView* cache, bool output_bias, const PackedSegments* packed) const {
  const int64_t B = x.size(0), T = x.size(1);
  std::pair<at::Tensor, at::Tensor> qk = queries_and_keys(x, rope);
  at::Tensor q = std::move(qk.first), k = std::move(qk.second);
  at::Tensor v = values(x);
  if (packed != nullptr) {
    TORCH_CHECK(cache == nullptr && B == 1, "Attention: packed sequences need one row and no cache");
    at::Tensor attended = packed->sequence_parallel ? ulysses_attention(q, k, v, *packed)
                                                    : packed_attention(q, k, v, *packed);
    return output(attended.transpose(1, 2).reshape({B, T, num_heads_ * head_dim_}), output_bias);
  }
  if (cache != nullptr) {
    cache->key.narrow(2, cache->past, T).copy_(k);
    cache->value.narrow(2, cache->past, T).copy_(v);
    k = cache->key.narrow(2, 0, cache->past + T);
    v = cache->value.narrow(2, 0, cache->past + T);
  }
  return output(attend(q, k, v, visible).transpose(1, 2).reshape({B, T, num_heads_ * head_dim_}), output_bias);
}

at::Tensor Attention::attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& visible) const {
  // LibTorch's fused attention (flash / memory-efficient on a GPU, the flash CPU kernel on the
  // host); grouped-query heads share their K/V without repeat_kv copies. No fused kernel softcaps.
  return softcap_ ? softcapped_attention(q, k, v, visible)
                  : at::scaled_dot_product_attention(q, k, v, visible, /*dropout_p=*/0.0, /*is_causal=*/false,
                                                     scaling_, /*enable_gqa=*/num_heads_ != num_kv_heads_);
}

// Note [Ulysses attention]
// With sequence parallelism (DeepSpeed-Ulysses, as verl's ulysses_sequence_parallel_size) each of
// the group's ranks runs the projections, norms, rotary and MLP on its own slice of the packed
// row's tokens; only attention needs every token of a sequence. Around it, one all-to-all turns
// "my tokens, all heads" into "all tokens, my heads" for q, k and v, the packed attention runs on
// the whole row (its segment offsets are the row's) for this rank's heads, and a second all-to-all
// turns the output back. Key/value heads fewer than the group are first repeated up to it (verl's
// repeat of size / kv_heads), so that each rank's query heads meet their own KV head: with H
// query heads in groups of g per KV head, rank r holds query heads [r H / size, (r + 1) H / size)
// and KV heads [r kv' / size, ...) of the kv' = kv * repeats repeated ones, which are the same
// original heads. Exact: each head's attention is the unsplit forward's, on the same tokens.
at::Tensor Attention::ulysses_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const PackedSegments& packed) const {
  const SequenceParallelExchange& sp = *packed.sequence_parallel;
  const int64_t repeats = std::max<int64_t>(sp.size() / num_kv_heads_, 1);
  auto spread = [&](const at::Tensor& t) { return sp.gather_tokens(repeats > 1 ? t.repeat_interleave(repeats, 1) : t); };
  return sp.scatter_tokens(packed_attention(sp.gather_tokens(q), spread(k), spread(v), packed));
}

Status check_sequence_parallel(const ModelConfig& config, int64_t size, const std::string& key) {
  if (size < 1) return make_error(ErrorCode::invalid_argument, "{} = {} must be >= 1", key, size);
  if (size == 1) return Status();
  const int64_t heads = config.num_attention_heads, kv = config.num_key_value_heads;
  if (heads % size != 0) {
    return make_error(ErrorCode::invalid_argument, "{} = {} must divide the model's num_attention_heads = {}", key,
                      size, heads);
  }
  if (kv % size != 0 && size % kv != 0) {
    return make_error(ErrorCode::invalid_argument,
                      "{} = {} must divide the model's num_key_value_heads = {} or be a multiple of it", key, size, kv);
  }
  return Status();
}

// Note [Packed sequences]
// Padding-free batches (use_remove_padding) put every sequence's real tokens end to end in one row
// [1, N]; the projections, norms and MLP then do no work on padding. Attention must not cross
// sequences: it runs once per sequence on its slice of q/k/v, causal (plus the sliding window),
// which equals the padded batch's masked attention on the real tokens. On a GPU in bf16/fp16 (no
// softcap) that is one varlen flash-attention call over all sequences; elsewhere a loop over the
// sequences (causal SDPA, or a mask for a window or softcap). Rotary embeddings take the packed
// position ids, so each sequence keeps its own positions.
at::Tensor Attention::packed_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const PackedSegments& packed) const {
  const auto dtype = q.scalar_type();
  if (q.is_cuda() && (dtype == at::kBFloat16 || dtype == at::kHalf) && !softcap_ && head_dim_ % 8 == 0 &&
      head_dim_ <= 256) {
    // One varlen flash-attention call over every sequence (what verl's use_remove_padding runs):
    // [N, heads, D] layout, int32 cumulative lengths, grouped K/V heads read in place. A window W
    // keeps keys with t - s < W: flash's window_size_left = W - 1.
    int64_t longest = 0;
    for (size_t i = 0; i + 1 < packed.starts.size(); ++i) {
      longest = std::max(longest, packed.starts[i + 1] - packed.starts[i]);
    }
    const at::Tensor cum =
        packed.device_starts.defined() && packed.device_starts.device() == q.device()
            ? packed.device_starts
            : proto::upload(std::vector<int32_t>(packed.starts.begin(), packed.starts.end()),
                            q.device());  // Note [Host transfers]
    auto heads_first = [](const at::Tensor& t) { return t.squeeze(0).transpose(0, 1).contiguous(); };
    std::optional<int64_t> left, right;
    if (window_ > 0) {
      left = window_ - 1;
      right = 0;
    }
    at::Tensor out = std::get<0>(at::_flash_attention_forward(heads_first(q), heads_first(k), heads_first(v), cum, cum,
                                                              longest, longest, /*dropout_p=*/0.0, /*is_causal=*/true,
                                                              /*return_debug_mask=*/false, scaling_, left, right));
    return out.transpose(0, 1).unsqueeze(0);  // [1, heads, N, D]
  }
  // The head counts are the tensors' (Ulysses gives a rank a share of them).
  const bool grouped = q.size(1) != k.size(1);
  std::vector<at::Tensor> parts;
  parts.reserve(packed.starts.size());
  for (size_t i = 0; i + 1 < packed.starts.size(); ++i) {
    const int64_t start = packed.starts[i], len = packed.starts[i + 1] - start;
    if (len == 0) continue;
    at::Tensor qs = q.narrow(2, start, len), ks = k.narrow(2, start, len), vs = v.narrow(2, start, len);
    if (softcap_ || window_ > 0) {
      at::Tensor seen = attention_visibility(at::ones({1, len}, q.options().dtype(at::kLong)), len, 0, window_);
      parts.push_back(softcap_ ? softcapped_attention(qs, ks, vs, seen)
                               : at::scaled_dot_product_attention(qs, ks, vs, seen, 0.0, false, scaling_, grouped));
    } else {
      parts.push_back(at::scaled_dot_product_attention(qs, ks, vs, {}, 0.0, /*is_causal=*/true, scaling_, grouped));
    }
  }
  return at::cat(parts, 2);
}

// HF Gemma2's eager_attention_forward: scores * scaling, tanh softcap, mask, softmax in fp32 cast
// back, times V. Queries are grouped [B, kv, groups * T, D] so each KV head is read in place
// (HF's repeat_kv copies give the same sums).
at::Tensor Attention::softcapped_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                           const at::Tensor& visible) const {
  // The head counts are the tensors' (Ulysses gives a rank a share of them).
  const int64_t B = q.size(0), heads = q.size(1), kv_heads = k.size(1), T = q.size(2), S = k.size(2);
  const int64_t groups = heads / kv_heads;
  at::Tensor qg = q.reshape({B, kv_heads, groups * T, head_dim_});
  at::Tensor scores = at::matmul(qg, k.transpose(2, 3)) * scaling_;              // [B, kv, groups*T, S]
  scores = at::tanh(scores / *softcap_) * *softcap_;
  scores = scores.view({B, heads, T, S}).masked_fill(visible.logical_not(), -std::numeric_limits<double>::infinity());
  at::Tensor weights = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
  return at::matmul(weights.view({B, kv_heads, groups * T, S}), v).view({B, heads, T, head_dim_});
}

MLP::MLP(const ModelConfig& c, const at::TensorOptions& options, int64_t intermediate_size)
    : gelu_tanh_(c.hidden_act == "gelu_pytorch_tanh") {
  const int64_t inner = intermediate_size > 0 ? intermediate_size : c.intermediate_size;
  gate_proj = register_module("gate_proj", std::make_shared<Linear>(c.hidden_size, inner, false, options));
  up_proj = register_module("up_proj", std::make_shared<Linear>(c.hidden_size, inner, false, options));
  down_proj = register_module("down_proj", std::make_shared<Linear>(inner, c.hidden_size, false, options));
}

at::Tensor MLP::forward(const at::Tensor& x) const {
  at::Tensor gate = gate_proj->forward(x);
  if (!gelu_tanh_ && use_fused(fused_swiglu, gate)) return down_proj->forward(models::fused_swiglu(gate, up_proj->forward(x)));
  gate = gelu_tanh_ ? at::gelu(gate, "tanh") : at::silu(gate);
  return down_proj->forward(gate * up_proj->forward(x));
}

// Note [MoE experts]
// HF loops over the experts a batch hits, gathering each one's tokens, with a host sync per layer
// for the list. Here the n*k (token, choice) pairs are sorted by expert once, and each of the
// three projections is ONE grouped GEMM over the sorted rows (at::_grouped_mm: group e is rows
// [ends[e-1], ends[e]) times expert e's matrix). Nothing is read back to the host, so on a GPU
// in bf16 (sm90/sm100: CUTLASS) a decode step captures into a CUDA graph; elsewhere LibTorch's
// fallback loops over the groups (reading `ends` on the host). Both run under autograd.
//   pairs      ids = top-k expert of each (token, choice), flattened; order = stable argsort(ids)
//   rows       x repeated k times per token, permuted by order (its backward is a permutation
//              and a sum over the k copies: deterministic, no atomics), placed at their expert
//              group's rows (group_rows_by_expert)
//   experts    down_e(silu(gate_e(r)) * up_e(r)) per row r of group e
//   combine    rows back to (token, choice) order, times the routing weight, summed over choices
// Each group starts on a multiple of kExpertGroupRows rows, the rest of its rows zero: the weight
// gradients are grouped GEMMs along the rows, whose TMA loads need 16-byte aligned group starts
// (bf16: 8 rows) or give silently wrong sums, as torchtitan pads them. The buffer has a fixed
// size, n*k + E*(kExpertGroupRows - 1) rows, so the shapes stay static for graph capture; the
// last group runs to its end (its extra rows are zero, their products zero and never read).
// The routing weight multiplies in x's dtype, as HF does; the k products are summed by one
// reduction (HF adds them one by one into a tensor of x's dtype), equal in fp32.
// _grouped_mm needs 16-byte aligned rows and bases: hidden_size and moe_intermediate_size are
// multiples of 8 (validate_model_config), and a weight viewed at an odd offset of an FSDP flat
// buffer is copied first (never, for released models: every parameter's size is a multiple of 8).
// On sm100 an expert no row reached gets its weight gradient zeroed by a hook (LibTorch's kernel
// leaves garbage there).
SparseMoeBlock::SparseMoeBlock(const ModelConfig& c, const at::TensorOptions& options)
    : top_k_(c.moe.num_experts_per_tok), norm_topk_prob_(c.moe.norm_topk_prob) {
  const int64_t E = c.moe.num_experts, I = c.moe.moe_intermediate_size, H = c.hidden_size;
  auto experts = register_module("experts", std::make_shared<torch::nn::Module>("Experts"));
  gate_proj = experts->register_parameter("gate_proj", at::empty({E, I, H}, options));
  up_proj = experts->register_parameter("up_proj", at::empty({E, I, H}, options));
  down_proj = experts->register_parameter("down_proj", at::empty({E, H, I}, options));
  auto gate = register_module("gate", std::make_shared<torch::nn::Module>("TopKRouter"));
  router = gate->register_parameter("weight", at::empty({E, H}, options));
  if (c.moe.shared_expert_intermediate_size > 0) {
    shared_expert = register_module("shared_expert",
                                    std::make_shared<MLP>(c, options, c.moe.shared_expert_intermediate_size));
    shared_expert_gate = register_module("shared_expert_gate", std::make_shared<Linear>(H, 1, false, options));
  }
}

ExpertGroups group_rows_by_expert(const at::Tensor& sorted_ids, int64_t num_experts) {
  const int64_t rows = sorted_ids.size(0), align = kExpertGroupRows;
  const at::TensorOptions longs = sorted_ids.options().dtype(at::kLong);
  const at::Tensor ends = at::searchsorted(sorted_ids, at::arange(num_experts, sorted_ids.options()), /*out_int32=*/false,
                                           /*right=*/true);  // [E], into the sorted rows
  const at::Tensor counts = at::diff(ends, 1, 0, at::zeros({1}, longs));
  const at::Tensor padded = at::div(counts + (align - 1), align, "floor") * align;
  ExpertGroups g;
  g.capacity = rows + num_experts * (align - 1);
  at::Tensor padded_ends = at::cumsum(padded, 0);
  padded_ends = at::cat({padded_ends.narrow(0, 0, num_experts - 1), at::full({1}, g.capacity, longs)});
  // Row p of expert e moves from its sorted place by (padded start - sorted start) of e.
  const at::Tensor shift = (padded_ends - padded) - (ends - counts);
  g.destination = at::arange(rows, longs) + shift.index_select(0, sorted_ids);
  g.ends = padded_ends.to(at::kInt);
  return g;
}

namespace {

// x [rows, in] by group: rows [ends[e-1], ends[e]) times w[e]^T, w [E, out, in].
at::Tensor grouped_linear(const at::Tensor& x, at::Tensor w, const at::Tensor& ends) {
  if (reinterpret_cast<uintptr_t>(w.data_ptr()) % 16 != 0) w = w.clone();
  if (w.requires_grad() && at::GradMode::is_enabled() && w.is_cuda() && proto::cuda_compute_major(w.device()) >= 10) {
    // LibTorch's sm100 grouped GEMM leaves garbage in the weight gradient of an expert that got
    // no rows (pytorch/pytorch#172439); it must be zero. A view of its own carries the hook.
    const at::Tensor counts = at::diff(ends, 1, 0, at::zeros({1}, ends.options()));
    const at::Tensor idle = counts.eq(0).view({-1, 1, 1});
    w = w.view(w.sizes());
    w.register_hook([idle](const at::Tensor& grad) { return grad.masked_fill(idle, 0); });
  }
  return at::_grouped_mm(x, w.transpose(-2, -1), ends);
}

}  // namespace

at::Tensor SparseMoeBlock::forward(const at::Tensor& x) const {
  const int64_t H = x.size(-1), E = router.size(0), k = top_k_;
  const at::Tensor flat = x.reshape({-1, H});
  const int64_t n = flat.size(0);
  at::Tensor out;
  if (n == 0) {
    out = at::zeros_like(flat);
  } else {
    const at::Tensor logits = at::linear(flat, router);
    auto [weights, ids] = at::topk(at::softmax(logits, -1, at::kFloat), k, -1);  // [n, k]
    if (norm_topk_prob_) weights = weights / weights.sum(-1, /*keepdim=*/true);
    weights = weights.to(logits.scalar_type());
    // Note [MoE experts]
    const at::Tensor flat_ids = ids.reshape({-1});
    const at::Tensor order = at::argsort(flat_ids, /*stable=*/true, /*dim=*/0);
    const ExpertGroups groups = group_rows_by_expert(flat_ids.index_select(0, order), E);
    const at::Tensor sorted = flat.unsqueeze(1).expand({n, k, H}).reshape({n * k, H}).index_select(0, order);
    const at::Tensor rows = at::zeros({groups.capacity, H}, flat.options()).index_copy(0, groups.destination, sorted);
    const at::Tensor gate = grouped_linear(rows, gate_proj, groups.ends), up = grouped_linear(rows, up_proj, groups.ends);
    const at::Tensor act = use_fused(fused_swiglu, gate) ? models::fused_swiglu(gate, up) : at::silu(gate) * up;
    const at::Tensor y = grouped_linear(act, down_proj, groups.ends);
    // (token, choice) j sits at sorted place position[j], which sits at row destination[...].
    const at::Tensor position = at::empty_like(order).scatter_(0, order, at::arange(n * k, order.options()));
    const at::Tensor chosen = y.index_select(0, groups.destination.index_select(0, position)).view({n, k, H});
    out = (chosen * weights.unsqueeze(-1)).sum(1);
  }
  if (shared_expert) out = out + at::sigmoid(shared_expert_gate->forward(flat)) * shared_expert->forward(flat);
  return out.view(x.sizes());
}

// Registration order is HF's (self_attn, mlp, then the norms): FSDP flattens parameters in this order.
DecoderLayer::DecoderLayer(const ModelConfig& c, const at::TensorOptions& options, int64_t layer_index) {
  const bool gemma = c.gemma_norms();
  auto make_norm = [&](const char* name) {
    return register_module(name, std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps, options, gemma));
  };
  self_attn = register_module("self_attn", std::make_shared<Attention>(c, options, layer_index));
  if (c.layer_is_sparse(layer_index)) {
    moe = register_module("mlp", std::make_shared<SparseMoeBlock>(c, options));
  } else {
    mlp = register_module("mlp", std::make_shared<MLP>(c, options));
  }
  input_layernorm = make_norm("input_layernorm");
  post_attention_layernorm = make_norm("post_attention_layernorm");
  if (gemma) {
    pre_feedforward_layernorm = make_norm("pre_feedforward_layernorm");
    post_feedforward_layernorm = make_norm("post_feedforward_layernorm");
  }
}

at::Tensor DecoderLayer::add_attention(const at::Tensor& h, const at::Tensor& attn) const {
  return h + (pre_feedforward_layernorm ? post_attention_layernorm->forward(attn) : attn);
}

at::Tensor DecoderLayer::mlp_input(const at::Tensor& h) const {
  return (pre_feedforward_layernorm ? pre_feedforward_layernorm : post_attention_layernorm)->forward(h);
}

at::Tensor DecoderLayer::add_mlp(const at::Tensor& h, const at::Tensor& m) const {
  return h + (post_feedforward_layernorm ? post_feedforward_layernorm->forward(m) : m);
}

at::Tensor DecoderLayer::forward(const at::Tensor& x, const RotaryTables& rope, const at::Tensor& visible,
                                 const at::Tensor& visible_window, const LayerCacheView* cache,
                                 const PackedSegments* packed) const {
  const at::Tensor& mask = self_attn->window() > 0 ? visible_window : visible;
  at::Tensor h = add_attention(x, self_attn->forward(input_layernorm->forward(x), rope, mask, cache, true, packed));
  return add_mlp(h, feed_forward(mlp_input(h)));
}

DecoderBackbone::DecoderBackbone(const ModelConfig& c, const at::TensorOptions& options) : config_(c) {
  embed_tokens = register_module("embed_tokens", std::make_shared<Embedding>(c.vocab_size, c.hidden_size, options));
  auto list = register_module("layers", std::make_shared<torch::nn::Module>("LayerList"));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layers.push_back(list->register_module(std::to_string(i), std::make_shared<DecoderLayer>(c, options, i)));
  }
  norm = register_module("norm", std::make_shared<RMSNorm>(c.hidden_size, c.rms_norm_eps, options, c.gemma_norms()));
}

at::Tensor DecoderBackbone::embed(const at::Tensor& input_ids) const {
  at::Tensor h = embed_tokens->forward(input_ids);
  if (!config_.gemma_norms()) return h;
  // HF Gemma2TextScaledWordEmbedding: a 0-dim fp32 buffer hidden_size**0.5, cast to the weight's dtype.
  at::Tensor scale = at::scalar_tensor(std::sqrt(static_cast<double>(config_.hidden_size)),
                                       at::TensorOptions().dtype(at::kFloat).device(h.device()));
  return h * scale.to(h.scalar_type());
}

at::Tensor DecoderBackbone::window_visibility(const at::Tensor& key_mask, int64_t query_len, int64_t past_len) const {
  bool any = false;
  for (const auto& layer : layers) any = any || layer->self_attn->window() > 0;
  if (!any) return at::Tensor();
  return attention_visibility(key_mask, query_len, past_len, *config_.sliding_window);
}

at::Tensor DecoderBackbone::run_layers(at::Tensor h, const at::Tensor& position_ids, const at::Tensor& visible,
                                       const at::Tensor& visible_window, KVCache* cache,
                                       std::shared_ptr<const PackedSegments> packed) const {
  RotaryTables rope = make_rotary_tables(position_ids, config_, h.scalar_type(),
                                         packed ? packed->max_position : at::Tensor());
  for (size_t i = 0; i < layers.size(); ++i) {
    if (cache == nullptr && layer_runner_) {
      LayerCall call = [layer = layers[i], rope, visible, visible_window, packed](const at::Tensor& x) {
        return layer->forward(x, rope, visible, visible_window, nullptr, packed.get());
      };
      h = layer_runner_(static_cast<int64_t>(i), std::move(call), h);
      continue;
    }
    if (cache == nullptr) {
      h = layers[i]->forward(h, rope, visible, visible_window, nullptr, packed.get());
      continue;
    }
    LayerCacheView view{cache->key(static_cast<int64_t>(i)), cache->value(static_cast<int64_t>(i)), cache->length()};
    h = layers[i]->forward(h, rope, visible, visible_window, &view);
  }
  return norm->forward(h);
}

at::Tensor DecoderBackbone::forward(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                    const at::Tensor& position_ids) const {
  TORCH_CHECK(input_ids.dim() == 2 && attention_mask.sizes() == input_ids.sizes() &&
                  position_ids.sizes() == input_ids.sizes(),
              "DecoderBackbone::forward: input_ids, attention_mask, position_ids must all be [B, T]; got ",
              input_ids.sizes(), ", ", attention_mask.sizes(), ", ", position_ids.sizes());
  at::Tensor visible = attention_visibility(attention_mask, input_ids.size(1), /*past_len=*/0);
  at::Tensor visible_window = window_visibility(attention_mask, input_ids.size(1), /*past_len=*/0);
  return run_layers(embed(input_ids), position_ids, visible, visible_window, nullptr);
}

at::Tensor DecoderBackbone::forward_packed(const at::Tensor& input_ids, const at::Tensor& position_ids,
                                           std::shared_ptr<const PackedSegments> packed) const {
  TORCH_CHECK(input_ids.dim() == 2 && input_ids.size(0) == 1 && position_ids.sizes() == input_ids.sizes(),
              "DecoderBackbone::forward_packed: input_ids and position_ids must both be [1, N]; got ",
              input_ids.sizes(), ", ", position_ids.sizes());
  TORCH_CHECK(packed && !packed->starts.empty() && packed->starts.front() == 0 &&
                  packed->local_tokens() == input_ids.size(1) &&
                  (!packed->sequence_parallel || packed->starts.back() % packed->sequence_parallel->size() == 0),
              "DecoderBackbone::forward_packed: the packed offsets must run from 0 to ", input_ids.size(1),
              packed && packed->sequence_parallel ? " times the sequence-parallel group size" : "");
  return run_layers(embed(input_ids), position_ids, at::Tensor(), at::Tensor(), nullptr, std::move(packed));
}

at::Tensor DecoderBackbone::forward_step(const at::Tensor& input_ids, const at::Tensor& position_ids, KVCache& cache,
                                         const at::Tensor& cache_mask) const {
  const int64_t B = input_ids.size(0), T = input_ids.size(1), past = cache.length();
  TORCH_CHECK(input_ids.dim() == 2 && position_ids.sizes() == input_ids.sizes(),
              "forward_step: input_ids and position_ids must both be [B, T]");
  TORCH_CHECK(B == cache.batch_size(), "forward_step: batch ", B, " != cache batch ", cache.batch_size());
  TORCH_CHECK(past + T <= cache.capacity(), "forward_step: cache full (", past, " + ", T, " > ", cache.capacity(), ")");
  TORCH_CHECK(cache_mask.dim() == 2 && cache_mask.size(0) == B && cache_mask.size(1) >= past + T,
              "forward_step: cache_mask must be [", B, ", >= ", past + T, "], got ", cache_mask.sizes());
  TORCH_CHECK(cache.dtype() == embed_tokens->weight.scalar_type(), "forward_step: cache dtype ",
              cache.dtype(), " != parameter dtype ", embed_tokens->weight.scalar_type());
  at::NoGradGuard no_grad;
  at::Tensor visible = attention_visibility(cache_mask.narrow(1, 0, past + T), T, past);
  at::Tensor visible_window = window_visibility(cache_mask.narrow(1, 0, past + T), T, past);
  at::Tensor h = run_layers(embed(input_ids), position_ids, visible, visible_window, &cache);
  cache.advance(T);
  return h;
}

}  // namespace tessera::models
