// config.cpp: the key tables of actor_rollout_ref.rollout. Each key has one rule: a setter that
// stores (or checks) its value, or no setter when the key is vLLM/SGLang-only and merely reported.
#include "workers/rollout/config.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <mutex>
#include <set>

#include <type_traits>

namespace tessera::rollout {
namespace {

using nlohmann::json;

constexpr const char* kPrefix = "actor_rollout_ref.rollout.";

/// What a setter may touch besides its target: the list of reported keys.
struct ParseState {
  std::vector<std::string> ignored;
};

template <class Target>
using Setter = Status (*)(const json& value, const std::string& key, Target& target, ParseState& state);

/// One accepted key: a setter, or nullptr for "accepted, no effect, reported".
template <class Target>
struct KeyRule {
  const char* key;
  Setter<Target> set;
};

Status type_error(const std::string& key, const char* expected, const json& v) {
  return make_error(ErrorCode::invalid_argument, "{}: expected {}, got {} ({})", key, expected, v.type_name(),
                    v.dump().substr(0, 60));
}

// ---- typed readers (null never reaches them: it means "keep the default") ----------------------

Status read(const json& v, const std::string& key, bool& out) {
  if (!v.is_boolean()) return type_error(key, "a boolean", v);
  out = v.get<bool>();
  return Status();
}

Status read(const json& v, const std::string& key, int64_t& out) {
  if (!v.is_number_integer()) return type_error(key, "an integer", v);
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    return make_error(ErrorCode::out_of_range, "{}: {} does not fit in int64", key, v.dump());
  }
  out = v.get<int64_t>();
  return Status();
}

Status read(const json& v, const std::string& key, uint64_t& out) {
  if (!v.is_number_integer() || (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0)) {
    return type_error(key, "a non-negative integer", v);
  }
  out = v.get<uint64_t>();
  return Status();
}

Status read(const json& v, const std::string& key, double& out) {
  if (!v.is_number()) return type_error(key, "a number", v);
  out = v.get<double>();
  return Status();
}

Status read(const json& v, const std::string& key, std::string& out) {
  if (!v.is_string()) return type_error(key, "a string", v);
  out = v.get<std::string>();
  return Status();
}

Status read(const json& v, const std::string& key, std::vector<int64_t>& out) {
  if (!v.is_array()) return type_error(key, "a list of integers", v);
  out.clear();
  for (size_t i = 0; i < v.size(); ++i) {
    int64_t x = 0;
    TESSERA_RETURN_IF_ERROR(read(v[i], fmt::format("{}[{}]", key, i), x));
    out.push_back(x);
  }
  return Status();
}

template <class T>
Status read(const json& v, const std::string& key, std::optional<T>& out) {
  T value{};
  TESSERA_RETURN_IF_ERROR(read(v, key, value));
  out = value;
  return Status();
}

/// Stores the value in `target.*Member`.
template <auto Member, class Target>
Status set_field(const json& v, const std::string& key, Target& target, ParseState&) {
  return read(v, key, target.*Member);
}

/// Walks `object` with `rules`; unknown keys are errors, setter-less keys are reported.
template <class Target, size_t N>
Status apply_rules(const json& object, const std::string& prefix, const KeyRule<Target> (&rules)[N],
                   Target& target, ParseState& state) {
  if (!object.is_object()) {
    std::string where = prefix.empty() ? std::string(kPrefix) : prefix;
    return type_error(where.substr(0, where.size() - 1), "an object", object);
  }
  for (const auto& [name, value] : object.items()) {
    const std::string key = prefix + name;
    const KeyRule<Target>* rule = nullptr;
    for (const auto& r : rules) {
      if (name == r.key) rule = &r;
    }
    if (rule == nullptr) return make_error(ErrorCode::invalid_argument, "unknown rollout config key '{}'", key);
    if (rule->set == nullptr) {
      state.ignored.push_back(key);
    } else if (!value.is_null()) {
      TESSERA_RETURN_IF_ERROR(rule->set(value, key, target, state));
    }
  }
  return Status();
}

// ---- keys whose default is harmless but whose other values ask for a missing feature ----------

/// Accepts `allowed` (reported as ignored: it changes nothing); anything else is unimplemented.
template <class T>
Status accept_only(const json& v, const std::string& key, const T& allowed, const char* feature, ParseState& state) {
  T value{};
  TESSERA_RETURN_IF_ERROR(read(v, key, value));
  if (value != allowed) {
    return make_error(ErrorCode::unimplemented, "{}={}: {} is not implemented by Tessera's rollout engine", key,
                      v.dump(), feature);
  }
  state.ignored.push_back(key);
  return Status();
}

// sync: verl's SPMD engine (with multi_turn: the SGLang multi-turn loop); async: its agent loops
// (single_turn_agent, tool_agent), run on the same in-process engine (multi_turn.hpp).
Status set_mode(const json& v, const std::string& key, RolloutConfig& c, ParseState&) {
  TESSERA_RETURN_IF_ERROR(read(v, key, c.mode));
  if (c.mode == "sync" || c.mode == "async") return Status();
  return make_error(ErrorCode::invalid_argument, "{}='{}': expected sync or async", key, c.mode);
}

template <class Target>
Status must_be_one(const json& v, const std::string& key, Target&, ParseState& s) {
  return accept_only<int64_t>(v, key, 1, "this parallelism", s);
}
template <class Target>
Status must_be_false(const json& v, const std::string& key, Target&, ParseState& s) {
  return accept_only<bool>(v, key, false, "this feature", s);
}
template <class Target>
Status must_be_zero(const json& v, const std::string& key, Target&, ParseState& s) {
  double value = 0;
  TESSERA_RETURN_IF_ERROR(read(v, key, value));
  if (value != 0.0) {
    return make_error(ErrorCode::unimplemented, "{}={}: early termination of rollouts is not implemented", key, v.dump());
  }
  s.ignored.push_back(key);
  return Status();
}
template <class Target>
Status must_be_absent(const json& v, const std::string& key, Target&, ParseState&) {
  return make_error(ErrorCode::unimplemented, "{}={}: multi-modal rollout is not implemented", key, v.dump().substr(0, 60));
}

// ---- nested sections ---------------------------------------------------------------------------

const KeyRule<SamplingConfig> kSamplingRules[] = {
    {"_target_", nullptr},
    {"temperature", set_field<&SamplingConfig::temperature, SamplingConfig>},
    {"top_k", set_field<&SamplingConfig::top_k, SamplingConfig>},
    {"top_p", set_field<&SamplingConfig::top_p, SamplingConfig>},
    {"n", set_field<&SamplingConfig::n, SamplingConfig>},
    {"do_sample", set_field<&SamplingConfig::do_sample, SamplingConfig>},
};

Status set_batching(const json& v, const std::string& key, RolloutConfig& c, ParseState&) {
  std::string mode;
  TESSERA_RETURN_IF_ERROR(read(v, key, mode));
  if (mode == "continuous") {
    c.batching = BatchingMode::continuous;
  } else if (mode == "static") {
    c.batching = BatchingMode::static_waves;
  } else {
    return make_error(ErrorCode::invalid_argument, "{}='{}': expected 'continuous' or 'static'", key, mode);
  }
  return Status();
}

Status set_placement(const json& v, const std::string& key, RolloutConfig& c, ParseState&) {
  TESSERA_RETURN_IF_ERROR(read(v, key, c.placement));
  if (c.placement != "colocated" && c.placement != "split") {
    return make_error(ErrorCode::invalid_argument, "{}='{}': expected 'colocated' or 'split'", key, c.placement);
  }
  return Status();
}

const KeyRule<RolloutConfig> kTesseraEngineRules[] = {
    {"batching", set_batching},
    {"placement", set_placement},
    {"split_devices_per_node", set_field<&RolloutConfig::split_devices_per_node, RolloutConfig>},
    {"kv_block_size", set_field<&RolloutConfig::kv_block_size, RolloutConfig>},
    {"decode_attention", set_field<&RolloutConfig::decode_attention, RolloutConfig>},
    {"split_decode_attention", set_field<&RolloutConfig::split_decode_attention, RolloutConfig>},
    {"max_kv_blocks", set_field<&RolloutConfig::max_kv_blocks, RolloutConfig>},
    {"sampler", set_field<&RolloutConfig::sampler, RolloutConfig>},
    {"fused_layers", set_field<&RolloutConfig::fused_layers, RolloutConfig>},
    {"tool_timeout_s", [](const json& v, const std::string& key, RolloutConfig& c, ParseState&) {
       return read(v, key, c.multi_turn.tool_timeout_s);
     }},
};

Status set_engine_kwargs(const json& v, const std::string& key, RolloutConfig& c, ParseState& s) {
  static const KeyRule<RolloutConfig> rules[] = {
      {"vllm", nullptr},
      {"sglang", nullptr},
      {"tessera", [](const json& t, const std::string& k, RolloutConfig& cfg, ParseState& st) {
         return apply_rules(t, k + ".", kTesseraEngineRules, cfg, st);
       }},
  };
  return apply_rules(v, key + ".", rules, c, s);
}

Status set_val_kwargs(const json& v, const std::string& key, RolloutConfig& c, ParseState& s) {
  return apply_rules(v, key + ".", kSamplingRules, c.val_kwargs, s);
}

Status set_truncate_side(const json& v, const std::string& key, MultiTurnConfig& c, ParseState&) {
  TESSERA_RETURN_IF_ERROR(read(v, key, c.tool_response_truncate_side));
  const std::string& side = c.tool_response_truncate_side;
  if (side != "left" && side != "right" && side != "middle") {
    return make_error(ErrorCode::invalid_argument, "{}='{}': expected left, right or middle", key, side);
  }
  return Status();
}

Status set_tool_format(const json& v, const std::string& key, MultiTurnConfig& c, ParseState&) {
  TESSERA_RETURN_IF_ERROR(read(v, key, c.format));
  // SGLang's qwen25 parser reads the same <tool_call>{"name", "arguments"}</tool_call> blocks.
  if (c.format == "qwen25") c.format = "hermes";
  if (c.format != "hermes") {
    return make_error(ErrorCode::unimplemented, "{}='{}': the tool-call formats implemented are hermes and qwen25 "
                      "(the same <tool_call> blocks)", key, c.format);
  }
  return Status();
}

Status no_completion_callback(const json& v, const std::string& key, MultiTurnConfig&, ParseState&) {
  return make_error(ErrorCode::unimplemented, "{}={}: completion callbacks drive verl's chat-completion scheduler "
                    "over OpenAI-compatible servers, which Tessera does not run; write the loop as an agent loop "
                    "(actor_rollout_ref.rollout.agent.agent_loop_config_path)", key, v.dump().substr(0, 60));
}

// verl's multi_turn section. use_inference_chat_template and tokenization_sanity_check_mode
// decide how verl's SGLang rollout re-tokenizes the assistant's text; Tessera keeps the tokens
// as sampled (Note [Multi-turn rollout]), so they have no effect and are reported.
const KeyRule<MultiTurnConfig> kMultiTurnRules[] = {
    {"_target_", nullptr},
    {"enable", set_field<&MultiTurnConfig::enable, MultiTurnConfig>},
    {"max_assistant_turns", set_field<&MultiTurnConfig::max_assistant_turns, MultiTurnConfig>},
    {"max_user_turns", set_field<&MultiTurnConfig::max_user_turns, MultiTurnConfig>},
    {"tool_config_path", set_field<&MultiTurnConfig::tool_config_path, MultiTurnConfig>},
    {"max_parallel_calls", set_field<&MultiTurnConfig::max_parallel_calls, MultiTurnConfig>},
    {"max_tool_response_length", set_field<&MultiTurnConfig::max_tool_response_length, MultiTurnConfig>},
    {"tool_response_truncate_side", set_truncate_side},
    {"format", set_tool_format},
    {"interaction_config_path", set_field<&MultiTurnConfig::interaction_config_path, MultiTurnConfig>},
    {"completion_callback", no_completion_callback},
    {"use_inference_chat_template", nullptr},
    {"tokenization_sanity_check_mode", nullptr},
};

Status set_multi_turn(const json& v, const std::string& key, RolloutConfig& c, ParseState& s) {
  return apply_rules(v, key + ".", kMultiTurnRules, c.multi_turn, s);
}

Status no_custom_server(const json& v, const std::string& key, RolloutConfig&, ParseState&) {
  if (v.is_null()) return Status();
  return make_error(ErrorCode::unimplemented, "{}={}: custom async servers are not supported: the agent loops call "
                    "Tessera's in-process engine (custom agent loops: agent.agent_loop_config_path)", key,
                    v.dump().substr(0, 60));
}

Status set_agent(const json& v, const std::string& key, RolloutConfig& c, ParseState& s) {
  static const KeyRule<RolloutConfig> rules[] = {
      {"_target_", nullptr},
      {"num_workers", nullptr},  // agent-loop worker processes: the engine is in-process
      {"agent_loop_config_path", [](const json& path, const std::string& k, RolloutConfig& cfg, ParseState& st) {
         Status read = set_field<&RolloutConfig::agent_loop_config_path, RolloutConfig>(path, k, cfg, st);
         if (!read.ok()) return read;
         if (cfg.agent_loop_config_path->empty()) cfg.agent_loop_config_path.reset();  // verl: a falsy path is none
         return Status();
       }},
      {"custom_async_server", [](const json& server, const std::string& k, RolloutConfig& cfg, ParseState& st) {
         static const KeyRule<RolloutConfig> server_rules[] = {{"path", no_custom_server}, {"name", no_custom_server}};
         return apply_rules(server, k + ".", server_rules, cfg, st);
       }},
  };
  return apply_rules(v, key + ".", rules, c, s);
}

Status set_name(const json& v, const std::string& key, RolloutConfig& c, ParseState& s) {
  TESSERA_RETURN_IF_ERROR(read(v, key, c.name));
  if (c.name != "tessera") s.ignored.push_back(key);  // vllm/sglang/hf all run Tessera's engine
  return Status();
}

// verl v0.5.0 keys plus those added up to main (reference/verl-fsdp.md §6.1).
const KeyRule<RolloutConfig> kRolloutRules[] = {
    {"name", set_name},
    {"mode", set_mode},
    {"temperature", set_field<&RolloutConfig::temperature, RolloutConfig>},
    {"top_k", set_field<&RolloutConfig::top_k, RolloutConfig>},
    {"top_p", set_field<&RolloutConfig::top_p, RolloutConfig>},
    {"n", set_field<&RolloutConfig::n, RolloutConfig>},
    {"prompt_length", set_field<&RolloutConfig::prompt_length, RolloutConfig>},
    {"response_length", set_field<&RolloutConfig::response_length, RolloutConfig>},
    {"do_sample", set_field<&RolloutConfig::do_sample, RolloutConfig>},
    {"ignore_eos", set_field<&RolloutConfig::ignore_eos, RolloutConfig>},
    {"calculate_log_probs", set_field<&RolloutConfig::calculate_log_probs, RolloutConfig>},
    {"val_kwargs", set_val_kwargs},
    {"dtype", set_field<&RolloutConfig::dtype, RolloutConfig>},
    {"tensor_model_parallel_size", set_field<&RolloutConfig::tensor_model_parallel_size, RolloutConfig>},
    {"free_cache_engine", set_field<&RolloutConfig::free_cache_engine, RolloutConfig>},
    {"max_num_seqs", set_field<&RolloutConfig::max_num_seqs, RolloutConfig>},
    {"max_num_batched_tokens", set_field<&RolloutConfig::max_num_batched_tokens, RolloutConfig>},
    {"max_model_len", set_field<&RolloutConfig::max_model_len, RolloutConfig>},
    {"seed", set_field<&RolloutConfig::seed, RolloutConfig>},
    {"log_prob_micro_batch_size", set_field<&RolloutConfig::log_prob_micro_batch_size, RolloutConfig>},
    {"log_prob_micro_batch_size_per_gpu", set_field<&RolloutConfig::log_prob_micro_batch_size_per_gpu, RolloutConfig>},
    {"log_prob_use_dynamic_bsz", set_field<&RolloutConfig::log_prob_use_dynamic_bsz, RolloutConfig>},
    {"log_prob_max_token_len_per_gpu", set_field<&RolloutConfig::log_prob_max_token_len_per_gpu, RolloutConfig>},
    {"layered_summon", set_field<&RolloutConfig::layered_summon, RolloutConfig>},
    {"enable_prefix_caching", set_field<&RolloutConfig::enable_prefix_caching, RolloutConfig>},
    {"enforce_eager", set_field<&RolloutConfig::enforce_eager, RolloutConfig>},
    {"gpu_memory_utilization", set_field<&RolloutConfig::gpu_memory_utilization, RolloutConfig>},
    {"enable_chunked_prefill", set_field<&RolloutConfig::enable_chunked_prefill, RolloutConfig>},
    {"cudagraph_capture_sizes", set_field<&RolloutConfig::cudagraph_capture_sizes, RolloutConfig>},
    {"update_weights_bucket_megabytes", set_field<&RolloutConfig::update_weights_bucket_megabytes, RolloutConfig>},
    {"engine_kwargs", set_engine_kwargs},
    {"multi_turn", set_multi_turn},
    // Features Tessera does not implement: their defaults are accepted (and reported).
    {"data_parallel_size", must_be_one<RolloutConfig>},
    {"expert_parallel_size", must_be_one<RolloutConfig>},
    {"pipeline_model_parallel_size", must_be_one<RolloutConfig>},
    {"use_fire_sampling", must_be_false<RolloutConfig>},
    {"skip_rollout", must_be_false<RolloutConfig>},
    {"over_sample_rate", must_be_zero<RolloutConfig>},
    {"limit_images", must_be_absent<RolloutConfig>},
    // vLLM/SGLang engine or server settings: no effect on Tessera's engine.
    {"_target_", nullptr},
    {"load_format", nullptr},
    {"disable_log_stats", nullptr},
    {"multi_stage_wake_up", nullptr},
    {"logprobs_mode", nullptr},
    {"agent", set_agent},
    {"trace", nullptr},
    {"profiler", nullptr},
    {"checkpoint_engine", nullptr},
    {"skip_dump_dir", nullptr},
};

bool known_name(const std::string& name) {
  return name == "vllm" || name == "sglang" || name == "hf" || name == "naive" || name == "tessera";
}

}  // namespace

