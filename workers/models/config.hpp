// config.hpp: the HF `config.json` of a decoder-only Llama/Qwen2/Qwen3/Qwen2-MoE/Qwen3-MoE/Mistral/Gemma2/Gemma3 model, read and
// written with HF's own field names.
//
// Contract: parse_model_config() accepts exactly what Tessera's decoder implements. A field whose
// value would change the maths in a way we do not implement (a rope_scaling type other than
// default/linear/dynamic/llama3/yarn, hidden_act other than silu (gemma2: hidden_activation other than
// gelu_pytorch_tanh), a Qwen2/Qwen3 sliding window narrower than max_position_embeddings, mlp_bias,
// dropout > 0 in attention) is refused with an error naming the field and the file. Mistral's and
// Gemma2's sliding_window is honoured (Note [Sliding window] in decoder.cpp). Fields that do not change the maths (transformers_version, use_cache,
// initializer_range, ...) are kept verbatim in `extra` so a load/save round trip preserves them.
// Defaults for absent fields follow HF's LlamaConfig / Qwen2Config / Qwen3Config / MistralConfig /
// Gemma2Config / Gemma3TextConfig (transformers 5.24): e.g. an absent sliding_window is 4096 for mistral and
// the Gemmas, an absent final_logit_softcapping is 30 for gemma2 (none for gemma3_text), and the Gemmas'
// embeddings are tied by default.
//
// RoPE: transformers < 5 writes `rope_theta` and `rope_scaling` ({"rope_type" or "type", ...});
// transformers >= 5 writes `rope_parameters` ({"rope_type", "rope_theta", ...}). Both are read, as
// transformers 5 reads them (a non-empty rope_scaling wins over rope_parameters; a rope_theta
// inside the dict wins over the top-level one). Both are written back in the older form
// (`rope_theta` + `rope_scaling`), which every transformers version reads. Gemma3's RoPE is per layer
// type: rope_parameters {"full_attention": {...}, "sliding_attention": {...}} (transformers 5), or
// rope_theta + rope_scaling for the full layers and rope_local_base_freq for the sliding ones; the
// sliding layers' RoPE is the default type (rope_local_theta).
//
// Thread-safety: plain values; free functions are re-entrant.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>
#include <nlohmann/json.hpp>

#include "proto/status.hpp"

