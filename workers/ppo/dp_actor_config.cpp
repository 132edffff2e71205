// dp_actor_config.cpp: ActorConfig from verl's `actor` keys, its checks, and verl's per-worker
// batch-size normalisation (see dp_actor.hpp).
#include <algorithm>

#include "workers/algos/kl.hpp"
#include "workers/algos/losses.hpp"
#include "workers/ppo/dp_actor.hpp"
#include "workers/ppo/ppo_inputs.hpp"

namespace tessera::ppo {

algos::PolicyLossConfig ActorConfig::policy_loss_config() const {
  algos::PolicyLossConfig c;
  c.clip_ratio = clip_ratio;
  c.clip_ratio_low = clip_ratio_low;
  c.clip_ratio_high = clip_ratio_high;
  c.clip_ratio_c = clip_ratio_c;
  c.clip_cov_ratio = policy_loss.clip_cov_ratio;
  c.clip_cov_lb = policy_loss.clip_cov_lb;
  c.clip_cov_ub = policy_loss.clip_cov_ub;
  c.kl_cov_ratio = policy_loss.kl_cov_ratio;
  c.ppo_kl_coef = policy_loss.ppo_kl_coef;
  return c;
}

namespace {

Status parse_policy_loss(const nlohmann::json& json, const std::string& path, ActorPolicyLossConfig& out) {
  ConfigReader r(json, path);
  r.skip("_target_");
  r.field("loss_mode", out.loss_mode);
  r.field("clip_cov_ratio", out.clip_cov_ratio);
  r.field("clip_cov_lb", out.clip_cov_lb);
  r.field("clip_cov_ub", out.clip_cov_ub);
  r.field("kl_cov_ratio", out.kl_cov_ratio);
  r.field("ppo_kl_coef", out.ppo_kl_coef);
  return r.finish();
}

// Keys of the actor mapping that other components read (engine, checkpointing, profiling) or that
// only select a faster kernel for the same maths.
constexpr const char* kActorKeysOwnedElsewhere[] = {
    "_target_",          "optim",           "fsdp_config", "checkpoint",
    "profiler",          "use_torch_compile", "use_fused_kernels", "use_remove_padding",
    "entropy_from_logits_with_chunking", "entropy_checkpointing",
};

}  // namespace

Result<ActorConfig> parse_actor_config(const nlohmann::json& json, const std::string& path) {
  ActorConfig c;
  ConfigReader r(json, path);
  for (const char* key : kActorKeysOwnedElsewhere) r.skip(key);
  r.field("strategy", c.strategy);
  r.field("ppo_mini_batch_size", c.ppo_mini_batch_size);
  r.field("ppo_micro_batch_size", c.ppo_micro_batch_size);
  r.field("ppo_micro_batch_size_per_gpu", c.ppo_micro_batch_size_per_gpu);
  r.field("use_dynamic_bsz", c.use_dynamic_bsz);
  r.field("ppo_max_token_len_per_gpu", c.ppo_max_token_len_per_gpu);
  r.field("ppo_epochs", c.ppo_epochs);
  r.field("shuffle", c.shuffle);
  r.field("clip_ratio", c.clip_ratio);
  r.field("clip_ratio_low", c.clip_ratio_low);
  r.field("clip_ratio_high", c.clip_ratio_high);
  r.field("clip_ratio_c", c.clip_ratio_c);
  r.fail(parse_policy_loss(r.nested("policy_loss"), r.key_path("policy_loss"), c.policy_loss));
  r.field("loss_agg_mode", c.loss_agg_mode);
  r.field("entropy_coeff", c.entropy_coeff);
  r.field("calculate_entropy", c.calculate_entropy);
  r.field("use_kl_loss", c.use_kl_loss);
  r.field("kl_loss_coef", c.kl_loss_coef);
  r.field("kl_loss_type", c.kl_loss_type);
  r.field("grad_clip", c.grad_clip);
  r.field("ulysses_sequence_parallel_size", c.ulysses_sequence_parallel_size);
  TESSERA_RETURN_IF_ERROR(r.finish());
  TESSERA_RETURN_IF_ERROR(validate_actor_config(c, path));
  return c;
}

Status validate_actor_config(const ActorConfig& c, const std::string& path) {
  auto key = [&](const char* k) { return config_key(path, k); };
  TESSERA_RETURN_IF_ERROR(check_one_of(c.strategy, {"fsdp", "fsdp2"}, key("strategy")));
  TESSERA_RETURN_IF_ERROR(check_positive(key("ppo_mini_batch_size"), c.ppo_mini_batch_size));
  if (c.ppo_micro_batch_size && c.ppo_micro_batch_size_per_gpu) {
    return make_error(ErrorCode::invalid_argument, "{} and {} are both set; set only one",
                      key("ppo_micro_batch_size"), key("ppo_micro_batch_size_per_gpu"));
  }
  if (c.use_dynamic_bsz) {
    TESSERA_RETURN_IF_ERROR(check_positive(key("ppo_max_token_len_per_gpu"), c.ppo_max_token_len_per_gpu));
  }
  TESSERA_RETURN_IF_ERROR(check_positive(key("ppo_epochs"), c.ppo_epochs));
  if (!(c.grad_clip > 0)) return make_error(ErrorCode::invalid_argument, "{} = {} must be > 0", key("grad_clip"), c.grad_clip);
  if (!(c.clip_ratio_c > 1)) {
    return make_error(ErrorCode::invalid_argument, "{} = {} must be > 1", key("clip_ratio_c"), c.clip_ratio_c);
  }
  TESSERA_RETURN_IF_ERROR(
      check_positive(key("ulysses_sequence_parallel_size"), c.ulysses_sequence_parallel_size));
  TESSERA_RETURN_IF_ERROR(check_one_of(c.loss_agg_mode, algos::agg_loss_modes(), key("loss_agg_mode")));
  TESSERA_RETURN_IF_ERROR(check_one_of(c.policy_loss.loss_mode, algos::registered_policy_losses(),
                                       key("policy_loss.loss_mode")));
  if (c.use_kl_loss) {
    std::vector<std::string> types = algos::kl_penalty_types();
    types.erase(std::remove(types.begin(), types.end(), "full"), types.end());  // verl raises on it
    TESSERA_RETURN_IF_ERROR(check_one_of(c.kl_loss_type, types, key("kl_loss_type")));
  }
  return Status();
}

Result<ActorConfig> normalize_actor_config(ActorConfig c, int64_t rollout_n, const DataParallelShape& shape) {
  TESSERA_ASSIGN_OR_RETURN(int64_t dp, data_parallel_size(shape));
  TESSERA_ASSIGN_OR_RETURN(c.ppo_mini_batch_size,
                           normalize_mini_batch_size(c.ppo_mini_batch_size, rollout_n, dp, "actor.ppo_mini_batch_size"));
  if (c.ppo_micro_batch_size && c.ppo_micro_batch_size_per_gpu) {
    return make_error(ErrorCode::invalid_argument,
                      "actor.ppo_micro_batch_size and actor.ppo_micro_batch_size_per_gpu are both set; set only one");
  }
  TESSERA_RETURN_IF_ERROR(fold_global_micro_batch_size(c.ppo_micro_batch_size, c.ppo_micro_batch_size_per_gpu, dp,
                                                       "actor.ppo_micro_batch_size"));
  TESSERA_RETURN_IF_ERROR(check_normalized_micro_batch("actor", c.ppo_mini_batch_size, c.ppo_micro_batch_size_per_gpu,
                                                       c.use_dynamic_bsz));
  return c;
}

}  // namespace tessera::ppo
