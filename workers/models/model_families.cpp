// model_families.cpp: the per-model-type rows. Per-model-type behaviour (defaults, fields refused)
// is a table of small functions keyed by model_type, so adding a family is adding a row.
#include "workers/models/internal/model_families.hpp"

#include <utility>

#include <fmt/format.h>

#include "workers/models/internal/config_fields.hpp"

namespace tessera::models::internal {

using nlohmann::json;

namespace {

// Qwen2/Qwen3 sliding-window attention is accepted only where it cannot change the maths: switched
// off (use_sliding_window false or null), no window (sliding_window null), or a window that covers
// max_position_embeddings. Needs max_position_embeddings.
Status check_sliding_window(const json& j, const std::string& source, const ModelConfig& c) {
  if (!j.contains("use_sliding_window") || j.at("use_sliding_window").is_null()) return Status();
  const json& use = j.at("use_sliding_window");
  if (!use.is_boolean()) return field_error(source, "use_sliding_window", "must be a boolean, got " + use.dump());
  if (!use.get<bool>()) return Status();
  const json window = j.contains("sliding_window") ? j.at("sliding_window") : json(nullptr);
  if (window.is_null()) return Status();
  if (window.is_number_integer() && window.get<int64_t>() >= c.max_position_embeddings) return Status();
  return field_error(source, "use_sliding_window",
                     fmt::format("= true with sliding_window = {} < max_position_embeddings = {} is not supported "
                                 "(sliding-window attention)",
                                 window.dump(), c.max_position_embeddings));
}

Status llama_specifics(const json& j, const std::string& source, ModelConfig& c) {
  TESSERA_RETURN_IF_ERROR(require_false(j, source, "mlp_bias", "no MLP biases in Tessera's decoder"));
  return read_bool(j, source, "attention_bias", c.attention_bias);
}

Status qwen2_specifics(const json& j, const std::string& source, ModelConfig& c) {
  TESSERA_RETURN_IF_ERROR(check_sliding_window(j, source, c));
  c.attention_bias = true;  // Qwen2Attention always has q/k/v biases.
  return Status();
}

// Qwen3: q_norm/k_norm (ModelConfig::qk_norm), attention_bias read (default false), head_dim 128 by default.
Status qwen3_specifics(const json& j, const std::string& source, ModelConfig& c) {
  TESSERA_RETURN_IF_ERROR(check_sliding_window(j, source, c));
  return read_bool(j, source, "attention_bias", c.attention_bias);
}

// The MoE fields of Qwen3MoeConfig / Qwen2MoeConfig (transformers 5.24 defaults when absent).
Status read_moe(const json& j, const std::string& source, ModelConfig& c, MoeConfig defaults) {
  c.moe = std::move(defaults);
  MoeConfig& m = c.moe;
  // transformers 5 writes Qwen3-MoE's num_experts as num_local_experts (its attribute map);
  // released checkpoints say num_experts. Qwen2MoeConfig has no such alias.
  if (c.model_type == "qwen3_moe") {
    TESSERA_RETURN_IF_ERROR(read_int(j, source, "num_local_experts", m.num_experts));
  }
  const int64_t local = m.num_experts;
  TESSERA_RETURN_IF_ERROR(read_int(j, source, "num_experts", m.num_experts));
  const auto given = [&](const char* key) { return j.contains(key) && !j.at(key).is_null(); };
  if (c.model_type == "qwen3_moe" && given("num_local_experts") && given("num_experts") && local != m.num_experts) {
    return field_error(source, "num_experts", fmt::format("= {} but num_local_experts = {}", m.num_experts, local));
  }
  TESSERA_RETURN_IF_ERROR(read_int(j, source, "num_experts_per_tok", m.num_experts_per_tok));
  TESSERA_RETURN_IF_ERROR(read_int(j, source, "moe_intermediate_size", m.moe_intermediate_size));
  TESSERA_RETURN_IF_ERROR(read_bool(j, source, "norm_topk_prob", m.norm_topk_prob));
  TESSERA_RETURN_IF_ERROR(read_int(j, source, "decoder_sparse_step", m.decoder_sparse_step));
  if (j.contains("mlp_only_layers") && !j.at("mlp_only_layers").is_null()) {
    const json& v = j.at("mlp_only_layers");
    if (!v.is_array()) return field_error(source, "mlp_only_layers", "must be a list of layer indices");
    for (const json& e : v) {
      if (!e.is_number_integer()) return field_error(source, "mlp_only_layers", "holds " + e.dump() + ", not a layer index");
      m.mlp_only_layers.push_back(e.get<int64_t>());
    }
  }
  if (c.model_type == "qwen2_moe") {
    TESSERA_RETURN_IF_ERROR(read_int(j, source, "shared_expert_intermediate_size", m.shared_expert_intermediate_size));
  }
  return Status();
}

// Qwen3-MoE: Qwen3's attention (q_norm/k_norm, attention_bias), but head_dim defaults to
// hidden_size / num_attention_heads (Qwen3MoeAttention's getattr), and sparse MLPs.
Status qwen3_moe_specifics(const json& j, const std::string& source, ModelConfig& c) {
  TESSERA_RETURN_IF_ERROR(qwen3_specifics(j, source, c));
  return read_moe(j, source, c, {128, 8, 768, false, 1, {}, 0});
}

// Qwen2-MoE: Qwen2's attention with qkv_bias (default true) for its q/k/v biases, a shared expert.
Status qwen2_moe_specifics(const json& j, const std::string& source, ModelConfig& c) {
  TESSERA_RETURN_IF_ERROR(check_sliding_window(j, source, c));
  c.attention_bias = true;
  TESSERA_RETURN_IF_ERROR(read_bool(j, source, "qkv_bias", c.attention_bias));
  return read_moe(j, source, c, {60, 4, 1408, false, 1, {}, 5632});
}

// A positive integer or null (no window); HF's class default (4096) when absent.
Status read_sliding_window(const json& j, const std::string& source, ModelConfig& c) {
  c.sliding_window = 4096;
  if (!j.contains("sliding_window")) return Status();
  const json& v = j.at("sliding_window");
  if (v.is_null()) {
    c.sliding_window.reset();
    return Status();
  }
  if (!v.is_number_integer() || v.get<int64_t>() <= 0) {
    return field_error(source, "sliding_window", "must be a positive integer or null, got " + v.dump());
  }
  c.sliding_window = v.get<int64_t>();
  return Status();
}

// Mistral: Llama's maths, no biases anywhere (HF ignores attention_bias), sliding_window honoured.
Status mistral_specifics(const json& j, const std::string& source, ModelConfig& c) {
  c.attention_bias = false;
  return read_sliding_window(j, source, c);
}

// A softcap: a positive number, or null (off); `fallback` when absent (nullopt: off).
Status read_softcap(const json& j, const std::string& source, const char* field, std::optional<double> fallback,
                    std::optional<double>& out) {
  out = fallback;
  if (!j.contains(field)) return Status();
  const json& v = j.at(field);
  if (v.is_null()) {
    out.reset();
    return Status();
  }
  if (!v.is_number() || !(v.get<double>() > 0.0)) {
    return field_error(source, field, "must be a positive number or null, got " + v.dump());
  }
  out = v.get<double>();
  return Status();
}

Status read_layer_types(const json& j, const std::string& source, ModelConfig& c) {
  if (!j.contains("layer_types") || j.at("layer_types").is_null()) return Status();
  const json& v = j.at("layer_types");
  if (!v.is_array()) return field_error(source, "layer_types", "must be a list of strings");
  for (const json& e : v) {
    if (!e.is_string() || (e != "sliding_attention" && e != "full_attention")) {
      return field_error(source, "layer_types",
                         "holds " + e.dump() + "; only \"sliding_attention\" and \"full_attention\" are supported");
    }
    c.layer_types.push_back(e.get<std::string>());
  }
  return Status();
}

// The Gemmas' attention keys: causal only, attention_bias, query_pre_attn_scalar (256), the
// softcaps (HF's defaults given: Gemma2's 50 and 30, Gemma3's none), sliding_window, layer_types.
Status read_gemma_attention(const json& j, const std::string& source, std::optional<double> attn_cap,
                            std::optional<double> final_cap, ModelConfig& c) {
  TESSERA_RETURN_IF_ERROR(require_false(j, source, "use_bidirectional_attention", "causal attention only"));
  TESSERA_RETURN_IF_ERROR(read_bool(j, source, "attention_bias", c.attention_bias));
  c.query_pre_attn_scalar = 256.0;
  TESSERA_RETURN_IF_ERROR(read_double(j, source, "query_pre_attn_scalar", c.query_pre_attn_scalar));
  if (!(c.query_pre_attn_scalar > 0.0)) return field_error(source, "query_pre_attn_scalar", "must be positive");
  TESSERA_RETURN_IF_ERROR(read_softcap(j, source, "attn_logit_softcapping", attn_cap, c.attn_logit_softcapping));
  TESSERA_RETURN_IF_ERROR(read_softcap(j, source, "final_logit_softcapping", final_cap, c.final_logit_softcapping));
  TESSERA_RETURN_IF_ERROR(read_sliding_window(j, source, c));
  return read_layer_types(j, source, c);
}

// Gemma2: HF Gemma2Config's defaults for every key that changes the maths.
Status gemma2_specifics(const json& j, const std::string& source, ModelConfig& c) {
  return read_gemma_attention(j, source, 50.0, 30.0, c);
}

// Gemma3TextConfig: Gemma2's attention (scale, window) without softcaps by default, q_norm/k_norm
// (ModelConfig::qk_norm), and layer types from sliding_window_pattern when not listed (every
// pattern-th layer full). Its RoPE (two bases) is read by read_rope.
Status gemma3_specifics(const json& j, const std::string& source, ModelConfig& c) {
  TESSERA_RETURN_IF_ERROR(read_gemma_attention(j, source, std::nullopt, std::nullopt, c));
  if (!c.layer_types.empty()) return Status();
  // transformers derives the types from sliding_window_pattern only (the _sliding_window_pattern it
  // writes beside layer_types is not read back).
  int64_t pattern = 6;
  TESSERA_RETURN_IF_ERROR(read_int(j, source, "sliding_window_pattern", pattern));
  if (pattern <= 0) return field_error(source, "sliding_window_pattern", "must be positive");
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    c.layer_types.emplace_back((i + 1) % pattern != 0 ? "sliding_attention" : "full_attention");
  }
  return Status();
}

const std::vector<const char*> kMoeFields = {"num_experts", "num_local_experts", "num_experts_per_tok",
                                             "moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step",
                                             "mlp_only_layers"};
const std::vector<const char*> kQwen2MoeFields = {"num_experts", "num_experts_per_tok", "moe_intermediate_size",
                                                  "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers",
                                                  "shared_expert_intermediate_size", "qkv_bias"};

const std::vector<ModelTypeTraits>& model_types() {
  static const std::vector<ModelTypeTraits> table = {
      {"llama", "LlamaForCausalLM", "LlamaForTokenClassification", 2048, 0, llama_specifics},
      {"qwen2", "Qwen2ForCausalLM", "Qwen2ForTokenClassification", 32768, 0, qwen2_specifics},
      {"qwen3", "Qwen3ForCausalLM", "Qwen3ForTokenClassification", 32768, 128, qwen3_specifics},
      {"qwen2_moe", "Qwen2MoeForCausalLM", "Qwen2MoeForTokenClassification", 32768, 0, qwen2_moe_specifics,
       /*default_tie=*/false, "hidden_act", "silu", kQwen2MoeFields},
      {"qwen3_moe", "Qwen3MoeForCausalLM", "Qwen3MoeForTokenClassification", 32768, 0, qwen3_moe_specifics,
       /*default_tie=*/false, "hidden_act", "silu", kMoeFields},
      {"mistral", "MistralForCausalLM", "MistralForTokenClassification", 4096 * 32, 0, mistral_specifics,
       /*default_tie=*/false, "hidden_act", "silu", {"sliding_window"}},
      {"gemma2", "Gemma2ForCausalLM", "Gemma2ForTokenClassification", 8192, 256, gemma2_specifics,
       /*default_tie=*/true, "hidden_activation", "gelu_pytorch_tanh",
       {"sliding_window", "layer_types", "query_pre_attn_scalar", "attn_logit_softcapping",
        "final_logit_softcapping"}},
      // No Gemma3ForTokenClassification in transformers: no value model (a critic or reward model).
      {"gemma3_text", "Gemma3ForCausalLM", "", 131072, 256, gemma3_specifics,
       /*default_tie=*/true, "hidden_activation", "gelu_pytorch_tanh",
       {"sliding_window", "layer_types", "query_pre_attn_scalar", "attn_logit_softcapping",
        "final_logit_softcapping", "rope_local_base_freq", "sliding_window_pattern", "_sliding_window_pattern"}},
  };
  return table;
}

}  // namespace

