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

// A softcap: a positive number, or null (off); `fallback` when absent.
Status read_softcap(const json& j, const std::string& source, const char* field, double fallback,
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

// Gemma2: HF Gemma2Config's defaults for every key that changes the maths.
Status gemma2_specifics(const json& j, const std::string& source, ModelConfig& c) {
  TESSERA_RETURN_IF_ERROR(require_false(j, source, "use_bidirectional_attention", "causal attention only"));
  TESSERA_RETURN_IF_ERROR(read_bool(j, source, "attention_bias", c.attention_bias));
  c.query_pre_attn_scalar = 256.0;
  TESSERA_RETURN_IF_ERROR(read_double(j, source, "query_pre_attn_scalar", c.query_pre_attn_scalar));
  if (!(c.query_pre_attn_scalar > 0.0)) return field_error(source, "query_pre_attn_scalar", "must be positive");
  TESSERA_RETURN_IF_ERROR(read_softcap(j, source, "attn_logit_softcapping", 50.0, c.attn_logit_softcapping));
  TESSERA_RETURN_IF_ERROR(read_softcap(j, source, "final_logit_softcapping", 30.0, c.final_logit_softcapping));
  TESSERA_RETURN_IF_ERROR(read_sliding_window(j, source, c));
  return read_layer_types(j, source, c);
}

const std::vector<ModelTypeTraits>& model_types() {
  static const std::vector<ModelTypeTraits> table = {
      {"llama", "LlamaForCausalLM", "LlamaForTokenClassification", 2048, 0, llama_specifics},
      {"qwen2", "Qwen2ForCausalLM", "Qwen2ForTokenClassification", 32768, 0, qwen2_specifics},
      {"qwen3", "Qwen3ForCausalLM", "Qwen3ForTokenClassification", 32768, 128, qwen3_specifics},
      {"mistral", "MistralForCausalLM", "MistralForTokenClassification", 4096 * 32, 0, mistral_specifics,
       /*default_tie=*/false, "hidden_act", "silu", {"sliding_window"}},
      {"gemma2", "Gemma2ForCausalLM", "Gemma2ForTokenClassification", 8192, 256, gemma2_specifics,
       /*default_tie=*/true, "hidden_activation", "gelu_pytorch_tanh",
       {"sliding_window", "layer_types", "query_pre_attn_scalar", "attn_logit_softcapping",
        "final_logit_softcapping"}},
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

// The Mistral/Gemma2 fields the decoder reads: only on the families that have them, in range.
Status validate_family_fields(const ModelConfig& c, const std::string& source) {
  const bool gemma = c.model_type == "gemma2";
  if (c.hidden_act != (gemma ? "gelu_pytorch_tanh" : "silu")) {
    return field_error(source, gemma ? "hidden_activation" : "hidden_act", "= '" + c.hidden_act + "' is not supported");
  }
  if (c.sliding_window && (*c.sliding_window <= 0 || (!gemma && c.model_type != "mistral"))) {
    return field_error(source, "sliding_window", "is honoured for mistral and gemma2 only, and must be positive");
  }
  if (!c.layer_types.empty() && (!gemma || static_cast<int64_t>(c.layer_types.size()) != c.num_hidden_layers)) {
    return field_error(source, "layer_types", "is gemma2's, with one entry per layer");
  }
  const bool gemma_fields = c.query_pre_attn_scalar != 0.0 || c.attn_logit_softcapping || c.final_logit_softcapping;
  if (gemma_fields && !gemma) {
    return field_error(source, "query_pre_attn_scalar", "and the logit softcaps are gemma2's fields");
  }
  if (c.query_pre_attn_scalar < 0.0) return field_error(source, "query_pre_attn_scalar", "must be positive");
  for (const auto& [name, cap] : {std::pair{"attn_logit_softcapping", c.attn_logit_softcapping},
                                  std::pair{"final_logit_softcapping", c.final_logit_softcapping}}) {
    if (cap && !(*cap > 0.0)) return field_error(source, name, "must be positive");
  }
  return Status();
}

// Mistral's and Gemma2's own keys, always written (an absent one would mean HF's default, not ours).
void write_family_fields(const ModelConfig& c, json& j) {
  auto optional = [](const auto& v) { return v ? json(*v) : json(nullptr); };
  if (c.model_type == "mistral" || c.model_type == "gemma2") j["sliding_window"] = optional(c.sliding_window);
  if (c.model_type != "gemma2") return;
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