namespace tessera::models {

/// Which output head sits on the decoder backbone.
enum class HeadKind : uint8_t {
  causal_lm,  ///< `lm_head` over the vocabulary (HF *ForCausalLM).
  value,      ///< scalar `score` head per token (HF *ForTokenClassification, num_labels=1).
};

/// HF's RoPE scaling (config.json `rope_scaling`, or `rope_parameters` in transformers >= 5), as
/// modeling_rope_utils.py computes it:
///   default  inv_freq = 1 / rope_theta^(arange(0, D, 2) / D)
///   linear   inv_freq / factor
///   dynamic  NTK: when seq_len = max(position_ids) + 1 of one forward call exceeds
///            max_position_embeddings, the base becomes
///            rope_theta * (factor * seq_len / max_position_embeddings - (factor - 1))^(D / (D - 2))
///   llama3   _compute_llama3_parameters (factor, low/high_freq_factor, original_max_position_embeddings)
///   yarn     _compute_yarn_parameters: each frequency blends its interpolated (/ factor) and
///            original values along a linear ramp between the dimensions that turn beta_fast and
///            beta_slow times over original_max_position_embeddings (floored and ceiled unless
///            truncate is false), and cos/sin are scaled by attention_factor (by default
///            0.1 ln(factor) + 1, or the ratio of that with mscale and mscale_all_dim).
/// Only yarn scales cos/sin (HF's attention_factor is 1 for the others).
struct RopeScaling {
  std::string rope_type = "default";  ///< "default", "linear", "dynamic", "llama3" or "yarn".
  double factor = 1.0;                ///< linear, dynamic, llama3, yarn.
  double low_freq_factor = 1.0;       ///< llama3.
  double high_freq_factor = 4.0;      ///< llama3.
  /// llama3 and yarn; HF's default is max_position_embeddings.
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;            ///< yarn.
  double beta_slow = 1.0;             ///< yarn.
  double mscale = 0.0;                ///< yarn; 0: absent.
  double mscale_all_dim = 0.0;        ///< yarn; 0: absent.
  std::optional<double> attention_factor;  ///< yarn; absent: from factor (and mscale, mscale_all_dim).
  bool truncate = true;               ///< yarn: floor/ceil the ramp's ends.
};

/// Qwen3-MoE / Qwen2-MoE sparse MLPs (HF Qwen3MoeSparseMoeBlock / Qwen2MoeSparseMoeBlock): a
/// router picks num_experts_per_tok of num_experts SwiGLU experts per token, weighted by their
/// softmax probabilities (renormalised over the chosen ones when norm_topk_prob); Qwen2-MoE adds a
/// shared expert scaled by sigmoid(shared_expert_gate(x)). Layer i is sparse unless it is in
/// mlp_only_layers or (i + 1) % decoder_sparse_step != 0 (then a dense MLP of intermediate_size).
/// HF's router auxiliary loss (output_router_logits, router_aux_loss_coef) only enters a loss HF
/// computes from labels, which verl never passes; those keys stay in `extra`.
struct MoeConfig {
  int64_t num_experts = 0;  ///< 0: a dense model.
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  int64_t shared_expert_intermediate_size = 0;  ///< qwen2_moe only (its shared expert).
};

/// The hyper-parameters of one decoder model, named as in HF's config.json.
struct ModelConfig {
  std::string architecture;   ///< architectures[0], e.g. "Qwen2ForCausalLM".
  std::string model_type;     ///< "llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mistral", "gemma2" or "gemma3_text".
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  ///< Defaults to num_attention_heads (HF).
  int64_t head_dim = 0;             ///< Defaults to hidden_size / num_attention_heads (qwen3: 128).
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;         ///< Written as `rope_scaling` (null when default).
  /// gemma3_text: the sliding layers' RoPE base (rope_local_base_freq; default RoPE, no scaling);
  /// its full layers take rope_theta and rope_scaling. Unset elsewhere: every layer takes those.
  std::optional<double> rope_local_theta;
  int64_t max_position_embeddings = 2048;
  bool tie_word_embeddings = false;
  bool attention_bias = false;      ///< q/k/v biases (llama, qwen3: and o_proj); always true for qwen2.
  double initializer_range = 0.02;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;  ///< HF allows an int or a list; written back the same way.
  bool eos_is_list = false;
  std::optional<int64_t> pad_token_id;
  std::string torch_dtype = "float32";
  std::string hidden_act = "silu";  ///< gemma2, gemma3_text: HF's `hidden_activation` ("gelu_pytorch_tanh").
  /// mistral, the Gemmas: keys more than this many visible keys back are hidden (unset: no window).
  std::optional<int64_t> sliding_window;
  /// gemma2, gemma3_text: "sliding_attention" / "full_attention" per layer. Empty: HF's default
  /// (gemma2: even layer indices slide; mistral: every layer slides when sliding_window is set;
  /// gemma3_text fills it from sliding_window_pattern, every 6th layer full by default).
  std::vector<std::string> layer_types;
  double query_pre_attn_scalar = 0.0;            ///< the Gemmas: attention scale is this^-0.5 (0: head_dim).
  std::optional<double> attn_logit_softcapping;  ///< gemma2 (gemma3_text: off by default): scores -> tanh(scores / c) * c.
  std::optional<double> final_logit_softcapping; ///< gemma2 (gemma3_text: off by default): logits -> tanh(logits / c) * c.
  MoeConfig moe;                                 ///< qwen3_moe, qwen2_moe.
  nlohmann::json extra = nlohmann::json::object();  ///< Unmodelled fields, kept verbatim.

