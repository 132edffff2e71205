// load_config and verl's driver-side config rules (driver/config.hpp; reference/verl-fsdp.md §3.4).
#include <algorithm>

#include "driver/config.hpp"
#include "driver/model_paths.hpp"
#include "driver/internal/config_util.hpp"
#include "driver/logger.hpp"
#include "driver/reward.hpp"
#include "workers/algos/kl.hpp"

namespace tessera::driver {
namespace {

Status invalid(std::string message) { return Status(ErrorCode::invalid_argument, std::move(message)); }

Status check_one_of(const nlohmann::json& cfg, const char* key, const std::vector<std::string>& allowed) {
  TESSERA_ASSIGN_OR_RETURN(std::string v, config_get<std::string>(cfg, key));
  if (std::find(allowed.begin(), allowed.end(), v) != allowed.end()) return Status();
  return invalid(fmt::format("config key '{}' = '{}' is not one of: {}", key, v, fmt::join(allowed, ", ")));
}

// verl's check_mutually_exclusive: exactly one of `<section>.<param>` / `<param>_per_gpu` is set.
Status check_mutually_exclusive(const nlohmann::json& cfg, const std::string& section, const std::string& param) {
  std::string a = section + "." + param, b = a + "_per_gpu";
  TESSERA_ASSIGN_OR_RETURN(auto mbs, config_get_or<std::optional<int64_t>>(cfg, a, std::nullopt));
  TESSERA_ASSIGN_OR_RETURN(auto per_gpu, config_get_or<std::optional<int64_t>>(cfg, b, std::nullopt));
  if (!mbs && !per_gpu) return invalid(fmt::format("[{}] set one of '{}' or '{}'", section, a, b));
  if (mbs && per_gpu) {
    return invalid(fmt::format("[{}] both '{}' = {} and '{}' = {} are set; remove '{}' (deprecated)", section, a,
                               *mbs, b, *per_gpu, a));
  }
  return Status();
}

// Mini-batch vs micro-batch rules shared by the actor and the critic (verl: only when the
// deprecated global micro_batch_size is given).
Status check_mini_micro(const nlohmann::json& cfg, const std::string& section, int64_t train_batch_size,
                        int64_t n_gpus) {
  TESSERA_ASSIGN_OR_RETURN(int64_t mini, config_get<int64_t>(cfg, section + ".ppo_mini_batch_size"));
  if (train_batch_size < mini) {
    return invalid(fmt::format("data.train_batch_size = {} must be >= {}.ppo_mini_batch_size = {}", train_batch_size,
                               section, mini));
  }
  TESSERA_ASSIGN_OR_RETURN(int64_t sp, config_get_or<int64_t>(cfg, section + ".ulysses_sequence_parallel_size", 1));
  TESSERA_ASSIGN_OR_RETURN(auto micro, config_get<std::optional<int64_t>>(cfg, section + ".ppo_micro_batch_size"));
  if (!micro) return Status();
  if (*micro < 1 || mini % *micro != 0) {
    return invalid(fmt::format("{0}.ppo_mini_batch_size = {1} must be divisible by {0}.ppo_micro_batch_size = {2}",
                               section, mini, *micro));
  }
  if (*micro * sp < n_gpus) {
    return invalid(fmt::format("{0}.ppo_micro_batch_size = {1} times {0}.ulysses_sequence_parallel_size = {2} must be "
                               ">= the GPU count {3}", section, *micro, sp, n_gpus));
  }
  return Status();
}

Status check_micro_batch_settings(const nlohmann::json& cfg) {
  TESSERA_ASSIGN_OR_RETURN(bool actor_dyn, config_get<bool>(cfg, "actor_rollout_ref.actor.use_dynamic_bsz"));
  if (!actor_dyn) {
    TESSERA_RETURN_IF_ERROR(check_mutually_exclusive(cfg, "actor_rollout_ref.actor", "ppo_micro_batch_size"));
    if (need_reference_policy(cfg)) {
      TESSERA_RETURN_IF_ERROR(check_mutually_exclusive(cfg, "actor_rollout_ref.ref", "log_prob_micro_batch_size"));
    }
    TESSERA_RETURN_IF_ERROR(check_mutually_exclusive(cfg, "actor_rollout_ref.rollout", "log_prob_micro_batch_size"));
  }
  TESSERA_ASSIGN_OR_RETURN(bool critic_dyn, config_get<bool>(cfg, "critic.use_dynamic_bsz"));
  if (need_critic(cfg) && !critic_dyn) {
    TESSERA_RETURN_IF_ERROR(check_mutually_exclusive(cfg, "critic", "ppo_micro_batch_size"));
  }
  TESSERA_ASSIGN_OR_RETURN(bool rm, config_get<bool>(cfg, "reward_model.enable"));
  TESSERA_ASSIGN_OR_RETURN(bool rm_dyn, config_get<bool>(cfg, "reward_model.use_dynamic_bsz"));
  if (rm && !rm_dyn) TESSERA_RETURN_IF_ERROR(check_mutually_exclusive(cfg, "reward_model", "micro_batch_size"));
  return Status();
}

Status check_sequence_parallel(const nlohmann::json& cfg) {
  TESSERA_ASSIGN_OR_RETURN(int64_t actor_sp,
                           config_get_or<int64_t>(cfg, "actor_rollout_ref.actor.ulysses_sequence_parallel_size", 1));
  TESSERA_ASSIGN_OR_RETURN(int64_t ref_sp,
                           config_get_or<int64_t>(cfg, "actor_rollout_ref.ref.ulysses_sequence_parallel_size", 1));
  TESSERA_ASSIGN_OR_RETURN(bool rmpad, config_get<bool>(cfg, "actor_rollout_ref.model.use_remove_padding"));
  if ((actor_sp > 1 || ref_sp > 1) && !rmpad) {
    return invalid(fmt::format("actor_rollout_ref.actor.ulysses_sequence_parallel_size = {} (ref {}) > 1 requires "
                               "actor_rollout_ref.model.use_remove_padding = true", actor_sp, ref_sp));
  }
  TESSERA_ASSIGN_OR_RETURN(int64_t critic_sp, config_get_or<int64_t>(cfg, "critic.ulysses_sequence_parallel_size", 1));
  TESSERA_ASSIGN_OR_RETURN(bool critic_rmpad, config_get<bool>(cfg, "critic.model.use_remove_padding"));
  if (need_critic(cfg) && critic_sp > 1 && !critic_rmpad) {
    return invalid(fmt::format("critic.ulysses_sequence_parallel_size = {} > 1 requires "
                               "critic.model.use_remove_padding = true", critic_sp));
  }
  TESSERA_ASSIGN_OR_RETURN(bool rm, config_get<bool>(cfg, "reward_model.enable"));
  TESSERA_ASSIGN_OR_RETURN(int64_t rm_sp, config_get_or<int64_t>(cfg, "reward_model.ulysses_sequence_parallel_size", 1));
  TESSERA_ASSIGN_OR_RETURN(bool rm_rmpad, config_get_or<bool>(cfg, "reward_model.model.use_remove_padding", false));
  if (rm && rm_sp > 1 && !rm_rmpad) {
    return invalid(fmt::format("reward_model.ulysses_sequence_parallel_size = {} > 1 requires "
                               "reward_model.model.use_remove_padding = true", rm_sp));
  }
  return Status();
}

Status check_sampling_and_multi_turn(const nlohmann::json& cfg) {
  TESSERA_ASSIGN_OR_RETURN(bool val_sample, config_get<bool>(cfg, "actor_rollout_ref.rollout.val_kwargs.do_sample"));
  TESSERA_ASSIGN_OR_RETURN(double temperature, config_get<double>(cfg, "actor_rollout_ref.rollout.temperature"));
  if (val_sample && !(temperature > 0)) {
    return invalid(fmt::format("actor_rollout_ref.rollout.val_kwargs.do_sample = true requires "
                               "actor_rollout_ref.rollout.temperature > 0 (got {})", temperature));
  }
  TESSERA_ASSIGN_OR_RETURN(bool multi_turn, config_get<bool>(cfg, "actor_rollout_ref.rollout.multi_turn.enable"));
  if (multi_turn) {
    TESSERA_ASSIGN_OR_RETURN(auto tools, config_get<std::optional<std::string>>(
                                             cfg, "actor_rollout_ref.rollout.multi_turn.tool_config_path"));
    TESSERA_ASSIGN_OR_RETURN(auto inter, config_get<std::optional<std::string>>(
                                             cfg, "actor_rollout_ref.rollout.multi_turn.interaction_config_path"));
    if (!tools && !inter) {
      return invalid("actor_rollout_ref.rollout.multi_turn.enable = true requires multi_turn.tool_config_path or "
                     "multi_turn.interaction_config_path");
    }
  }
  return Status();
}

Result<int64_t> gpu_count(const nlohmann::json& cfg) {
  TESSERA_ASSIGN_OR_RETURN(int64_t per_node, config_get<int64_t>(cfg, "trainer.n_gpus_per_node"));
  TESSERA_ASSIGN_OR_RETURN(int64_t nodes, config_get<int64_t>(cfg, "trainer.nnodes"));
  if (per_node < 1 || nodes < 1) {
    return invalid(fmt::format("trainer.n_gpus_per_node = {} and trainer.nnodes = {} must be >= 1", per_node, nodes));
  }
  return per_node * nodes;
}

Status check_loggers(const nlohmann::json& cfg) {
  TESSERA_ASSIGN_OR_RETURN(auto backends, config_get<std::vector<std::string>>(cfg, "trainer.logger"));
  return check_logger_backends(backends);
}

Status check_common(const nlohmann::json& cfg) {
  TESSERA_RETURN_IF_ERROR(check_loggers(cfg));
  TESSERA_RETURN_IF_ERROR(check_one_of(cfg, "data.truncation", {"error", "left", "right", "middle"}));
  TESSERA_RETURN_IF_ERROR(check_one_of(cfg, "trainer.resume_mode", {"auto", "resume_path", "disable"}));
  TESSERA_RETURN_IF_ERROR(check_one_of(cfg, "trainer.device", {"cpu", "cuda"}));
  TESSERA_ASSIGN_OR_RETURN(int64_t threads, config_get<int64_t>(cfg, "trainer.num_threads"));
  if (threads < 0) return invalid(fmt::format("trainer.num_threads = {} must be >= 0", threads));
  return Status();
}

// After interpolation: every known key's value must still fit its default's type. Keys that
// are not in the schema were added with +key=... and are not checked.
Status check_resolved_types(const nlohmann::json& value, const nlohmann::json& schema, const std::string& key) {
  if (!value.is_object() || !schema.is_object() || schema.empty()) {
    return internal::check_against_schema(value, &schema, key, "resolved config");
  }
  for (const auto& [name, child] : value.items()) {
    auto it = schema.find(name);
    if (it == schema.end()) continue;
    TESSERA_RETURN_IF_ERROR(check_resolved_types(child, *it, key.empty() ? name : key + "." + name));
  }
  return Status();
}

// verl reads some list keys as "a string or a list" (trainer.logger=console): a string given
// where the default is a list becomes a one-element list.
void listify_strings(nlohmann::json& value, const nlohmann::json& schema) {
  if (!value.is_object() || !schema.is_object()) return;
  for (auto& [name, child] : value.items()) {
    auto it = schema.find(name);
    if (it == schema.end()) continue;
    if (it->is_array() && child.is_string()) {
      child = nlohmann::json::array({child});
    } else {
      listify_strings(child, *it);
    }
  }
}

// A key Tessera accepts only at its default: anything else is refused, naming the key and why.
struct Refusal {
  const char* key;
  const char* why;
};

bool at_default(const nlohmann::json* v) {
  return v == nullptr || v->is_null() || (v->is_boolean() && !v->get<bool>()) || (v->is_object() && v->empty()) ||
         (v->is_array() && v->empty());
}

Status check_refusals(const nlohmann::json& cfg, std::initializer_list<Refusal> refusals) {
  for (const auto& r : refusals) {
    const nlohmann::json* v = config_find(cfg, r.key);
    if (at_default(v)) continue;
    return Status(ErrorCode::unimplemented, fmt::format("{} = {}: {}", r.key, detail::json_brief(*v), r.why));
  }
  return Status();
}

// checkpoint.save_contents / load_contents: Tessera's checkpoints always hold the model, the
// optimizer and the extra state; `hf_model` (save only) adds an HF directory (`allow_hf`).
Status check_contents(const nlohmann::json& cfg, const std::string& section, bool allow_hf) {
  for (const char* which : {"save_contents", "load_contents"}) {
    const std::string key = section + ".checkpoint." + which;
    const nlohmann::json* v = config_find(cfg, key);
    if (v == nullptr) continue;
    for (const auto& item : *v) {
      const std::string name = item.is_string() ? item.get<std::string>() : item.dump();
      if (name == "model" || name == "optimizer" || name == "extra") continue;
      if (name == "hf_model" && allow_hf) continue;  // loading reads the shards either way
      return Status(ErrorCode::unimplemented,
                    fmt::format("{} lists '{}': Tessera's checkpoints hold model, optimizer and extra{}", key, name,
                                allow_hf ? ", plus hf_model when saving" : "; `tessera export CKPT OUT` writes an HF model"));
    }
    for (const char* needed : {"model", "optimizer", "extra"}) {
      if (std::find(v->begin(), v->end(), needed) == v->end()) {
        return Status(ErrorCode::unimplemented,
                      fmt::format("{} leaves out '{}': Tessera always saves and loads model, optimizer and extra", key,
                                  needed));
      }
    }
  }
  return Status();
}

}  // namespace

Result<nlohmann::json> config_schema(ConfigKind kind) {
  const char* name = kind == ConfigKind::ppo ? "ppo_trainer.yaml (built in)" : "sft_trainer.yaml (built in)";
  TESSERA_ASSIGN_OR_RETURN(nlohmann::json schema, yaml_to_json(default_config_yaml(kind), name));
  TESSERA_RETURN_IF_ERROR(resolve_interpolations(schema));
  return schema;
}

Result<nlohmann::json> load_config(ConfigKind kind, const std::filesystem::path& user_file,
                                   const std::vector<std::string>& overrides) {
  const char* name = kind == ConfigKind::ppo ? "ppo_trainer.yaml (built in)" : "sft_trainer.yaml (built in)";
  TESSERA_ASSIGN_OR_RETURN(nlohmann::json cfg, yaml_to_json(default_config_yaml(kind), name));
  TESSERA_ASSIGN_OR_RETURN(nlohmann::json schema, config_schema(kind));
  if (!user_file.empty()) {
    TESSERA_ASSIGN_OR_RETURN(nlohmann::json user, read_yaml_file(user_file));
    TESSERA_RETURN_IF_ERROR(merge_config(cfg, user, schema, user_file.string()));
  }
  for (const auto& o : overrides) TESSERA_RETURN_IF_ERROR(apply_override(cfg, o, schema));
  TESSERA_RETURN_IF_ERROR(resolve_interpolations(cfg));
  TESSERA_RETURN_IF_ERROR(check_resolved_types(cfg, schema, ""));
  listify_strings(cfg, schema);
  resolve_model_paths(cfg, kind);
  return cfg;
}

namespace {

bool is_override(const std::string& arg) {
  return !arg.empty() && (arg[0] == '~' || arg[0] == '+' || arg.find('=') != std::string::npos);
}

}  // namespace

Result<ConfigArgs> split_config_args(const std::vector<std::string>& args, const std::string& config_path,
                                     const std::string& config_name) {
  ConfigArgs out;
  size_t first = 0;
  if (!config_name.empty()) {
    std::filesystem::path name(config_name);
    if (!name.has_extension()) name += ".yaml";
    out.file = config_path.empty() ? name : std::filesystem::path(config_path) / name;
  } else if (!config_path.empty()) {
    return make_error(ErrorCode::invalid_argument, "--config-path {} needs --config-name NAME", config_path);
  } else if (!args.empty() && !is_override(args[0])) {
    out.file = args[0];
    first = 1;
  }
  for (size_t i = first; i < args.size(); ++i) {
    if (!is_override(args[i])) {
      return make_error(ErrorCode::invalid_argument,
                        "'{}' is not an override (a.b=value, +a.b=value, ~a.b); only the first argument may be a "
                        "config file",
                        args[i]);
    }
    out.overrides.push_back(args[i]);
  }
  return out;
}

bool need_critic(const nlohmann::json& cfg) {
  auto est = config_get<std::string>(cfg, "algorithm.adv_estimator");
  return est.ok() && *est == "gae";
}

bool need_reference_policy(const nlohmann::json& cfg) {
  auto in_reward = config_get<bool>(cfg, "algorithm.use_kl_in_reward");
  auto kl_loss = config_get<bool>(cfg, "actor_rollout_ref.actor.use_kl_loss");
  return (in_reward.ok() && *in_reward) || (kl_loss.ok() && *kl_loss);
}

namespace {

// What verl offers and Tessera does not (yet): refused before anything else is checked.
Status check_ppo_support(const nlohmann::json& cfg) {
  TESSERA_RETURN_IF_ERROR(check_refusals(cfg, {
      {"data.datagen.path", "dynamic data generation is Python and is not supported"},
      {"trainer.default_hdfs_dir", "HDFS is not supported; checkpoints go to trainer.default_local_dir"},
  }));
  TESSERA_RETURN_IF_ERROR(reward_manager_options(cfg).status());
  TESSERA_RETURN_IF_ERROR(check_one_of(cfg, "algorithm.pf_ppo.reweight_method", {"pow", "max_min", "max_random"}));
  // Tessera is the FSDP backend: megatron (or anything else) would otherwise silently be FSDP.
  for (const char* key : {"actor_rollout_ref.actor.strategy", "actor_rollout_ref.ref.strategy", "critic.strategy",
                          "reward_model.strategy"}) {
    TESSERA_RETURN_IF_ERROR(check_one_of(cfg, key, {"fsdp", "fsdp2"}));
  }
  std::vector<std::string> kl_types = algos::kl_penalty_types();
  kl_types.erase(std::remove(kl_types.begin(), kl_types.end(), "full"), kl_types.end());  // verl raises on it
  TESSERA_RETURN_IF_ERROR(check_one_of(cfg, "algorithm.kl_penalty", kl_types));
  TESSERA_RETURN_IF_ERROR(check_one_of(cfg, "actor_rollout_ref.actor.kl_loss_type", kl_types));
  TESSERA_RETURN_IF_ERROR(check_contents(cfg, "actor_rollout_ref.actor", /*allow_hf=*/true));
  TESSERA_RETURN_IF_ERROR(check_contents(cfg, "critic", /*allow_hf=*/false));
  return Status();
}

// data.gen_batch_size and DAPO's algorithm.filter_groups (verl's recipe/dapo).
Status check_dynamic_sampling(const nlohmann::json& cfg, int64_t n, int64_t n_gpus) {
  TESSERA_ASSIGN_OR_RETURN(int64_t gen, config_get<int64_t>(cfg, "data.gen_batch_size"));
  if (gen < 1) return invalid(fmt::format("data.gen_batch_size = {} must be >= 1", gen));
  if ((gen * n) % n_gpus != 0) {
    return invalid(fmt::format("data.gen_batch_size * actor_rollout_ref.rollout.n = {} * {} = {} must be divisible by "
                               "trainer.nnodes * trainer.n_gpus_per_node = {}", gen, n, gen * n, n_gpus));
  }
  TESSERA_ASSIGN_OR_RETURN(bool enable, config_get<bool>(cfg, "algorithm.filter_groups.enable"));
  if (!enable) return Status();
  TESSERA_ASSIGN_OR_RETURN(auto metric, config_get<std::optional<std::string>>(cfg, "algorithm.filter_groups.metric"));
  if (!metric || metric->empty()) {
    return invalid("algorithm.filter_groups.enable=true needs algorithm.filter_groups.metric (acc, score, seq_reward, "
                   "seq_final_reward or another reward extra-info key)");
  }
  TESSERA_ASSIGN_OR_RETURN(bool in_reward, config_get<bool>(cfg, "algorithm.use_kl_in_reward"));
  if (in_reward) {
    return invalid("algorithm.filter_groups.enable=true with algorithm.use_kl_in_reward=true is not supported (the "
                   "KL penalty would need the log-prob passes on every generation batch)");
  }
  TESSERA_ASSIGN_OR_RETURN(int64_t max_batches, config_get<int64_t>(cfg, "algorithm.filter_groups.max_num_gen_batches"));
  (void)max_batches;  // any integer: <= 0 is no limit (verl)
  return Status();
}

}  // namespace

Status validate_ppo_config(const nlohmann::json& cfg) {
  TESSERA_RETURN_IF_ERROR(check_common(cfg));
  TESSERA_RETURN_IF_ERROR(check_ppo_support(cfg));
  // verl's samples[:n] with n < 0 would log all but the last |n| samples: never what is meant.
  TESSERA_ASSIGN_OR_RETURN(int64_t val_generations, config_get<int64_t>(cfg, "trainer.log_val_generations"));
  if (val_generations < 0) {
    return invalid(fmt::format("trainer.log_val_generations = {} must be >= 0", val_generations));
  }
  TESSERA_RETURN_IF_ERROR(check_one_of(cfg, "algorithm.adv_estimator",
                                       {"gae", "grpo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax",
                                        "rloo", "opo", "grpo_passk", "gpg"}));
  TESSERA_RETURN_IF_ERROR(check_one_of(cfg, "actor_rollout_ref.actor.loss_agg_mode",
                                       {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                        "seq-mean-token-sum-norm"}));
  TESSERA_ASSIGN_OR_RETURN(int64_t n_gpus, gpu_count(cfg));
  TESSERA_ASSIGN_OR_RETURN(int64_t tbs, config_get<int64_t>(cfg, "data.train_batch_size"));
  TESSERA_ASSIGN_OR_RETURN(int64_t n, config_get<int64_t>(cfg, "actor_rollout_ref.rollout.n"));
  if (tbs < 1 || n < 1) {
    return invalid(fmt::format("data.train_batch_size = {} and actor_rollout_ref.rollout.n = {} must be >= 1", tbs, n));
  }
  if ((tbs * n) % n_gpus != 0) {
    return invalid(fmt::format("data.train_batch_size * actor_rollout_ref.rollout.n = {} * {} = {} must be divisible "
                               "by trainer.nnodes * trainer.n_gpus_per_node = {}", tbs, n, tbs * n, n_gpus));
  }
  TESSERA_RETURN_IF_ERROR(check_dynamic_sampling(cfg, n, n_gpus));
  TESSERA_RETURN_IF_ERROR(check_micro_batch_settings(cfg));
  TESSERA_ASSIGN_OR_RETURN(bool actor_dyn, config_get<bool>(cfg, "actor_rollout_ref.actor.use_dynamic_bsz"));
  if (!actor_dyn) TESSERA_RETURN_IF_ERROR(check_mini_micro(cfg, "actor_rollout_ref.actor", tbs, n_gpus));
  TESSERA_ASSIGN_OR_RETURN(bool critic_dyn, config_get<bool>(cfg, "critic.use_dynamic_bsz"));
  if (need_critic(cfg) && !critic_dyn) TESSERA_RETURN_IF_ERROR(check_mini_micro(cfg, "critic", tbs, n_gpus));
  TESSERA_RETURN_IF_ERROR(check_sequence_parallel(cfg));
  TESSERA_RETURN_IF_ERROR(check_sampling_and_multi_turn(cfg));
  TESSERA_ASSIGN_OR_RETURN(bool hybrid, config_get<bool>(cfg, "actor_rollout_ref.hybrid_engine"));
  if (!hybrid) return invalid("actor_rollout_ref.hybrid_engine = false is not supported (verl requires true)");
  return Status();
}

Status validate_sft_config(const nlohmann::json& cfg) {
  TESSERA_RETURN_IF_ERROR(check_common(cfg));
  TESSERA_ASSIGN_OR_RETURN(int64_t n_gpus, gpu_count(cfg));
  TESSERA_ASSIGN_OR_RETURN(int64_t tbs, config_get<int64_t>(cfg, "data.train_batch_size"));
  TESSERA_ASSIGN_OR_RETURN(int64_t micro, config_get<int64_t>(cfg, "data.micro_batch_size_per_gpu"));
  if (tbs < 1 || micro < 1) {
    return invalid(fmt::format("data.train_batch_size = {} and data.micro_batch_size_per_gpu = {} must be >= 1", tbs,
                               micro));
  }
  if (tbs % n_gpus != 0) {
    return invalid(fmt::format("data.train_batch_size = {} must be divisible by trainer.nnodes * "
                               "trainer.n_gpus_per_node = {}", tbs, n_gpus));
  }
  // Ulysses groups of `sp` ranks share their rows: a group's batch is train_batch_size / (GPUs / sp).
  TESSERA_ASSIGN_OR_RETURN(int64_t sp, config_get_or<int64_t>(cfg, "ulysses_sequence_parallel_size", 1));
  if (sp < 1 || n_gpus % sp != 0) {
    return invalid(fmt::format("ulysses_sequence_parallel_size = {} must divide trainer.nnodes * "
                               "trainer.n_gpus_per_node = {}", sp, n_gpus));
  }
  TESSERA_ASSIGN_OR_RETURN(bool rmpad, config_get_or<bool>(cfg, "use_remove_padding", false));
  if (sp > 1 && !rmpad) {
    return invalid(fmt::format("ulysses_sequence_parallel_size = {} > 1 requires use_remove_padding = true", sp));
  }
  const int64_t dp = n_gpus / sp;
  if ((tbs / dp) % micro != 0) {
    return invalid(fmt::format("data.train_batch_size / (GPUs / ulysses_sequence_parallel_size) = {} / {} = {} must be "
                               "divisible by data.micro_batch_size_per_gpu = {}", tbs, dp, tbs / dp, micro));
  }
  TESSERA_ASSIGN_OR_RETURN(int64_t max_length, config_get<int64_t>(cfg, "data.max_length"));
  if (max_length < 2) return invalid(fmt::format("data.max_length = {} must be >= 2", max_length));
  TESSERA_RETURN_IF_ERROR(check_refusals(cfg, {
      {"data.balance_dp_token", "token-balanced data-parallel loss is not supported yet"},
      {"trainer.default_hdfs_dir", "HDFS is not supported; checkpoints go to trainer.default_local_dir"},
  }));
  // Tessera is the FSDP backend: another strategy would otherwise silently be FSDP.
  TESSERA_RETURN_IF_ERROR(check_one_of(cfg, "model.strategy", {"fsdp", "fsdp2"}));
  // Every SFT checkpoint holds an HF directory already.
  return check_contents(cfg, "trainer", /*allow_hf=*/true);
}

}  // namespace tessera::driver
