// dp_critic.cpp: CriticConfig parsing / normalisation and DataParallelPPOCritic (see dp_critic.hpp).
#include "workers/ppo/dp_critic.hpp"

#include <algorithm>
#include <utility>

#include <torch/torch.h>

#include "workers/algos/losses.hpp"
#include "workers/algos/torch_functional.hpp"
#include "workers/ppo/ppo_inputs.hpp"
#include "workers/ppo/ppo_update.hpp"
#include "workers/ppo/sequence_parallel.hpp"

namespace tessera::ppo {

// ---- Config -------------------------------------------------------------------------------------

namespace {

constexpr const char* kCriticKeysOwnedElsewhere[] = {"_target_", "optim", "model", "checkpoint", "profiler", "enable"};

}  // namespace

Result<CriticConfig> parse_critic_config(const nlohmann::json& json, const std::string& path) {
  CriticConfig c;
  ConfigReader r(json, path);
  for (const char* key : kCriticKeysOwnedElsewhere) r.skip(key);
  r.field("strategy", c.strategy);
  r.field("rollout_n", c.rollout_n);
  r.field("ppo_mini_batch_size", c.ppo_mini_batch_size);
  r.field("ppo_micro_batch_size", c.ppo_micro_batch_size);
  r.field("ppo_micro_batch_size_per_gpu", c.ppo_micro_batch_size_per_gpu);
  r.field("forward_micro_batch_size", c.forward_micro_batch_size);
  r.field("forward_micro_batch_size_per_gpu", c.forward_micro_batch_size_per_gpu);
  r.field("use_dynamic_bsz", c.use_dynamic_bsz);
  r.field("ppo_max_token_len_per_gpu", c.ppo_max_token_len_per_gpu);
  r.field("forward_max_token_len_per_gpu", c.forward_max_token_len_per_gpu);
  r.field("ppo_epochs", c.ppo_epochs);
  r.field("shuffle", c.shuffle);
  r.field("cliprange_value", c.cliprange_value);
  r.field("loss_agg_mode", c.loss_agg_mode);
  r.field("grad_clip", c.grad_clip);
  r.field("ulysses_sequence_parallel_size", c.ulysses_sequence_parallel_size);
  TESSERA_RETURN_IF_ERROR(r.finish());
  TESSERA_RETURN_IF_ERROR(validate_critic_config(c, path));
  return c;
}

Status validate_critic_config(const CriticConfig& c, const std::string& path) {
  auto key = [&](const char* k) { return config_key(path, k); };
  TESSERA_RETURN_IF_ERROR(check_one_of(c.strategy, {"fsdp", "fsdp2"}, key("strategy")));
  TESSERA_RETURN_IF_ERROR(check_positive(key("rollout_n"), c.rollout_n));
  TESSERA_RETURN_IF_ERROR(check_positive(key("ppo_mini_batch_size"), c.ppo_mini_batch_size));
  TESSERA_RETURN_IF_ERROR(check_positive(key("ppo_epochs"), c.ppo_epochs));
  if (c.use_dynamic_bsz) {
    TESSERA_RETURN_IF_ERROR(check_positive(key("ppo_max_token_len_per_gpu"), c.ppo_max_token_len_per_gpu));
    if (c.forward_max_token_len_per_gpu) {
      TESSERA_RETURN_IF_ERROR(check_positive(key("forward_max_token_len_per_gpu"), *c.forward_max_token_len_per_gpu));
    }
  }
  if (c.ppo_micro_batch_size && c.ppo_micro_batch_size_per_gpu) {
    return make_error(ErrorCode::invalid_argument, "{} and {} are both set; set only one", key("ppo_micro_batch_size"),
                      key("ppo_micro_batch_size_per_gpu"));
  }
  if (!(c.grad_clip > 0)) return make_error(ErrorCode::invalid_argument, "{} = {} must be > 0", key("grad_clip"), c.grad_clip);
  if (!(c.cliprange_value >= 0)) {
    return make_error(ErrorCode::invalid_argument, "{} = {} must be >= 0", key("cliprange_value"), c.cliprange_value);
  }
  const auto modes = algos::agg_loss_modes();
  if (std::find(modes.begin(), modes.end(), c.loss_agg_mode) == modes.end()) {
    return make_error(ErrorCode::invalid_argument, "{} = '{}' is not a loss_agg_mode", key("loss_agg_mode"),
                      c.loss_agg_mode);
  }
  return check_positive(key("ulysses_sequence_parallel_size"), c.ulysses_sequence_parallel_size);
}

Result<CriticConfig> normalize_critic_config(CriticConfig c, const DataParallelShape& shape) {
  TESSERA_ASSIGN_OR_RETURN(int64_t dp, data_parallel_size(shape));
  TESSERA_ASSIGN_OR_RETURN(c.ppo_mini_batch_size,
                           normalize_mini_batch_size(c.ppo_mini_batch_size, c.rollout_n, dp, "critic.ppo_mini_batch_size"));
  TESSERA_RETURN_IF_ERROR(fold_global_micro_batch_size(c.ppo_micro_batch_size, c.ppo_micro_batch_size_per_gpu, dp,
                                                       "critic.ppo_micro_batch_size"));
  TESSERA_RETURN_IF_ERROR(fold_global_micro_batch_size(c.forward_micro_batch_size, c.forward_micro_batch_size_per_gpu,
                                                       dp, "critic.forward_micro_batch_size"));
  if (!c.forward_micro_batch_size_per_gpu) c.forward_micro_batch_size_per_gpu = c.ppo_micro_batch_size_per_gpu;
  if (!c.forward_max_token_len_per_gpu) c.forward_max_token_len_per_gpu = c.ppo_max_token_len_per_gpu;
  TESSERA_RETURN_IF_ERROR(check_normalized_micro_batch("critic", c.ppo_mini_batch_size, c.ppo_micro_batch_size_per_gpu,
                                                       c.use_dynamic_bsz));
  return c;
}

// ---- DataParallelPPOCritic ----------------------------------------------------------------------

namespace {

// The value head's response output as fp32 [B, R]: from [B, R] (padded) or [n] (packed).
Result<at::Tensor> value_grid(const char* method, const ResponseHead& h, const SequenceBatch& seq) {
  const bool fits = h.packed ? h.head.dim() == 1 : h.head.dim() == 2 && h.head.size(1) == seq.response_length;
  if (!fits) {
    return make_error(ErrorCode::internal, "{}: the value module returned {}-D output, expected [B, R] or packed [n]",
                      method, h.head.dim());
  }
  return h.to_grid(h.head.to(at::kFloat));
}

}  // namespace

DataParallelPPOCritic::DataParallelPPOCritic(CriticConfig config, std::shared_ptr<ValueModule> module,
                                             MicroBatchCountSync sync,
                                             std::shared_ptr<const UlyssesGroup> sequence_parallel)
    : config_(std::move(config)),
      module_(std::move(module)),
      sync_(std::move(sync)),
      sequence_parallel_(std::move(sequence_parallel)) {}

Result<std::unique_ptr<DataParallelPPOCritic>> DataParallelPPOCritic::create(
    CriticConfig config, std::shared_ptr<ValueModule> module, MicroBatchCountSync sync,
    std::shared_ptr<const UlyssesGroup> sequence_parallel) {
  if (!module) return make_error(ErrorCode::invalid_argument, "DataParallelPPOCritic: null module");
  TESSERA_RETURN_IF_ERROR(validate_critic_config(config, "critic"));
  TESSERA_RETURN_IF_ERROR(check_sequence_parallel_group("critic", config.ulysses_sequence_parallel_size,
                                                        config.use_remove_padding, sequence_parallel.get()));
  if (config.ppo_micro_batch_size || config.forward_micro_batch_size) {
    return make_error(ErrorCode::invalid_argument,
                      "DataParallelPPOCritic: a global micro-batch size is set; run normalize_critic_config first");
  }
  TESSERA_RETURN_IF_ERROR(check_fixed_micro_batch("critic", config.ppo_mini_batch_size,
                                                  config.ppo_micro_batch_size_per_gpu, config.use_dynamic_bsz));
  return std::unique_ptr<DataParallelPPOCritic>(
      new DataParallelPPOCritic(std::move(config), std::move(module), std::move(sync), std::move(sequence_parallel)));
}

Result<at::Tensor> DataParallelPPOCritic::compute_values(const proto::DataProto& data) {
  return guarded_call("compute_values", [&] { return compute_values_impl(data); });
}

namespace {

// meta_info[key] when present, else the config's fallback; errors name whichever was used.
Result<int64_t> int_meta_or(const nlohmann::json& meta, const char* key, const std::optional<int64_t>& fallback,
                            const char* fallback_key) {
  if (meta.is_object() && meta.contains(key)) return meta_positive_int(meta, key);
  if (!fallback || *fallback < 1) {
    return make_error(ErrorCode::invalid_argument, "meta_info.{} is absent and {} is not set", key, fallback_key);
  }
  return *fallback;
}

}  // namespace

Result<at::Tensor> DataParallelPPOCritic::compute_values_impl(const proto::DataProto& data) {
  TESSERA_RETURN_IF_ERROR(check_text_only(data));
  if (data.size() == 0) return make_error(ErrorCode::invalid_argument, "compute_values: empty batch");
  TESSERA_ASSIGN_OR_RETURN(auto seq, read_sequence_batch(data));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor response_mask, read_response_mask(data, seq));
  const auto& meta = data.meta_info();
  bool use_dynamic_bsz = config_.use_dynamic_bsz;
  if (meta.is_object() && meta.contains("use_dynamic_bsz")) {
    TESSERA_ASSIGN_OR_RETURN(use_dynamic_bsz, meta_bool(meta, "use_dynamic_bsz"));
  }
  TESSERA_ASSIGN_OR_RETURN(auto selected, data.select(kPpoForwardKeys, std::vector<std::string>{}));
  // Note [Ulysses sequence parallelism]: the group's rows, and a token budget for all of them.
  if (sequence_parallel_) {
    TESSERA_ASSIGN_OR_RETURN(selected, sequence_parallel_->gather_rows(selected));
  }
  const int64_t sp = sequence_parallel_ ? sequence_parallel_->size() : 1;
  MicroBatches micro;
  if (use_dynamic_bsz) {
    TESSERA_ASSIGN_OR_RETURN(int64_t max_token_len, int_meta_or(meta, "max_token_len", config_.forward_max_token_len_per_gpu,
                                                                "critic.forward_max_token_len_per_gpu"));
    TESSERA_ASSIGN_OR_RETURN(micro, rearrange_micro_batches(selected, max_token_len * sp, "max_token_len", sync_));
  } else {
    TESSERA_ASSIGN_OR_RETURN(int64_t mbs, int_meta_or(meta, "micro_batch_size", config_.forward_micro_batch_size_per_gpu,
                                                      "critic.forward_micro_batch_size_per_gpu"));
    TESSERA_ASSIGN_OR_RETURN(micro, split_micro_batches(selected, mbs, "micro_batch_size"));
  }
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> parts;
  TESSERA_ASSIGN_OR_RETURN(auto host_masks, micro_batch_host_masks(selected, micro, config_.use_remove_padding));
  for (size_t i = 0; i < micro.batches.size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(auto s, read_sequence_batch(micro.batches[i]));
    TESSERA_ASSIGN_OR_RETURN(ResponseHead v, response_head(*module_, s, ForwardMode::eval, config_.use_remove_padding,
                                                           host_masks[i], sequence_parallel_));
    TESSERA_ASSIGN_OR_RETURN(at::Tensor values, value_grid("compute_values", v, s));
    parts.push_back(values);
  }
  at::Tensor values = at::cat(parts, 0);
  if (use_dynamic_bsz) {
    TESSERA_ASSIGN_OR_RETURN(values, restore_dynamic_batch(values, micro.indices));
  }
  if (sequence_parallel_) values = sequence_parallel_->local_rows(values);  // this rank's rows
  return values * response_mask.to(values.scalar_type());
}