Result<const ModelTypeTraits*> find_model_type(const std::string& model_type, const std::string& source) {
  std::string known;
  for (const auto& t : model_types()) {
    if (t.model_type == model_type) return &t;
    known += (known.empty() ? "" : ", ") + std::string(t.model_type);
  }
  return make_error(ErrorCode::invalid_argument, "{}: field 'model_type' = '{}' is not supported (known: {})",
                    source, model_type, known);
}

namespace {

// The MoE sizes: only on the MoE families, in range. The experts' matrices go through a grouped
// GEMM whose rows must start on 16-byte boundaries (Note [MoE experts] in decoder.cpp): hidden_size
// and moe_intermediate_size are multiples of 8, as in every released MoE checkpoint.
Status validate_moe_fields(const ModelConfig& c, const std::string& source) {
  const MoeConfig& m = c.moe;
  const bool moe_family = c.model_type == "qwen3_moe" || c.model_type == "qwen2_moe";
  if (!moe_family) {
    if (m.num_experts != 0) return field_error(source, "num_experts", "is read for qwen3_moe and qwen2_moe only");
    return Status();
  }
  if (m.num_experts < 0) return field_error(source, "num_experts", "must be >= 0");
  if (m.decoder_sparse_step <= 0) return field_error(source, "decoder_sparse_step", "must be positive");
  for (int64_t i : m.mlp_only_layers) {
    if (i < 0 || i >= c.num_hidden_layers) {
      return field_error(source, "mlp_only_layers", fmt::format("holds {}, not a layer of {}", i, c.num_hidden_layers));
    }
  }
  if (m.num_experts == 0) return Status();
  if (m.num_experts_per_tok <= 0 || m.num_experts_per_tok > m.num_experts) {
    return field_error(source, "num_experts_per_tok",
                       fmt::format("= {} must lie in [1, num_experts = {}]", m.num_experts_per_tok, m.num_experts));
  }
  if (m.moe_intermediate_size <= 0 || m.moe_intermediate_size % 8 != 0) {
    return field_error(source, "moe_intermediate_size",
                       fmt::format("= {} must be a positive multiple of 8 (grouped expert GEMMs)", m.moe_intermediate_size));
  }
  if (c.hidden_size % 8 != 0) {
    return field_error(source, "hidden_size",
                       fmt::format("= {} must be a multiple of 8 in a MoE model (grouped expert GEMMs)", c.hidden_size));
  }
  if (c.model_type == "qwen2_moe" && m.shared_expert_intermediate_size <= 0) {
    return field_error(source, "shared_expert_intermediate_size", "must be positive");
  }
  return Status();
}

}  // namespace

