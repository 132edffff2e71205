// config_rope.cpp: RoPE read from config.json, validated and written back (internal/config_rope.hpp).
#include "workers/models/internal/config_rope.hpp"

#include <cmath>

#include <fmt/format.h>

#include "workers/models/internal/config_fields.hpp"

namespace tessera::models::internal {

using nlohmann::json;

namespace {

bool is_implemented_rope_type(const std::string& type) {
  return type == "default" || type == "linear" || type == "dynamic" || type == "llama3" || type == "yarn";
}

Status unsupported_rope_type(const std::string& source, const std::string& key, const std::string& type) {
  return field_error(source, key, "(type '" + type +
                                      "') is not supported; Tessera implements default, linear, dynamic, llama3 and yarn RoPE");
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

// yarn's optional numbers as _compute_yarn_parameters reads them: beta_fast / beta_slow default to
// 32 / 1 when absent, null or 0 (`or`), mscale / mscale_all_dim count only when non-zero, a null
// attention_factor is inferred, truncate defaults to true when absent (`get("truncate", True)`: a
// null truncate is None, which does not truncate).
Status read_yarn(const json& v, const std::string& source, const std::string& key, RopeScaling& r) {
  TESSERA_RETURN_IF_ERROR(rope_number(v, source, key, "yarn", "beta_fast", false, r.beta_fast));
  TESSERA_RETURN_IF_ERROR(rope_number(v, source, key, "yarn", "beta_slow", false, r.beta_slow));
  if (r.beta_fast == 0.0) r.beta_fast = 32.0;
  if (r.beta_slow == 0.0) r.beta_slow = 1.0;
  TESSERA_RETURN_IF_ERROR(rope_number(v, source, key, "yarn", "mscale", false, r.mscale));
  TESSERA_RETURN_IF_ERROR(rope_number(v, source, key, "yarn", "mscale_all_dim", false, r.mscale_all_dim));
  double attention_factor = 0.0;
  if (v.contains("attention_factor") && !v.at("attention_factor").is_null()) {
    TESSERA_RETURN_IF_ERROR(rope_number(v, source, key, "yarn", "attention_factor", true, attention_factor));
    r.attention_factor = attention_factor;
  }
  if (v.contains("truncate")) {
    const json& t = v.at("truncate");
    if (!t.is_null() && !t.is_boolean()) return field_error(source, key, "'truncate' must be true or false, got " + t.dump());
    r.truncate = t.is_boolean() && t.get<bool>();
  }
  return Status();
}

// Gemma3's per-layer-type rope_parameters: the sliding layers' entry, default RoPE with its
// rope_theta (rope_local_theta); other keys than these two types are refused.
Status read_local_rope(const json& v, const std::string& source, const std::string& key, ModelConfig& c) {
  for (const auto& [name, value] : v.items()) {
    if (name != "full_attention" && name != "sliding_attention") {
      return field_error(source, key, "holds '" + name + "'; gemma3_text's RoPE is per layer type (full_attention, "
                                      "sliding_attention)");
    }
  }
  if (!v.contains("sliding_attention") || v.at("sliding_attention").is_null()) return Status();
  const json& local = v.at("sliding_attention");
  const std::string local_key = key + ".sliding_attention";
  if (!local.is_object()) return field_error(source, local_key, "must be an object, got " + local.dump());
  for (const char* name : {"rope_type", "type"}) {
    if (local.contains(name) && !local.at(name).is_null() && local.at(name) != "default") {
      return field_error(source, local_key, "has " + std::string(name) + " " + local.at(name).dump() +
                                                "; the sliding layers' RoPE is the default type only");
    }
  }
  double theta = *c.rope_local_theta;
  TESSERA_RETURN_IF_ERROR(rope_number(local, source, local_key, "default", "rope_theta", /*required=*/false, theta));
  if (!(theta > 0.0)) return field_error(source, local_key, "rope_theta must be positive");
  c.rope_local_theta = theta;
  return Status();
}

}  // namespace

// RoPE, as transformers 5 reads it (see config.hpp): the dict is rope_scaling when non-empty, else
// rope_parameters; its rope_theta wins over the top-level one. Unimplemented types are refused
// naming the key and the type. Needs max_position_embeddings (llama3's default original length).
Status read_rope(const json& j, const std::string& source, ModelConfig& c) {
  // Gemma3TextConfig: rope_theta (1e6) for the full layers, rope_local_base_freq (1e4) for the sliding ones.
  if (c.model_type == "gemma3_text") {
    c.rope_theta = 1e6;
    double local = 10000.0;
    TESSERA_RETURN_IF_ERROR(read_double(j, source, "rope_local_base_freq", local));
    c.rope_local_theta = local;
  }
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
  const json* dict = &j.at(key);
  const auto per_layer_type = [](const json& d) { return d.contains("full_attention") || d.contains("sliding_attention"); };
  if (c.rope_local_theta && key == "rope_scaling" && j.contains("rope_parameters") && j.at("rope_parameters").is_object() &&
      per_layer_type(j.at("rope_parameters"))) {
    return field_error(source, "rope_scaling", "and per-layer-type rope_parameters are both set; keep one");
  }
  if (c.rope_local_theta && per_layer_type(*dict)) {
    TESSERA_RETURN_IF_ERROR(read_local_rope(*dict, source, key, c));
    if (!dict->contains("full_attention") || dict->at("full_attention").is_null()) return Status();
    key += ".full_attention";
    dict = &dict->at("full_attention");
    if (!dict->is_object()) return field_error(source, key, "must be an object, got " + dict->dump());
  }
  const json& v = *dict;
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
  // yarn: a null factor is max_position_embeddings / original_max_position_embeddings (below).
  const bool factor_from_lengths = type == "yarn" && v.contains("factor") && v.at("factor").is_null();
  if (!factor_from_lengths) {
    TESSERA_RETURN_IF_ERROR(rope_number(v, source, key, type, "factor", /*required=*/true, r.factor));
  }
  if (type != "llama3" && type != "yarn") return Status();
  if (type == "llama3") {
    TESSERA_RETURN_IF_ERROR(rope_number(v, source, key, type, "low_freq_factor", true, r.low_freq_factor));
    TESSERA_RETURN_IF_ERROR(rope_number(v, source, key, type, "high_freq_factor", true, r.high_freq_factor));
  } else {
    TESSERA_RETURN_IF_ERROR(read_yarn(v, source, key, r));
  }
  // HF: a top-level original_max_position_embeddings wins, then the dict's, then max_position_embeddings.
  r.original_max_position_embeddings = c.max_position_embeddings;
  for (const json* holder : {&v, &j}) {
    if (!holder->contains("original_max_position_embeddings")) continue;
    const json& o = holder->at("original_max_position_embeddings");
    if (o.is_null()) continue;
    // An integer, or a float with an integral value (64.0), as Python's arithmetic takes both.
    const bool integral = o.is_number_integer() || (o.is_number_float() && o.get<double>() == std::floor(o.get<double>()));
    if (!integral || o.get<double>() <= 0) {
      return field_error(source, holder == &j ? std::string("original_max_position_embeddings") : key,
                         "original_max_position_embeddings must be a positive integer, got " + o.dump());
    }
    r.original_max_position_embeddings = static_cast<int64_t>(o.get<double>());
  }
  if (factor_from_lengths && r.original_max_position_embeddings > 0) {
    r.factor = static_cast<double>(c.max_position_embeddings) / static_cast<double>(r.original_max_position_embeddings);
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
  if (r.rope_type == "yarn") {
    if (r.original_max_position_embeddings <= 0 && c.max_position_embeddings <= 0) {
      return field_error(source, "rope_scaling",
                         "(type 'yarn') needs original_max_position_embeddings or max_position_embeddings > 0");
    }
    if (r.attention_factor && !(*r.attention_factor > 0.0)) {
      return field_error(source, "rope_scaling", fmt::format("attention_factor = {} must be positive", *r.attention_factor));
    }
    if (!(r.beta_fast > 0.0) || !(r.beta_slow > 0.0)) {
      return field_error(source, "rope_scaling",
                         fmt::format("(type 'yarn') needs positive beta_fast and beta_slow, got {} and {}",
                                     r.beta_fast, r.beta_slow));
    }
    return Status();
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
  }
  if (r.rope_type == "llama3" || r.rope_type == "yarn") {
    s["original_max_position_embeddings"] = c.rope_original_context();
  }
  if (r.rope_type == "yarn") {
    s["beta_fast"] = r.beta_fast;
    s["beta_slow"] = r.beta_slow;
    if (r.mscale != 0.0) s["mscale"] = r.mscale;
    if (r.mscale_all_dim != 0.0) s["mscale_all_dim"] = r.mscale_all_dim;
    if (r.attention_factor) s["attention_factor"] = *r.attention_factor;
    s["truncate"] = r.truncate;
  }
  return s;
}

}  // namespace tessera::models::internal
