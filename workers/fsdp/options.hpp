// options.hpp: FSDP, mixed-precision, optimizer and LR-schedule options, read from verl's keys.
//
// fsdp_config (actor.fsdp_config, ref.fsdp_config, critic.model.fsdp_config):
//   fsdp_size                 -1 | n: n in (0, world) selects HYBRID_SHARD on a (ddp, fsdp) mesh,
//                             as verl's create_device_mesh does; otherwise a 1-D ("fsdp",) mesh.
//   reshard_after_forward     true: FULL_SHARD (default); false: SHARD_GRAD_OP.
//   sharding_strategy         Tessera extension: FULL_SHARD | SHARD_GRAD_OP | NO_SHARD |
//                             HYBRID_SHARD; overrides the two keys above when present (null: not).
//   param_offload, optimizer_offload   manual offload between calls (verl's fsdp_utils).
//   mixed_precision.{param_dtype, reduce_dtype, buffer_dtype}   defaults bf16 / fp32 / fp32.
//   model_dtype               dtype of the sharded master weights (default fp32).
//   wrap_policy.{transformer_layer_cls_to_wrap, min_num_params, disable}
//   forward_prefetch          start the next unit's all-gather before the current unit's forward
//                             runs (Note [FSDP overlap]); backward always prefetches.
//   strategy (fsdp | fsdp2), use_orig_params: accepted; they select nothing here (one engine;
//   original names are always kept).
//   offload_policy: true is refused (FSDP2-native offload during compute is not implemented).
// optim (actor.optim): lr, betas, eps, weight_decay, lr_warmup_steps, lr_warmup_steps_ratio,
//   total_training_steps, warmup_style | lr_scheduler_type (constant | cosine), min_lr_ratio,
//   num_cycles; clip_grad comes from actor.grad_clip and is passed separately.
// Any other key is an error naming it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>
#include <nlohmann/json.hpp>

#include "proto/status.hpp"

namespace tessera::fsdp {

/// PyTorch FSDP's sharding strategies.
enum class ShardingStrategy : uint8_t { full_shard, shard_grad_op, no_shard, hybrid_shard };

/// "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD".
const char* to_string(ShardingStrategy s);
/// Parses the names above.
Result<ShardingStrategy> parse_sharding_strategy(const std::string& name);

/// Dtypes for gathered parameters, gradient reduction and module buffers.
struct MixedPrecision {
  c10::ScalarType param_dtype = c10::ScalarType::BFloat16;
  c10::ScalarType reduce_dtype = c10::ScalarType::Float;
  c10::ScalarType buffer_dtype = c10::ScalarType::Float;
};

/// verl's wrap_policy block.
struct WrapPolicy {
  std::vector<std::string> transformer_layer_cls_to_wrap;  ///< Empty: modules named *DecoderLayer.
  int64_t min_num_params = 0;  ///< > 0: size-based wrapping instead of layer classes.
  bool disable = false;        ///< One unit for the whole model.
};

/// The parsed fsdp_config block.
struct FsdpConfig {
  int fsdp_size = -1;
  ShardingStrategy strategy = ShardingStrategy::full_shard;  ///< Before the mesh is known.
  bool strategy_explicit = false;  ///< sharding_strategy was given.
  bool param_offload = false;
  bool optimizer_offload = false;
  bool forward_prefetch = false;
  MixedPrecision mixed_precision;
  c10::ScalarType model_dtype = c10::ScalarType::Float;
  WrapPolicy wrap_policy;
};

/// Parses fsdp_config; `path` (e.g. "actor_rollout_ref.actor.fsdp_config") prefixes errors.
Result<FsdpConfig> parse_fsdp_config(const nlohmann::json& json, const std::string& path);

/// The strategy for a world of `world_size`: HYBRID_SHARD when 0 < fsdp_size < world_size,
/// unless sharding_strategy was given explicitly.
ShardingStrategy resolve_strategy(const FsdpConfig& config, int world_size);

/// LR schedule kinds (verl's warmup_style / lr_scheduler_type).
enum class LrScheduleKind : uint8_t { constant, cosine };

/// verl's schedule knobs.
struct LrScheduleOptions {
  LrScheduleKind kind = LrScheduleKind::constant;
  int64_t warmup_steps = -1;        ///< lr_warmup_steps; < 0: use warmup_steps_ratio.
  double warmup_steps_ratio = 0.0;  ///< lr_warmup_steps_ratio x total_training_steps.
  int64_t total_training_steps = 0;
  double min_lr_ratio = 0.0;
  double num_cycles = 0.5;
};

/// AdamW hyper-parameters (torch semantics, decoupled weight decay).
struct AdamWOptions {
  double lr = 1e-6;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

/// The parsed optim block plus gradient clipping.
struct OptimizerOptions {
  AdamWOptions adamw;
  LrScheduleOptions schedule;
  double clip_grad = 1.0;  ///< Max global grad norm; <= 0 disables clipping (the norm is still reported).
};

/// Parses an optim block (verl keys); `path` prefixes errors.
Result<OptimizerOptions> parse_optim_config(const nlohmann::json& json, const std::string& path);

/// "bf16"/"bfloat16", "fp16"/"float16"/"half", "fp32"/"float32"/"float" -> scalar type.
Result<c10::ScalarType> parse_dtype(const std::string& name, const std::string& key);

}  // namespace tessera::fsdp