// The Mistral/Gemma2 fields the decoder reads: only on the families that have them, in range.
Status validate_family_fields(const ModelConfig& c, const std::string& source) {
  const bool gemma = c.gemma_norms();
  if (c.hidden_act != (gemma ? "gelu_pytorch_tanh" : "silu")) {
    return field_error(source, gemma ? "hidden_activation" : "hidden_act", "= '" + c.hidden_act + "' is not supported");
  }
  if (c.sliding_window && (*c.sliding_window <= 0 || (!gemma && c.model_type != "mistral"))) {
    return field_error(source, "sliding_window", "is honoured for mistral and the Gemmas only, and must be positive");
  }
  if (!c.layer_types.empty() && (!gemma || static_cast<int64_t>(c.layer_types.size()) != c.num_hidden_layers)) {
    return field_error(source, "layer_types", "is the Gemmas', with one entry per layer");
  }
  const bool gemma_fields = c.query_pre_attn_scalar != 0.0 || c.attn_logit_softcapping || c.final_logit_softcapping;
  if (gemma_fields && !gemma) {
    return field_error(source, "query_pre_attn_scalar", "and the logit softcaps are the Gemmas' fields");
  }
  if (c.query_pre_attn_scalar < 0.0) return field_error(source, "query_pre_attn_scalar", "must be positive");
  if (c.model_type == "gemma3_text") {
    if (static_cast<int64_t>(c.layer_types.size()) != c.num_hidden_layers) {
      return field_error(source, "layer_types", "must list every layer of gemma3_text");
    }
    if (!c.rope_local_theta || !(*c.rope_local_theta > 0.0)) {
      return field_error(source, "rope_local_base_freq", "must be positive for gemma3_text");
    }
  } else if (c.rope_local_theta) {
    return field_error(source, "rope_local_base_freq", "is gemma3_text's field");
  }
  TESSERA_RETURN_IF_ERROR(validate_moe_fields(c, source));
  for (const auto& [name, cap] : {std::pair{"attn_logit_softcapping", c.attn_logit_softcapping},
                                  std::pair{"final_logit_softcapping", c.final_logit_softcapping}}) {
    if (cap && !(*cap > 0.0)) return field_error(source, name, "must be positive");
  }
  return Status();
}

