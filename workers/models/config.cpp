// config.cpp: HF config.json <-> ModelConfig. Per-model-type behaviour (defaults, fields refused)
// is a table of small functions keyed by model_type, so adding a family is adding a row.
#include "workers/models/config.hpp"

#include <filesystem>
#include <fstream>
#include <functional>

#include "proto/atomic_file.hpp"

namespace tessera::models {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Fields parse_model_config turns into ModelConfig members; everything else goes to `extra`.
const char* const kModelledFields[] = {
    "architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size",
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
    "rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings", "tie_word_embeddings",
    "attention_bias",
    "initializer_range", "bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "dtype"};

Status field_error(const std::string& source, const std::string& field, const std::string& what) {
  return make_error(ErrorCode::invalid_argument, "{}: field '{}' {}", source, field, what);
}

Result<int64_t> get_int(const json& j, const std::string& source, const char* field) {
  if (!j.contains(field)) return field_error(source, field, "is missing");
  const json& v = j.at(field);
  if (!v.is_number_integer()) return field_error(source, field, "must be an integer, got " + v.dump());
  return v.get<int64_t>();
}

Status read_int(const json& j, const std::string& source, const char* field, int64_t& out) {
  if (!j.contains(field) || j.at(field).is_null()) return Status();
  TESSERA_ASSIGN_OR_RETURN(out, get_int(j, source, field));
  return Status();
}

Status read_double(const json& j, const std::string& source, const char* field, double& out) {
  if (!j.contains(field) || j.at(field).is_null()) return Status();
  const json& v = j.at(field);
  if (!v.is_number()) return field_error(source, field, "must be a number, got " + v.dump());
  out = v.get<double>();
  return Status();
}

Status read_bool(const json& j, const std::string& source, const char* field, bool& out) {
  if (!j.contains(field) || j.at(field).is_null()) return Status();
  const json& v = j.at(field);
  if (!v.is_boolean()) return field_error(source, field, "must be a boolean, got " + v.dump());
  out = v.get<bool>();
  return Status();
}

Status read_optional_id(const json& j, const std::string& source, const char* field,
                        std::optional<int64_t>& out) {
  if (!j.contains(field) || j.at(field).is_null()) return Status();
  TESSERA_ASSIGN_OR_RETURN(int64_t id, get_int(j, source, field));
  out = id;
  return Status();
}

Status read_eos(const json& j, const std::string& source, ModelConfig& c) {
  if (!j.contains("eos_token_id") || j.at("eos_token_id").is_null()) return Status();
  const json& v = j.at("eos_token_id");
  if (v.is_number_integer()) {
    c.eos_token_ids = {v.get<int64_t>()};
    return Status();
  }
  if (!v.is_array()) return field_error(source, "eos_token_id", "must be an integer or a list");
  c.eos_is_list = true;
  for (const json& e : v) {
    if (!e.is_number_integer()) return field_error(source, "eos_token_id", "must hold integers");
    c.eos_token_ids.push_back(e.get<int64_t>());
  }
  return Status();
}

bool is_implemented_rope_type(const std::string& type) {
  return type == "default" || type == "linear" || type == "dynamic" || type == "llama3";
}

Status unsupported_rope_type(const std::string& source, const std::string& key, const std::string& type) {
  return field_error(source, key, "(type '" + type +
                                      "') is not supported; Tessera implements default, linear, dynamic and llama3 RoPE");
}

// partial_rotary_factor (top level or in the RoPE dict): transformers 5 applies it to every model's
// RoPE; only 1 (rotate the whole head) is implemented.
Status check_partial_rotary(const json& j, const std::string& source, const std::string& key) {
  if (!j.contains("partial_rotary_factor") || j.at("partial_rotary_factor").is_null()) return Status();
  const json& v = j.at("partial_rotary_factor");
  if (v.is_number() && v.get<double>() == 1.0) return Status();
  const std::string where = key.empty() ? std::string() : " in '" + key + "'";
  return field_error(source, key.empty() ? "partial_rotary_factor" : key,
                     "has partial_rotary_factor = " + v.dump() + where + "; only 1 (full-head RoPE) is supported");
}

// One number of the RoPE dict `key`; `required` ones must be present.
Status rope_number(const json& v, const std::string& source, const std::string& key, const std::string& type,
                   const char* name, bool required, double& out) {
  if (!v.contains(name) || v.at(name).is_null()) {
    if (!required) return Status();
    return field_error(source, key, "(type '" + type + "') needs a number '" + name + "'");
  }
  if (!v.at(name).is_number()) {
    return field_error(source, key, std::string("'") + name + "' must be a number, got " + v.at(name).dump());
  }
  out = v.at(name).get<double>();
  return Status();
}

// RoPE, as transformers 5 reads it (see config.hpp): the dict is rope_scaling when non-empty, else
// rope_parameters; its rope_theta wins over the top-level one. Unimplemented types are refused
// naming the key and the type. Needs max_position_embeddings (llama3's default original length).
Status read_rope(const json& j, const std::string& source, ModelConfig& c) {
  TESSERA_RETURN_IF_ERROR(read_double(j, source, "rope_theta", c.rope_theta));
  TESSERA_RETURN_IF_ERROR(check_partial_rotary(j, source, ""));
  std::string key;
  for (const char* k : {"rope_scaling", "rope_parameters"}) {
    if (!j.contains(k) || j.at(k).is_null()) continue;
    if (!j.at(k).is_object()) return field_error(source, k, "must be an object or null, got " + j.at(k).dump());
    if (j.at(k).empty()) continue;
    key = k;
    break;
  }
  if (key.empty()) return Status();
  const json& v = j.at(key);
  for (const auto& [name, value] : v.items()) {
    if (value.is_object()) {
      return field_error(source, key, "holds per-layer-type RoPE parameters ('" + name + "'), which are not supported");
    }
  }
  std::string type = "default";
  for (const char* name : {"rope_type", "type"}) {
    if (!v.contains(name) || v.at(name).is_null()) continue;
    if (!v.at(name).is_string()) return field_error(source, key, std::string("'") + name + "' must be a string");
    type = v.at(name).get<std::string>();
    break;
  }
  if (!is_implemented_rope_type(type)) return unsupported_rope_type(source, key, type);
  TESSERA_RETURN_IF_ERROR(check_partial_rotary(v, source, key));
  TESSERA_RETURN_IF_ERROR(rope_number(v, source, key, type, "rope_theta", /*required=*/false, c.rope_theta));
  RopeScaling& r = c.rope_scaling;
  r = RopeScaling();
  r.rope_type = type;
  if (type == "default") return Status();
  TESSERA_RETURN_IF_ERROR(rope_number(v, source, key, type, "factor", /*required=*/true, r.factor));
  if (type != "llama3") return Status();
  TESSERA_RETURN_IF_ERROR(rope_number(v, source, key, type, "low_freq_factor", true, r.low_freq_factor));
  TESSERA_RETURN_IF_ERROR(rope_number(v, source, key, type, "high_freq_factor", true, r.high_freq_factor));
  // HF: a top-level original_max_position_embeddings wins, then the dict's, then max_position_embeddings.
  r.original_max_position_embeddings = c.max_position_embeddings;
  for (const json* holder : {&v, &j}) {
    if (!holder->contains("original_max_position_embeddings")) continue;
    const json& o = holder->at("original_max_position_embeddings");
    if (o.is_null()) continue;
    if (!o.is_number_integer()) {
      return field_error(source, holder == &j ? std::string("original_max_position_embeddings") : key,
                         "original_max_position_embeddings must be an integer, got " + o.dump());
    }
    r.original_max_position_embeddings = o.get<int64_t>();
  }
  return Status();
}

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

Status require_false(const json& j, const std::string& source, const char* field, const char* why) {
  if (!j.contains(field) || j.at(field).is_null()) return Status();
  if (j.at(field) == false) return Status();
  return field_error(source, field, std::string("= ") + j.at(field).dump() + " is not supported (" + why + ")");
}

Status require_zero(const json& j, const std::string& source, const char* field) {
  if (!j.contains(field) || j.at(field).is_null()) return Status();
  if (j.at(field).is_number() && j.at(field).get<double>() == 0.0) return Status();
  return field_error(source, field, "= " + j.at(field).dump() +
                                        " is not supported (Tessera's decoder has no dropout)");
}

// One row per model family: HF class names, defaults and the fields it refuses. `specifics` runs
// after the sizes and scalars are read.
struct ModelTypeTraits {
  const char* model_type;
  const char* causal_arch;
  const char* value_arch;
  int64_t default_max_positions;
  int64_t default_head_dim;  ///< 0: hidden_size / num_attention_heads.
  std::function<Status(const json&, const std::string&, ModelConfig&)> specifics;
  bool default_tie = false;                ///< tie_word_embeddings when absent.
  const char* activation_key = "hidden_act";
  const char* activation = "silu";         ///< The one activation implemented (and HF's default).
  std::vector<const char*> own_fields;     ///< Further keys `specifics` models (not kept in `extra`).
};

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

Result<const ModelTypeTraits*> find_model_type(const std::string& model_type, const std::string& source) {
  std::string known;
  for (const auto& t : model_types()) {
    if (t.model_type == model_type) return &t;
    known += (known.empty() ? "" : ", ") + std::string(t.model_type);
  }
  return make_error(ErrorCode::invalid_argument, "{}: field 'model_type' = '{}' is not supported (known: {})",
                    source, model_type, known);
}

Status check_common_refusals(const json& j, const std::string& source) {
  TESSERA_RETURN_IF_ERROR(require_zero(j, source, "attention_dropout"));
  if (j.contains("id2label") && j.at("id2label").is_object() && j.at("id2label").size() != 1) {
    return field_error(source, "id2label", "must have exactly one label (num_labels=1 value head)");
  }
  return Status();
}

Status read_sizes(const json& j, const std::string& source, int64_t default_head_dim, ModelConfig& c) {
  TESSERA_ASSIGN_OR_RETURN(c.vocab_size, get_int(j, source, "vocab_size"));
  TESSERA_ASSIGN_OR_RETURN(c.hidden_size, get_int(j, source, "hidden_size"));
  TESSERA_ASSIGN_OR_RETURN(c.intermediate_size, get_int(j, source, "intermediate_size"));
  TESSERA_ASSIGN_OR_RETURN(c.num_hidden_layers, get_int(j, source, "num_hidden_layers"));
  TESSERA_ASSIGN_OR_RETURN(c.num_attention_heads, get_int(j, source, "num_attention_heads"));
  c.num_key_value_heads = c.num_attention_heads;
  TESSERA_RETURN_IF_ERROR(read_int(j, source, "num_key_value_heads", c.num_key_value_heads));
  if (c.num_attention_heads > 0) c.head_dim = c.hidden_size / c.num_attention_heads;
  if (default_head_dim > 0) c.head_dim = default_head_dim;
  return read_int(j, source, "head_dim", c.head_dim);
}

Status read_scalars(const json& j, const std::string& source, ModelConfig& c) {
  TESSERA_RETURN_IF_ERROR(read_double(j, source, "rms_norm_eps", c.rms_norm_eps));
  TESSERA_RETURN_IF_ERROR(read_int(j, source, "max_position_embeddings", c.max_position_embeddings));
  TESSERA_RETURN_IF_ERROR(read_bool(j, source, "tie_word_embeddings", c.tie_word_embeddings));
  TESSERA_RETURN_IF_ERROR(read_double(j, source, "initializer_range", c.initializer_range));
  TESSERA_RETURN_IF_ERROR(read_optional_id(j, source, "bos_token_id", c.bos_token_id));
  TESSERA_RETURN_IF_ERROR(read_optional_id(j, source, "pad_token_id", c.pad_token_id));
  return read_eos(j, source, c);
}

Status read_strings(const json& j, const std::string& source, const ModelTypeTraits& t, ModelConfig& c) {
  for (const char* key : {"torch_dtype", "dtype"}) {
    if (!j.contains(key) || j.at(key).is_null()) continue;
    if (!j.at(key).is_string()) return field_error(source, key, "must be a string");
    c.torch_dtype = j.at(key).get<std::string>();
    auto parsed = parse_torch_dtype(c.torch_dtype);
    if (!parsed.ok()) return field_error(source, key, "= '" + c.torch_dtype + "' is not supported");
  }
  const char* key = t.activation_key;
  c.hidden_act = t.activation;
  if (j.contains(key) && !j.at(key).is_null()) {
    if (!j.at(key).is_string()) return field_error(source, key, "must be a string");
    c.hidden_act = j.at(key).get<std::string>();
  }
  if (c.hidden_act != t.activation) {
    return field_error(source, key, "= '" + c.hidden_act + "' is not supported (only " + t.activation + ")");
  }
  return Status();
}

Status read_architecture(const json& j, const std::string& source, const ModelTypeTraits& t,
                         ModelConfig& c) {
  c.architecture = t.causal_arch;
  if (!j.contains("architectures") || j.at("architectures").is_null()) return Status();
  const json& a = j.at("architectures");
  if (!a.is_array() || a.empty() || !a.at(0).is_string()) {
    return field_error(source, "architectures", "must be a non-empty list of strings");
  }
  c.architecture = a.at(0).get<std::string>();
  return Status();
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

// The RoPE scaling parameters the decoder's formulas need (config.hpp, RopeScaling).
Status validate_rope_scaling(const ModelConfig& c, const std::string& source) {
  const RopeScaling& r = c.rope_scaling;
  if (r.rope_type == "default") return Status();
  if (!is_implemented_rope_type(r.rope_type)) return unsupported_rope_type(source, "rope_scaling", r.rope_type);
  if (!(r.factor > 0.0)) return field_error(source, "rope_scaling", fmt::format("factor = {} must be positive", r.factor));
  if (r.rope_type == "dynamic" && c.head_dim <= 2) {
    return field_error(source, "rope_scaling", "(type 'dynamic') needs head_dim > 2");
  }
  if (r.rope_type != "llama3") return Status();
  if (!(r.low_freq_factor > 0.0) || !(r.high_freq_factor > r.low_freq_factor)) {
    return field_error(source, "rope_scaling",
                       fmt::format("(type 'llama3') needs 0 < low_freq_factor < high_freq_factor, got {} and {}",
                                   r.low_freq_factor, r.high_freq_factor));
  }
  if (r.original_max_position_embeddings < 0) {
    return field_error(source, "rope_scaling", "original_max_position_embeddings must not be negative");
  }
  return Status();
}

json rope_scaling_json(const ModelConfig& c) {
  const RopeScaling& r = c.rope_scaling;
  if (r.rope_type == "default") return json(nullptr);
  json s = {{"rope_type", r.rope_type}, {"factor", r.factor}};
  if (r.rope_type == "llama3") {
    s["low_freq_factor"] = r.low_freq_factor;
    s["high_freq_factor"] = r.high_freq_factor;
    s["original_max_position_embeddings"] =
        r.original_max_position_embeddings > 0 ? r.original_max_position_embeddings : c.max_position_embeddings;
  }
  return s;
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

}  // namespace

Result<ModelConfig> parse_model_config(const json& j, const std::string& source) {
  if (!j.is_object()) return make_error(ErrorCode::invalid_argument, "{}: not a JSON object", source);
  if (!j.contains("model_type") || !j.at("model_type").is_string()) {
    return field_error(source, "model_type", "is missing or not a string");
  }
  ModelConfig c;
  c.model_type = j.at("model_type").get<std::string>();
  TESSERA_ASSIGN_OR_RETURN(const ModelTypeTraits* traits, find_model_type(c.model_type, source));
  c.max_position_embeddings = traits->default_max_positions;
  c.tie_word_embeddings = traits->default_tie;
  TESSERA_RETURN_IF_ERROR(read_architecture(j, source, *traits, c));
  TESSERA_RETURN_IF_ERROR(check_common_refusals(j, source));
  TESSERA_RETURN_IF_ERROR(read_sizes(j, source, traits->default_head_dim, c));
  TESSERA_RETURN_IF_ERROR(read_scalars(j, source, c));
  TESSERA_RETURN_IF_ERROR(read_rope(j, source, c));
  TESSERA_RETURN_IF_ERROR(traits->specifics(j, source, c));
  TESSERA_RETURN_IF_ERROR(read_strings(j, source, *traits, c));
  for (const auto& [key, value] : j.items()) {
    const auto& own = traits->own_fields;
    if (std::find(std::begin(kModelledFields), std::end(kModelledFields), key) != std::end(kModelledFields)) continue;
    if (key == traits->activation_key) continue;
    if (std::find_if(own.begin(), own.end(), [&](const char* f) { return key == f; }) != own.end()) continue;
    c.extra[key] = value;
  }
  TESSERA_RETURN_IF_ERROR(validate_model_config(c, source));
  return c;
}

Status validate_model_config(const ModelConfig& c, const std::string& source) {
  const std::pair<const char*, int64_t> positive[] = {
      {"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size}, {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads}, {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_dim}, {"max_position_embeddings", c.max_position_embeddings}};
  for (const auto& [name, value] : positive) {
    if (value <= 0) return field_error(source, name, "must be positive, got " + std::to_string(value));
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return field_error(source, "num_key_value_heads",
                       fmt::format("= {} does not divide num_attention_heads = {}",
                                   c.num_key_value_heads, c.num_attention_heads));
  }
  if (c.head_dim % 2 != 0) return field_error(source, "head_dim", "must be even (RoPE rotates pairs)");
  if (!(c.rms_norm_eps > 0.0)) return field_error(source, "rms_norm_eps", "must be positive");
  if (!(c.rope_theta > 0.0)) return field_error(source, "rope_theta", "must be positive");
  TESSERA_RETURN_IF_ERROR(validate_family_fields(c, source));
  return validate_rope_scaling(c, source);
}

bool ModelConfig::layer_slides(int64_t index) const {
  if (!sliding_window) return false;
  if (!layer_types.empty()) return layer_types.at(static_cast<size_t>(index)) == "sliding_attention";
  return model_type != "gemma2" || index % 2 == 0;  // Gemma2Config: (i + 1) % 2 slides
}

Result<ModelConfig> load_model_config(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return make_error(ErrorCode::not_found, "{}: no such directory", path);
  std::string file = fs::is_directory(path) ? (fs::path(path) / "config.json").string() : path;
  std::ifstream in(file);
  if (!in) return make_error(ErrorCode::not_found, "{}: cannot open", file);
  json j = json::parse(in, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return make_error(ErrorCode::corrupt_data, "{}: not valid JSON", file);
  return parse_model_config(j, file);
}

json model_config_to_json(const ModelConfig& c) {
  json j = c.extra;
  j["architectures"] = json::array({c.architecture});
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  // Qwen3's head_dim defaults to 128 and Gemma2's to 256, not hidden_size / num_attention_heads:
  // always written there.
  const bool own_head_dim = c.model_type == "qwen3" || c.model_type == "gemma2";
  if (own_head_dim || c.head_dim != c.hidden_size / c.num_attention_heads) j["head_dim"] = c.head_dim;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = rope_scaling_json(c);
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  // Qwen2 and Mistral have no such key
  if (c.model_type != "qwen2" && c.model_type != "mistral") j["attention_bias"] = c.attention_bias;
  j["initializer_range"] = c.initializer_range;
  j["torch_dtype"] = c.torch_dtype;
  j[c.model_type == "gemma2" ? "hidden_activation" : "hidden_act"] = c.hidden_act;
  write_family_fields(c, j);
  j["bos_token_id"] = c.bos_token_id ? json(*c.bos_token_id) : json(nullptr);
  j["pad_token_id"] = c.pad_token_id ? json(*c.pad_token_id) : json(nullptr);
  if (c.eos_is_list || c.eos_token_ids.size() > 1) {
    j["eos_token_id"] = c.eos_token_ids;
  } else {
    j["eos_token_id"] = c.eos_token_ids.empty() ? json(nullptr) : json(c.eos_token_ids.front());
  }
  return j;
}

Status save_model_config(const ModelConfig& config, const std::string& dir) {
  std::string text = model_config_to_json(config).dump(2) + "\n";
  return proto::write_file_atomic((fs::path(dir) / "config.json").string(), text);
}

Result<std::string> architecture_name(const std::string& model_type, HeadKind head) {
  TESSERA_ASSIGN_OR_RETURN(const ModelTypeTraits* t, find_model_type(model_type, "architecture_name"));
  return std::string(head == HeadKind::causal_lm ? t->causal_arch : t->value_arch);
}

Result<std::string> torch_dtype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Float: return std::string("float32");
    case c10::ScalarType::BFloat16: return std::string("bfloat16");
    case c10::ScalarType::Half: return std::string("float16");
    default: break;
  }
  return make_error(ErrorCode::invalid_argument, "dtype {} has no HF torch_dtype name", c10::toString(dtype));
}

Result<c10::ScalarType> parse_torch_dtype(const std::string& name) {
  if (name == "float32" || name == "float") return c10::ScalarType::Float;
  if (name == "bfloat16") return c10::ScalarType::BFloat16;
  if (name == "float16" || name == "half") return c10::ScalarType::Half;
  return make_error(ErrorCode::invalid_argument, "torch_dtype '{}' is not supported (float32, bfloat16, float16)", name);
}

}  // namespace tessera::models