  /// num_attention_heads / num_key_value_heads.
  int64_t num_kv_groups() const { return num_attention_heads / num_key_value_heads; }
  /// Qwen3, Gemma3: RMSNorm over head_dim on each query and key head (self_attn.q_norm / k_norm),
  /// before RoPE (Gemma3's scale by 1 + weight, as its other norms).
  bool qk_norm() const { return model_type == "qwen3" || model_type == "qwen3_moe" || model_type == "gemma3_text"; }
  /// HF's o_proj carries a bias when attention_bias is set (Llama, Qwen3), never in Qwen2 (and
  /// Qwen2-MoE, whose qkv_bias is read into attention_bias).
  bool o_proj_bias() const { return attention_bias && model_type != "qwen2" && model_type != "qwen2_moe"; }
  /// Whether layer `index` has a sparse MoE block (MoeConfig) instead of the dense MLP.
  bool layer_is_sparse(int64_t index) const;
  /// Gemma2, Gemma3: RMSNorm scales by (1 + weight); four norms per layer (the attention and MLP
  /// outputs are normed before their residual add); embeddings scaled by sqrt(hidden_size) in their
  /// dtype.
  bool gemma_norms() const { return model_type == "gemma2" || model_type == "gemma3_text"; }
  /// Whether layer `index` rotates by rope_local_theta (a "sliding_attention" layer of Gemma3, with
  /// or without a window).
  bool layer_local_rope(int64_t index) const {
    return rope_local_theta.has_value() && index < static_cast<int64_t>(layer_types.size()) &&
           layer_types[static_cast<size_t>(index)] == "sliding_attention";
  }
  /// Whether layer `index` attends through the sliding window (see sliding_window, layer_types).
  bool layer_slides(int64_t index) const;
  /// The pre-training context llama3 and yarn scale from: rope_scaling's
  /// original_max_position_embeddings, HF's default max_position_embeddings.
  int64_t rope_original_context() const {
    return rope_scaling.original_max_position_embeddings > 0 ? rope_scaling.original_max_position_embeddings
                                                             : max_position_embeddings;
  }
  /// The longest sequence the model serves, as vLLM derives max_model_len: max_position_embeddings,
  /// times the factor of linear and dynamic RoPE scaling; for yarn the larger of that and
  /// original_max_position_embeddings x factor (Qwen2.5 keeps max_position_embeddings 32768 and
  /// adds yarn with factor 4 for 131072 positions).
  int64_t context_length() const;
};

/// Parses a config.json object; `source` (a file name) is used in error messages.
Result<ModelConfig> parse_model_config(const nlohmann::json& json, const std::string& source);

/// Reads `path` (a config.json file, or a directory holding one) and parses it. A non-empty
/// `override` object sets its fields over the file's first, each replacing the field whole, as
/// verl's update_model_config applies model.override_config; errors then name the file
/// "with <override_key>".
Result<ModelConfig> load_model_config(const std::string& path, const nlohmann::json& override = nullptr,
                                      const std::string& override_key = "override_config");

/// Serialises with HF's field names (the inverse of parse_model_config).
nlohmann::json model_config_to_json(const ModelConfig& config);

/// Writes `dir/config.json` atomically (temp file + rename).
Status save_model_config(const ModelConfig& config, const std::string& dir);

/// Checks the structural invariants (positive sizes, heads divide hidden, kv heads divide heads).
Status validate_model_config(const ModelConfig& config, const std::string& source);

/// The HF architecture name for a model type and head ("qwen2", value) -> "Qwen2ForTokenClassification".
Result<std::string> architecture_name(const std::string& model_type, HeadKind head);

/// The torch_dtype string ("float32", "bfloat16", "float16") for a scalar type, and back.
Result<std::string> torch_dtype_name(c10::ScalarType dtype);
Result<c10::ScalarType> parse_torch_dtype(const std::string& name);

}  // namespace tessera::models