// Mistral's, Gemma2's and the MoE families' own keys, always written (an absent one would mean
// HF's default, not ours).
void write_family_fields(const ModelConfig& c, json& j) {
  auto optional = [](const auto& v) { return v ? json(*v) : json(nullptr); };
  if (c.model_type == "qwen3_moe" || c.model_type == "qwen2_moe") {
    const MoeConfig& m = c.moe;
    j["num_experts"] = m.num_experts;
    j["num_experts_per_tok"] = m.num_experts_per_tok;
    j["moe_intermediate_size"] = m.moe_intermediate_size;
    j["norm_topk_prob"] = m.norm_topk_prob;
    j["decoder_sparse_step"] = m.decoder_sparse_step;
    j["mlp_only_layers"] = m.mlp_only_layers;
    if (c.model_type == "qwen2_moe") {
      j["shared_expert_intermediate_size"] = m.shared_expert_intermediate_size;
      j["qkv_bias"] = c.attention_bias;
    }
  }
  if (c.model_type == "mistral" || c.gemma_norms()) j["sliding_window"] = optional(c.sliding_window);
  if (!c.gemma_norms()) return;
  if (c.rope_local_theta) j["rope_local_base_freq"] = *c.rope_local_theta;
  std::vector<std::string> types = c.layer_types;
  for (int64_t i = static_cast<int64_t>(types.size()); i < c.num_hidden_layers; ++i) {
    types.push_back(c.layer_slides(i) || (!c.sliding_window && i % 2 == 0) ? "sliding_attention" : "full_attention");
  }
  j["layer_types"] = types;
  j["query_pre_attn_scalar"] = c.query_pre_attn_scalar > 0.0 ? c.query_pre_attn_scalar : static_cast<double>(c.head_dim);
  j["attn_logit_softcapping"] = optional(c.attn_logit_softcapping);
  j["final_logit_softcapping"] = optional(c.final_logit_softcapping);
}

}  // namespace tessera::models::internal