Result<Metrics> DataParallelPPOCritic::update_critic(const proto::DataProto& data) {
  return guarded_update(*module_, "update_critic", [&] { return update_critic_impl(data); });
}

namespace {

Result<MicroLoss> value_micro_loss(const CriticConfig& config, const proto::DataProto& mb, const SequenceBatch& seq,
                                   const ResponseHead& head) {
  TESSERA_ASSIGN_OR_RETURN(at::Tensor vpreds, value_grid("update_critic", head, seq));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor values, mb.tensor("values"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor returns, mb.tensor("returns"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor mask, read_response_mask(mb, seq));
  TESSERA_ASSIGN_OR_RETURN(auto vf, algos::compute_value_loss(vpreds, returns, values, mask, config.cliprange_value,
                                                              config.loss_agg_mode));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor vpred_mean, algos::masked_mean(vpreds.detach(), mask));
  MicroLoss r;
  r.loss = vf.vf_loss;
  r.metrics["critic/vf_loss"] = vf.vf_loss.detach();
  r.metrics["critic/vf_clipfrac"] = vf.vf_clipfrac.detach();
  r.metrics["critic/vpred_mean"] = vpred_mean;
  return r;
}

}  // namespace

Result<Metrics> DataParallelPPOCritic::update_critic_impl(const proto::DataProto& data) {
  TESSERA_RETURN_IF_ERROR(check_text_only(data));
  if (data.size() == 0) return make_error(ErrorCode::invalid_argument, "update_critic: empty batch");
  TESSERA_ASSIGN_OR_RETURN(auto selected, select_update_inputs(data, {"values", "returns"}));
  // Note [Ulysses sequence parallelism]: the group's rows.
  if (sequence_parallel_) {
    TESSERA_ASSIGN_OR_RETURN(selected, sequence_parallel_->gather_rows(selected));
  }
  UpdateSchedule schedule = update_schedule("critic", config_);
  schedule.sequence_parallel = sequence_parallel_;
  return run_ppo_update(*module_, selected, schedule, sync_,
                        [&](const proto::DataProto& mb, const SequenceBatch& seq, const ResponseHead& head) {
                          return value_micro_loss(config_, mb, seq, head);
                        });
}

}  // namespace tessera::ppo
