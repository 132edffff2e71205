// config.cpp: HF config.json <-> ModelConfig: parse, validate, load, save. The field readers are in
// config_fields.cpp, RoPE in config_rope.cpp and the per-model-type rows in model_families.cpp.
#include "workers/models/config.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "proto/atomic_file.hpp"
#include "workers/models/internal/config_fields.hpp"
#include "workers/models/internal/config_rope.hpp"
#include "workers/models/internal/model_families.hpp"

namespace tessera::models {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using internal::field_error;
using internal::find_model_type;
using internal::get_int;
using internal::ModelTypeTraits;
using internal::read_bool;
using internal::read_double;
using internal::read_eos;
using internal::read_int;
using internal::read_optional_id;
using internal::read_rope;
using internal::require_zero;
using internal::rope_scaling_json;
using internal::validate_family_fields;
using internal::validate_rope_scaling;
using internal::write_family_fields;

// Fields parse_model_config turns into ModelConfig members; everything else goes to `extra`.
const char* const kModelledFields[] = {
    "architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size",
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
    "rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings", "tie_word_embeddings",
    "attention_bias",
    "initializer_range", "bos_token_id", "eos_token_id", "pad_token_id", "torch_dtype", "dtype"};

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

int64_t ModelConfig::context_length() const {
  const RopeScaling& r = rope_scaling;
  const auto scaled = [&](int64_t n) { return static_cast<int64_t>(static_cast<double>(n) * r.factor); };
  if (r.rope_type == "linear" || r.rope_type == "dynamic") return std::max(max_position_embeddings, scaled(max_position_embeddings));
  if (r.rope_type == "yarn") return std::max(max_position_embeddings, scaled(rope_original_context()));
  return max_position_embeddings;
}

bool ModelConfig::layer_is_sparse(int64_t index) const {
  if (moe.num_experts <= 0) return false;
  const auto& dense = moe.mlp_only_layers;
  return std::find(dense.begin(), dense.end(), index) == dense.end() && (index + 1) % moe.decoder_sparse_step == 0;
}

bool ModelConfig::layer_slides(int64_t index) const {
  if (!sliding_window) return false;
  if (!layer_types.empty()) return layer_types.at(static_cast<size_t>(index)) == "sliding_attention";
  return model_type != "gemma2" || index % 2 == 0;  // Gemma2Config: (i + 1) % 2 slides (gemma3: layer_types)
}

Result<ModelConfig> load_model_config(const std::string& path, const json& override, const std::string& override_key) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return make_error(ErrorCode::not_found, "{}: no such directory", path);
  std::string file = fs::is_directory(path) ? (fs::path(path) / "config.json").string() : path;
  std::ifstream in(file);
  if (!in) return make_error(ErrorCode::not_found, "{}: cannot open", file);
  json j = json::parse(in, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return make_error(ErrorCode::corrupt_data, "{}: not valid JSON", file);
  if (override.is_null() || (override.is_object() && override.empty())) return parse_model_config(j, file);
  if (!override.is_object()) {
    return make_error(ErrorCode::invalid_argument, "{} = {}: expected a mapping of config.json fields", override_key,
                      override.dump());
  }
  // verl's update_model_config: setattr(config, key, value) for each key. It recurses only into
  // nested config objects, which these decoder configs do not have: a mapping such as rope_scaling
  // is replaced whole (merging a {type: yarn} into a file's {rope_type: llama3, ...} would read
  // as llama3).
  for (const auto& [key, value] : override.items()) j[key] = value;
  return parse_model_config(j, file + " with " + override_key);
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
  // Qwen3's head_dim defaults to 128 and the Gemmas' to 256, not hidden_size / num_attention_heads:
  // always written there.
  const bool own_head_dim = c.model_type == "qwen3" || c.gemma_norms();
  if (own_head_dim || c.head_dim != c.hidden_size / c.num_attention_heads) j["head_dim"] = c.head_dim;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = rope_scaling_json(c);
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  // Qwen2 and Mistral have no such key; Qwen2-MoE calls it qkv_bias (write_family_fields)
  if (c.model_type != "qwen2" && c.model_type != "mistral" && c.model_type != "qwen2_moe") {
    j["attention_bias"] = c.attention_bias;
  }
  j["initializer_range"] = c.initializer_range;
  j["torch_dtype"] = c.torch_dtype;
  j[c.gemma_norms() ? "hidden_activation" : "hidden_act"] = c.hidden_act;
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
  if (head == HeadKind::causal_lm) return std::string(t->causal_arch);
  if (*t->value_arch == '\0') {
    return make_error(ErrorCode::unimplemented,
                      "model_type '{}' has no value model in transformers (a critic or reward model of this family "
                      "is not supported)", model_type);
  }
  return std::string(t->value_arch);
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
