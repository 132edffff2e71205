// config.hpp: the HF `config.json` of a decoder-only Llama/Qwen2 model, read and written with HF's
// own field names.
//
// Contract: parse_model_config() accepts exactly what Tessera's decoder implements. A field whose
// value would change the maths in a way we do not implement (a rope_scaling type, hidden_act other
// than silu, an enabled sliding window, mlp_bias, dropout > 0 in attention) is refused with an
// error naming the field and the file. Fields that do not change the maths (transformers_version,
// use_cache, initializer_range, ...) are kept verbatim in `extra` so a load/save round trip
// preserves them. Defaults for absent fields follow HF's LlamaConfig / Qwen2Config.
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

/// The hyper-parameters of one decoder model, named as in HF's config.json.
struct ModelConfig {
  std::string architecture;   ///< architectures[0], e.g. "Qwen2ForCausalLM".
  std::string model_type;     ///< "llama" or "qwen2".
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  ///< Defaults to num_attention_heads (HF).
  int64_t head_dim = 0;             ///< Defaults to hidden_size / num_attention_heads.
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  int64_t max_position_embeddings = 2048;
  bool tie_word_embeddings = false;
  bool attention_bias = false;      ///< q/k/v biases; always true for qwen2.
  double initializer_range = 0.02;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;  ///< HF allows an int or a list; written back the same way.
  bool eos_is_list = false;
  std::optional<int64_t> pad_token_id;
  std::string torch_dtype = "float32";
  std::string hidden_act = "silu";
  nlohmann::json extra = nlohmann::json::object();  ///< Unmodelled fields, kept verbatim.

  /// num_attention_heads / num_key_value_heads.
  int64_t num_kv_groups() const { return num_attention_heads / num_key_value_heads; }
};

/// Parses a config.json object; `source` (a file name) is used in error messages.
Result<ModelConfig> parse_model_config(const nlohmann::json& json, const std::string& source);

/// Reads `path` (a config.json file, or a directory holding one) and parses it.
Result<ModelConfig> load_model_config(const std::string& path);

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
