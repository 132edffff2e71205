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
    "rope_theta", "max_position_embeddings", "tie_word_embeddings", "attention_bias",
    "initializer_range", "bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "dtype",
    "hidden_act"};

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

// rope_scaling: only absent/null or an explicit "default" type means plain RoPE.
Status check_rope_scaling(const json& j, const std::string& source) {
  if (!j.contains("rope_scaling") || j.at("rope_scaling").is_null()) return Status();
  const json& v = j.at("rope_scaling");
  std::string type = "?";
  if (v.is_object()) type = v.value("rope_type", v.value("type", std::string("?")));
  if (type == "default") return Status();
  return field_error(source, "rope_scaling",
                     "(type '" + type + "') is not supported; Tessera implements plain RoPE only");
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

// One row per model family: HF class names and the fields it refuses.
struct ModelTypeTraits {
  const char* model_type;
  const char* causal_arch;
  const char* value_arch;
  int64_t default_max_positions;
  std::function<Status(const json&, const std::string&, ModelConfig&)> specifics;
};

Status llama_specifics(const json& j, const std::string& source, ModelConfig& c) {
  TESSERA_RETURN_IF_ERROR(require_false(j, source, "mlp_bias", "no MLP biases in Tessera's decoder"));
  return read_bool(j, source, "attention_bias", c.attention_bias);
}

Status qwen2_specifics(const json& j, const std::string& source, ModelConfig& c) {
  TESSERA_RETURN_IF_ERROR(require_false(j, source, "use_sliding_window", "sliding-window attention"));
  c.attention_bias = true;  // Qwen2Attention always has q/k/v biases.
  return Status();
}

const std::vector<ModelTypeTraits>& model_types() {
  static const std::vector<ModelTypeTraits> table = {
      {"llama", "LlamaForCausalLM", "LlamaForTokenClassification", 2048, llama_specifics},
      {"qwen2", "Qwen2ForCausalLM", "Qwen2ForTokenClassification", 32768, qwen2_specifics},
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
  TESSERA_RETURN_IF_ERROR(check_rope_scaling(j, source));
  TESSERA_RETURN_IF_ERROR(require_zero(j, source, "attention_dropout"));
  if (j.contains("id2label") && j.at("id2label").is_object() && j.at("id2label").size() != 1) {
    return field_error(source, "id2label", "must have exactly one label (num_labels=1 value head)");
  }
  return Status();
}

Status read_sizes(const json& j, const std::string& source, ModelConfig& c) {
  TESSERA_ASSIGN_OR_RETURN(c.vocab_size, get_int(j, source, "vocab_size"));
  TESSERA_ASSIGN_OR_RETURN(c.hidden_size, get_int(j, source, "hidden_size"));
  TESSERA_ASSIGN_OR_RETURN(c.intermediate_size, get_int(j, source, "intermediate_size"));
  TESSERA_ASSIGN_OR_RETURN(c.num_hidden_layers, get_int(j, source, "num_hidden_layers"));
  TESSERA_ASSIGN_OR_RETURN(c.num_attention_heads, get_int(j, source, "num_attention_heads"));
  c.num_key_value_heads = c.num_attention_heads;
  TESSERA_RETURN_IF_ERROR(read_int(j, source, "num_key_value_heads", c.num_key_value_heads));
  if (c.num_attention_heads > 0) c.head_dim = c.hidden_size / c.num_attention_heads;
  return read_int(j, source, "head_dim", c.head_dim);
}

Status read_scalars(const json& j, const std::string& source, ModelConfig& c) {
  TESSERA_RETURN_IF_ERROR(read_double(j, source, "rms_norm_eps", c.rms_norm_eps));
  TESSERA_RETURN_IF_ERROR(read_double(j, source, "rope_theta", c.rope_theta));
  TESSERA_RETURN_IF_ERROR(read_int(j, source, "max_position_embeddings", c.max_position_embeddings));
  TESSERA_RETURN_IF_ERROR(read_bool(j, source, "tie_word_embeddings", c.tie_word_embeddings));
  TESSERA_RETURN_IF_ERROR(read_double(j, source, "initializer_range", c.initializer_range));
  TESSERA_RETURN_IF_ERROR(read_optional_id(j, source, "bos_token_id", c.bos_token_id));
  TESSERA_RETURN_IF_ERROR(read_optional_id(j, source, "pad_token_id", c.pad_token_id));
  return read_eos(j, source, c);
}

Status read_strings(const json& j, const std::string& source, ModelConfig& c) {
  for (const char* key : {"torch_dtype", "dtype"}) {
    if (!j.contains(key) || j.at(key).is_null()) continue;
    if (!j.at(key).is_string()) return field_error(source, key, "must be a string");
    c.torch_dtype = j.at(key).get<std::string>();
    auto parsed = parse_torch_dtype(c.torch_dtype);
    if (!parsed.ok()) return field_error(source, key, "= '" + c.torch_dtype + "' is not supported");
  }
  if (j.contains("hidden_act")) {
    if (!j.at("hidden_act").is_string()) return field_error(source, "hidden_act", "must be a string");
    c.hidden_act = j.at("hidden_act").get<std::string>();
  }
  if (c.hidden_act != "silu") {
    return field_error(source, "hidden_act", "= '" + c.hidden_act + "' is not supported (only silu)");
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
  TESSERA_RETURN_IF_ERROR(read_architecture(j, source, *traits, c));
  TESSERA_RETURN_IF_ERROR(check_common_refusals(j, source));
  TESSERA_RETURN_IF_ERROR(traits->specifics(j, source, c));
  TESSERA_RETURN_IF_ERROR(read_sizes(j, source, c));
  TESSERA_RETURN_IF_ERROR(read_scalars(j, source, c));
  TESSERA_RETURN_IF_ERROR(read_strings(j, source, c));
  for (const auto& [key, value] : j.items()) {
    if (std::find(std::begin(kModelledFields), std::end(kModelledFields), key) == std::end(kModelledFields)) {
      c.extra[key] = value;
    }
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
  return Status();
}

Result<ModelConfig> load_model_config(const std::string& path) {
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
  if (c.head_dim != c.hidden_size / c.num_attention_heads) j["head_dim"] = c.head_dim;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.model_type == "llama") j["attention_bias"] = c.attention_bias;
  j["initializer_range"] = c.initializer_range;
  j["torch_dtype"] = c.torch_dtype;
  j["hidden_act"] = c.hidden_act;
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
