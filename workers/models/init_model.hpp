// init_model.hpp: `tessera init-model` as a library function. It writes a complete HF model
// directory (config.json, model.safetensors, tokenizer.json, tokenizer_config.json) for a small,
// randomly initialised Llama, Qwen2, Qwen3, Mistral, Gemma2 or Gemma3, seeded and deterministic: the same
// options give the same bytes. Initialisation is HF's _init_weights (normal(0, initializer_range =
// 0.02) for matrices and the embedding, with the pad row zeroed; norms, Qwen3's q_norm/k_norm
// included, 1 (Gemma2's 0, as they scale by 1 + weight); biases 0). Gemma2 gets HF Gemma2Config's
// other defaults: tied embeddings, query_pre_attn_scalar = head_dim, softcaps 50 (attention) and
// 30 (logits), sliding on even layers; Gemma3 Gemma3TextConfig's: tied embeddings,
// query_pre_attn_scalar = head_dim, no softcaps, every 6th layer full, the sliding layers' RoPE
// base 10000.
//
// The directory is staged in `<out>.tmp-<pid>-<n>` and renamed into place, so `out` either does
// not exist or is complete. An existing non-empty `out` is refused.
// Thread-safety: re-entrant; concurrent calls must use distinct `out` paths.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "proto/status.hpp"

namespace tessera::models {

/// The knobs of `tessera init-model`.
struct InitModelOptions {
  /// HF model_type: "llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mistral", "gemma2" or "gemma3_text".
  std::string arch = "llama";
  int64_t hidden = 0;                 ///< hidden_size.
  int64_t layers = 0;                 ///< num_hidden_layers.
  int64_t heads = 0;                  ///< num_attention_heads.
  int64_t kv_heads = 0;               ///< num_key_value_heads; 0 = heads.
  int64_t head_dim = 0;               ///< head_dim; 0 = hidden / heads (which must then divide).
  int64_t intermediate = 0;           ///< intermediate_size; 0 = 8/3 * hidden rounded up to 64.
  /// "bytes" (256 byte tokens + specials), "chars:ALPHABET" (one token per character), or a
  /// directory holding tokenizer.json (+ tokenizer_config.json), which is copied.
  std::string tokenizer = "bytes";
  uint64_t seed = 0;
  std::string out;                    ///< The directory to create.
  std::optional<int64_t> vocab_size;  ///< Default: the tokenizer's; must not be smaller.
  int64_t max_position = 2048;        ///< max_position_embeddings (and model_max_length).
  bool tie_word_embeddings = false;   ///< Always true for the Gemmas.
  /// mistral, gemma2, gemma3_text: sliding_window (0: none, written as null, for mistral; HF's
  /// 4096 for the Gemmas).
  int64_t sliding_window = 0;
  std::string dtype = "float32";      ///< torch_dtype of the written weights.
  /// qwen3_moe, qwen2_moe: num_experts, num_experts_per_tok, moe_intermediate_size (0: HF's class
  /// defaults 128/8/768 and 60/4/1408), norm_topk_prob (HF default: false); qwen2_moe's shared
  /// expert (0: 4 x moe_intermediate_size, its ratio in Qwen1.5-MoE).
  int64_t experts = 0;
  int64_t experts_per_tok = 0;
  int64_t moe_intermediate = 0;
  int64_t shared_expert_intermediate = 0;
  bool norm_topk_prob = false;
  /// rope_theta; unset: 1e6 for gemma3_text (its full layers, as Gemma3TextConfig), 1e4 otherwise.
  std::optional<double> rope_theta;
  double rms_norm_eps = 1e-6;
};

/// Writes the model directory described by `options` (see the header comment).
Status init_model(const InitModelOptions& options);

}  // namespace tessera::models