const char* to_string(BatchingMode mode) {
  return mode == BatchingMode::continuous ? "continuous" : "static";
}

Result<std::optional<c10::ScalarType>> rollout_dtype(const RolloutConfig& config) {
  const std::string& d = config.dtype;
  if (d == "auto") return std::optional<c10::ScalarType>();
  if (d == "bfloat16" || d == "bf16") return std::optional<c10::ScalarType>(c10::ScalarType::BFloat16);
  if (d == "float16" || d == "half" || d == "fp16") return std::optional<c10::ScalarType>(c10::ScalarType::Half);
  if (d == "float32" || d == "float" || d == "fp32") return std::optional<c10::ScalarType>(c10::ScalarType::Float);
  return make_error(ErrorCode::invalid_argument, "{}dtype: unknown dtype '{}' (bfloat16|float16|float32|auto)",
                    kPrefix, d);
}

Status validate_rollout_config(const RolloutConfig& c) {
  auto positive = [](int64_t v, const char* key) -> Status {
    if (v >= 1) return Status();
    return make_error(ErrorCode::invalid_argument, "{}{}={} must be >= 1", kPrefix, key, v);
  };
  auto sampling = [](const SamplingConfig& s, const std::string& where) -> Status {
    if (!(s.temperature >= 0.0)) {
      return make_error(ErrorCode::invalid_argument, "{}{}temperature={} must be >= 0", kPrefix, where, s.temperature);
    }
    if (!(s.top_p > 0.0 && s.top_p <= 1.0)) {
      return make_error(ErrorCode::invalid_argument, "{}{}top_p={} must be in (0, 1]", kPrefix, where, s.top_p);
    }
    if (s.top_k < -1) return make_error(ErrorCode::invalid_argument, "{}{}top_k={} must be >= -1", kPrefix, where, s.top_k);
    if (s.n < 1) return make_error(ErrorCode::invalid_argument, "{}{}n={} must be >= 1", kPrefix, where, s.n);
    return Status();
  };
  if (!known_name(c.name)) {
    return make_error(ErrorCode::invalid_argument, "{}name='{}': expected vllm|sglang|hf|naive|tessera", kPrefix, c.name);
  }
  TESSERA_RETURN_IF_ERROR(positive(c.prompt_length, "prompt_length"));
  TESSERA_RETURN_IF_ERROR(positive(c.response_length, "response_length"));
  TESSERA_RETURN_IF_ERROR(positive(c.max_num_seqs, "max_num_seqs"));
  TESSERA_RETURN_IF_ERROR(positive(c.max_num_batched_tokens, "max_num_batched_tokens"));
  TESSERA_RETURN_IF_ERROR(positive(c.tensor_model_parallel_size, "tensor_model_parallel_size"));
  TESSERA_RETURN_IF_ERROR(positive(c.update_weights_bucket_megabytes, "update_weights_bucket_megabytes"));
  TESSERA_RETURN_IF_ERROR(positive(c.kv_block_size, "engine_kwargs.tessera.kv_block_size"));
  if (!(c.gpu_memory_utilization > 0.0 && c.gpu_memory_utilization <= 1.0)) {
    return make_error(ErrorCode::invalid_argument, "{}gpu_memory_utilization={} must be in (0, 1]", kPrefix,
                      c.gpu_memory_utilization);
  }
  if (c.max_kv_blocks < 0) {
    return make_error(ErrorCode::invalid_argument, "{}engine_kwargs.tessera.max_kv_blocks={} must be >= 0", kPrefix,
                      c.max_kv_blocks);
  }
  if (c.decode_attention != "kernel" && c.decode_attention != "heads" && c.decode_attention != "tiled" &&
      c.decode_attention != "gather") {
    return make_error(ErrorCode::invalid_argument,
                      "{}engine_kwargs.tessera.decode_attention='{}': expected kernel|heads|tiled|gather", kPrefix,
                      c.decode_attention);
  }
  if (c.sampler != "fused" && c.sampler != "torch") {
    return make_error(ErrorCode::invalid_argument, "{}engine_kwargs.tessera.sampler='{}': expected fused|torch", kPrefix,
                      c.sampler);
  }
  if (c.cudagraph_capture_sizes) {
    for (size_t i = 0; i < c.cudagraph_capture_sizes->size(); ++i) {
      TESSERA_RETURN_IF_ERROR(positive((*c.cudagraph_capture_sizes)[i], fmt::format("cudagraph_capture_sizes[{}]", i).c_str()));
    }
  }
  if (c.split_devices_per_node < 0) {
    return make_error(ErrorCode::invalid_argument, "{}engine_kwargs.tessera.split_devices_per_node={} must be >= 0",
                      kPrefix, c.split_devices_per_node);
  }
  if (c.placement == "split" && c.tensor_model_parallel_size > 1) {
    return make_error(ErrorCode::unimplemented,
                      "{}engine_kwargs.tessera.placement=split with tensor_model_parallel_size={}: split placement "
                      "runs TP=1 rollout ranks; use tensor_model_parallel_size=1 or placement=colocated",
                      kPrefix, c.tensor_model_parallel_size);
  }
  const MultiTurnConfig& mt = c.multi_turn;
  for (const auto& [turns, key] : {std::pair{mt.max_assistant_turns, "multi_turn.max_assistant_turns"},
                                   std::pair{mt.max_user_turns, "multi_turn.max_user_turns"}}) {
    if (turns) TESSERA_RETURN_IF_ERROR(positive(*turns, key));
  }
  TESSERA_RETURN_IF_ERROR(positive(mt.max_parallel_calls, "multi_turn.max_parallel_calls"));
  TESSERA_RETURN_IF_ERROR(positive(mt.max_tool_response_length, "multi_turn.max_tool_response_length"));
  if (!(mt.tool_timeout_s > 0 && mt.tool_timeout_s <= 1e7)) {
    return make_error(ErrorCode::invalid_argument, "{}engine_kwargs.tessera.tool_timeout_s={} must be in (0, 1e7] "
                      "seconds", kPrefix, mt.tool_timeout_s);
  }
  if (mt.enable && !mt.tool_config_path && !mt.interaction_config_path) {
    return make_error(ErrorCode::invalid_argument, "{}multi_turn.enable=true needs multi_turn.tool_config_path (the "
                      "tools the model may call) or multi_turn.interaction_config_path (simulated users)", kPrefix);
  }
  if (c.mode == "async" && mt.interaction_config_path) {
    return make_error(ErrorCode::unimplemented, "{}multi_turn.interaction_config_path with mode=async: verl's agent "
                      "loops have no interactions; they run in the SGLang multi-turn loop (mode=sync)", kPrefix);
  }
  if (c.agent_loop_config_path && c.mode != "async") {
    return make_error(ErrorCode::invalid_argument, "{}agent.agent_loop_config_path needs {}mode=async (verl's agent "
                      "loops); with mode={} it would have no effect", kPrefix, kPrefix, c.mode);
  }
  if (c.agent_loop_config_path && c.calculate_log_probs) {
    return make_error(ErrorCode::unimplemented, "{}calculate_log_probs=true with agent.agent_loop_config_path: the "
                      "agent loops assemble their responses themselves and return no log-probs", kPrefix);
  }
  TESSERA_RETURN_IF_ERROR(sampling({c.temperature, c.top_k, c.top_p, c.n, c.do_sample}, ""));
  TESSERA_RETURN_IF_ERROR(sampling(c.val_kwargs, "val_kwargs."));
  if (c.max_model_len && *c.max_model_len < c.prompt_length + c.response_length) {
    return make_error(ErrorCode::invalid_argument, "{}max_model_len={} is shorter than prompt_length + response_length = {}",
                      kPrefix, *c.max_model_len, c.prompt_length + c.response_length);
  }
  auto dtype = rollout_dtype(c);
  return dtype.ok() ? Status() : dtype.status();
}

