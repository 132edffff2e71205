// options.cpp: verl key parsing for fsdp_config and optim (see options.hpp). Each key is one row
// of a table: name -> small function that reads it into the struct.
#include "workers/fsdp/options.hpp"

#include <functional>
#include <map>

namespace tessera::fsdp {
namespace {

template <class T>
Result<T> read(const nlohmann::json& v, const std::string& key, const char* type_name) {
  try {
    return v.get<T>();
  } catch (const std::exception&) {
    return make_error(ErrorCode::invalid_argument, "{}: expected {}, got {}", key, type_name,
                      v.dump());
  }
}

template <class Target>
using KeyTable =
    std::map<std::string, std::function<Status(Target&, const nlohmann::json&, const std::string&)>>;

template <class Target>
Status apply_table(const KeyTable<Target>& table, Target& out, const nlohmann::json& json,
                   const std::string& path) {
  if (json.is_null()) return Status();
  if (!json.is_object()) {
    return make_error(ErrorCode::invalid_argument, "{}: expected a mapping, got {}", path,
                      json.dump());
  }
  for (const auto& [key, value] : json.items()) {
    std::string full = path + "." + key;
    auto it = table.find(key);
    if (it == table.end()) return make_error(ErrorCode::invalid_argument, "{}: unknown key", full);
    TESSERA_RETURN_IF_ERROR(it->second(out, value, full));
  }
  return Status();
}

// A null value keeps the default (verl's YAML writes null for "unset", e.g. min_lr_ratio).
#define TESSERA_FIELD(Target, key, type, expr)                                             \
  {key, [](Target& o, const nlohmann::json& v, const std::string& k) -> Status {          \
     if (v.is_null()) return Status();                                                    \
     TESSERA_ASSIGN_OR_RETURN(auto x, read<type>(v, k, #type));                           \
     expr;                                                                                \
     return Status();                                                                     \
   }}

Status read_dtype(c10::ScalarType& out, const nlohmann::json& v, const std::string& k) {
  if (v.is_null()) return Status();  // keeps the default, like TESSERA_FIELD
  TESSERA_ASSIGN_OR_RETURN(auto name, read<std::string>(v, k, "string"));
  TESSERA_ASSIGN_OR_RETURN(out, parse_dtype(name, k));
  return Status();
}

#define TESSERA_DTYPE_FIELD(Target, key, member)                                  \
  {key, [](Target& o, const nlohmann::json& v, const std::string& k) -> Status { \
     return read_dtype(o.member, v, k);                                          \
   }}

const KeyTable<MixedPrecision>& mixed_precision_keys() {
  static const KeyTable<MixedPrecision> t = {
      TESSERA_DTYPE_FIELD(MixedPrecision, "param_dtype", param_dtype),
      TESSERA_DTYPE_FIELD(MixedPrecision, "reduce_dtype", reduce_dtype),
      TESSERA_DTYPE_FIELD(MixedPrecision, "buffer_dtype", buffer_dtype),
  };
  return t;
}

const KeyTable<WrapPolicy>& wrap_policy_keys() {
  static const KeyTable<WrapPolicy> t = {
      TESSERA_FIELD(WrapPolicy, "transformer_layer_cls_to_wrap", std::vector<std::string>,
                    o.transformer_layer_cls_to_wrap = x),
      TESSERA_FIELD(WrapPolicy, "min_num_params", int64_t, o.min_num_params = x),
      TESSERA_FIELD(WrapPolicy, "disable", bool, o.disable = x),
  };
  return t;
}

const KeyTable<FsdpConfig>& fsdp_keys() {
  static const KeyTable<FsdpConfig> t = {
      TESSERA_FIELD(FsdpConfig, "fsdp_size", int, o.fsdp_size = x),
      TESSERA_FIELD(FsdpConfig, "param_offload", bool, o.param_offload = x),
      TESSERA_FIELD(FsdpConfig, "optimizer_offload", bool, o.optimizer_offload = x),
      TESSERA_FIELD(FsdpConfig, "reshard_after_forward", bool,
                    if (!o.strategy_explicit) o.strategy = x ? ShardingStrategy::full_shard
                                                             : ShardingStrategy::shard_grad_op),
      TESSERA_DTYPE_FIELD(FsdpConfig, "model_dtype", model_dtype),
      {"sharding_strategy",
       [](FsdpConfig& o, const nlohmann::json& v, const std::string& k) -> Status {
         if (v.is_null()) return Status();  // from reshard_after_forward and fsdp_size
         TESSERA_ASSIGN_OR_RETURN(auto name, read<std::string>(v, k, "string"));
         auto s = parse_sharding_strategy(name);
         if (!s.ok()) return s.status().with_context(k);
         o.strategy = *s;
         o.strategy_explicit = true;
         return Status();
       }},
      {"mixed_precision",
       [](FsdpConfig& o, const nlohmann::json& v, const std::string& k) {
         return apply_table(mixed_precision_keys(), o.mixed_precision, v, k);
       }},
      {"wrap_policy",
       [](FsdpConfig& o, const nlohmann::json& v, const std::string& k) {
         return apply_table(wrap_policy_keys(), o.wrap_policy, v, k);
       }},
      {"strategy",
       [](FsdpConfig&, const nlohmann::json& v, const std::string& k) -> Status {
         TESSERA_ASSIGN_OR_RETURN(auto name, read<std::string>(v, k, "string"));
         if (name == "fsdp" || name == "fsdp2") return Status();
         return make_error(ErrorCode::invalid_argument, "{}: '{}' is not fsdp or fsdp2", k, name);
       }},
      TESSERA_FIELD(FsdpConfig, "forward_prefetch", bool, o.forward_prefetch = x),
      TESSERA_FIELD(FsdpConfig, "use_orig_params", bool, (void)x),
      {"offload_policy",
       [](FsdpConfig&, const nlohmann::json& v, const std::string& k) -> Status {
         TESSERA_ASSIGN_OR_RETURN(bool on, read<bool>(v, k, "bool"));
         if (!on) return Status();
         return make_error(ErrorCode::unimplemented,
                           "{}: FSDP2-native offload is not implemented; use param_offload and "
                           "optimizer_offload",
                           k);
       }},
  };
  return t;
}

const KeyTable<OptimizerOptions>& optim_keys() {
  static const KeyTable<OptimizerOptions> t = {
      TESSERA_FIELD(OptimizerOptions, "lr", double, o.adamw.lr = x),
      TESSERA_FIELD(OptimizerOptions, "eps", double, o.adamw.eps = x),
      TESSERA_FIELD(OptimizerOptions, "weight_decay", double, o.adamw.weight_decay = x),
      {"betas",
       [](OptimizerOptions& o, const nlohmann::json& v, const std::string& k) -> Status {
         TESSERA_ASSIGN_OR_RETURN(auto b, read<std::vector<double>>(v, k, "a list of 2 numbers"));
         if (b.size() != 2) {
           return make_error(ErrorCode::invalid_argument, "{}: expected 2 values, got {}", k,
                             b.size());
         }
         o.adamw.beta1 = b[0];
         o.adamw.beta2 = b[1];
         return Status();
       }},
      TESSERA_FIELD(OptimizerOptions, "lr_warmup_steps", int64_t, o.schedule.warmup_steps = x),
      TESSERA_FIELD(OptimizerOptions, "lr_warmup_steps_ratio", double,
                    o.schedule.warmup_steps_ratio = x),
      TESSERA_FIELD(OptimizerOptions, "total_training_steps", int64_t,
                    o.schedule.total_training_steps = x),
      TESSERA_FIELD(OptimizerOptions, "min_lr_ratio", double, o.schedule.min_lr_ratio = x),
      TESSERA_FIELD(OptimizerOptions, "num_cycles", double, o.schedule.num_cycles = x),
      TESSERA_FIELD(OptimizerOptions, "clip_grad", double, o.clip_grad = x),
  };
  return t;
}

Status parse_schedule_kind(OptimizerOptions& o, const nlohmann::json& json, const std::string& path) {
  for (const char* key : {"warmup_style", "lr_scheduler_type"}) {
    if (!json.contains(key) || json[key].is_null()) continue;
    std::string k = path + "." + key;
    TESSERA_ASSIGN_OR_RETURN(auto name, read<std::string>(json[key], k, "string"));
    if (name == "constant") {
      o.schedule.kind = LrScheduleKind::constant;
    } else if (name == "cosine") {
      o.schedule.kind = LrScheduleKind::cosine;
    } else {
      return make_error(ErrorCode::invalid_argument, "{}: '{}' is not constant or cosine", k, name);
    }
  }
  return Status();
}

}  // namespace

const char* to_string(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::full_shard: return "FULL_SHARD";
    case ShardingStrategy::shard_grad_op: return "SHARD_GRAD_OP";
    case ShardingStrategy::no_shard: return "NO_SHARD";
    case ShardingStrategy::hybrid_shard: return "HYBRID_SHARD";
  }
  return "unknown";
}

Result<ShardingStrategy> parse_sharding_strategy(const std::string& name) {
  for (auto s : {ShardingStrategy::full_shard, ShardingStrategy::shard_grad_op,
                 ShardingStrategy::no_shard, ShardingStrategy::hybrid_shard}) {
    if (name == to_string(s)) return s;
  }
  return make_error(ErrorCode::invalid_argument,
                    "unknown sharding strategy '{}' (FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, "
                    "HYBRID_SHARD)",
                    name);
}

Result<c10::ScalarType> parse_dtype(const std::string& name, const std::string& key) {
  static const std::map<std::string, c10::ScalarType> names = {
      {"bf16", c10::ScalarType::BFloat16},  {"bfloat16", c10::ScalarType::BFloat16},
      {"fp16", c10::ScalarType::Half},      {"float16", c10::ScalarType::Half},
      {"half", c10::ScalarType::Half},      {"fp32", c10::ScalarType::Float},
      {"float32", c10::ScalarType::Float},  {"float", c10::ScalarType::Float},
      {"fp64", c10::ScalarType::Double},    {"float64", c10::ScalarType::Double},
  };
  std::string n = name.rfind("torch.", 0) == 0 ? name.substr(6) : name;
  auto it = names.find(n);
  if (it == names.end()) {
    return make_error(ErrorCode::invalid_argument, "{}: unknown dtype '{}' (bf16, fp16, fp32)", key,
                      name);
  }
  return it->second;
}

Result<FsdpConfig> parse_fsdp_config(const nlohmann::json& json, const std::string& path) {
  FsdpConfig config;
  // sharding_strategy wins over reshard_after_forward whatever the key order.
  if (json.is_object() && json.contains("sharding_strategy")) {
    TESSERA_RETURN_IF_ERROR(fsdp_keys().at("sharding_strategy")(
        config, json["sharding_strategy"], path + ".sharding_strategy"));
  }
  TESSERA_RETURN_IF_ERROR(apply_table(fsdp_keys(), config, json, path));
  if (config.fsdp_size == 0) {
    return make_error(ErrorCode::invalid_argument, "{}.fsdp_size: 0 is invalid (-1 = whole world)",
                      path);
  }
  return config;
}

ShardingStrategy resolve_strategy(const FsdpConfig& config, int world_size) {
  if (config.strategy_explicit) return config.strategy;
  if (config.fsdp_size > 0 && config.fsdp_size < world_size) return ShardingStrategy::hybrid_shard;
  return config.strategy;
}

Result<OptimizerOptions> parse_optim_config(const nlohmann::json& json, const std::string& path) {
  OptimizerOptions o;
  nlohmann::json rest = json;
  if (json.is_object()) {
    TESSERA_RETURN_IF_ERROR(parse_schedule_kind(o, json, path));
    rest.erase("warmup_style");
    rest.erase("lr_scheduler_type");
  }
  TESSERA_RETURN_IF_ERROR(apply_table(optim_keys(), o, rest, path));
  if (o.schedule.min_lr_ratio < 0 || o.schedule.min_lr_ratio > 1) {
    return make_error(ErrorCode::out_of_range, "{}.min_lr_ratio: {} is outside [0, 1]", path,
                      o.schedule.min_lr_ratio);
  }
  if (o.adamw.lr < 0 || o.adamw.eps <= 0 || o.adamw.beta1 < 0 || o.adamw.beta1 >= 1 ||
      o.adamw.beta2 < 0 || o.adamw.beta2 >= 1) {
    return make_error(ErrorCode::out_of_range,
                      "{}: lr {} eps {} betas ({}, {}) are outside their valid ranges", path,
                      o.adamw.lr, o.adamw.eps, o.adamw.beta1, o.adamw.beta2);
  }
  return o;
}

}  // namespace tessera::fsdp