Result<ParsedRolloutConfig> parse_rollout_config(const nlohmann::json& rollout) {
  ParsedRolloutConfig out;
  ParseState state;
  TESSERA_RETURN_IF_ERROR(apply_rules(rollout, kPrefix, kRolloutRules, out.config, state));
  TESSERA_RETURN_IF_ERROR(validate_rollout_config(out.config));
  out.ignored_keys = std::move(state.ignored);
  if (out.config.agent_loop_config_path) {  // verl's agent loops set up rollout.trace themselves (agent_host.hpp)
    const std::string trace = std::string(kPrefix) + "trace";
    out.ignored_keys.erase(std::remove(out.ignored_keys.begin(), out.ignored_keys.end(), trace), out.ignored_keys.end());
  }
  // Every rank of a process parses the same config: report a given key list once per process.
  static std::mutex reported_mu;
  static std::set<std::vector<std::string>> reported;
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(reported_mu);
    first = reported.insert(out.ignored_keys).second;
  }
  if (!out.ignored_keys.empty() && first) {
    spdlog::info("rollout config: {} key(s) have no effect on Tessera's KV-cache engine (vLLM/SGLang-only or "
                 "unused defaults): {}",
                 out.ignored_keys.size(), fmt::join(out.ignored_keys, ", "));
  }
  return out;
}

}  // namespace tessera::rollout
