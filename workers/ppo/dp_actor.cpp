// dp_actor.cpp: LocalTrainableModule and DataParallelPPOActor (see dp_actor.hpp).
#include "workers/ppo/dp_actor.hpp"

#include <cmath>
#include <utility>

#include <torch/torch.h>

#include "workers/algos/kl.hpp"
#include "workers/algos/losses.hpp"
#include "workers/algos/torch_functional.hpp"
#include "workers/ppo/ppo_inputs.hpp"
#include "workers/ppo/ppo_update.hpp"
#include "workers/ppo/sequence_parallel.hpp"

namespace tessera::ppo {

// ---- LocalTrainableModule -----------------------------------------------------------------------

namespace {

Result<std::unique_ptr<torch::optim::Optimizer>> make_optimizer(const std::vector<at::Tensor>& params,
                                                                const LocalOptimizerOptions& o) {
  if (!(o.lr >= 0)) return make_error(ErrorCode::invalid_argument, "optim.lr = {} must be >= 0", o.lr);
  if (o.optimizer == "adamw") {
    auto opts = torch::optim::AdamWOptions(o.lr)
                    .betas(std::make_tuple(o.beta1, o.beta2))
                    .eps(o.eps)
                    .weight_decay(o.weight_decay);
    return std::unique_ptr<torch::optim::Optimizer>(std::make_unique<torch::optim::AdamW>(params, opts));
  }
  if (o.optimizer == "sgd") {
    auto opts = torch::optim::SGDOptions(o.lr).weight_decay(o.weight_decay);
    return std::unique_ptr<torch::optim::Optimizer>(std::make_unique<torch::optim::SGD>(params, opts));
  }
  return make_error(ErrorCode::invalid_argument, "optim.optimizer = '{}' is not one of: adamw, sgd", o.optimizer);
}

}  // namespace

LocalTrainableModule::LocalTrainableModule(std::shared_ptr<models::PretrainedModel> model,
                                           std::unique_ptr<torch::optim::Optimizer> optim, double lr)
    : model_(std::move(model)), optimizer_(std::move(optim)), lr_(lr) {}

LocalTrainableModule::~LocalTrainableModule() = default;

Result<std::shared_ptr<LocalTrainableModule>> LocalTrainableModule::create(
    std::shared_ptr<models::PretrainedModel> model, std::optional<LocalOptimizerOptions> optimizer) {
  if (!model) return make_error(ErrorCode::invalid_argument, "LocalTrainableModule: null model");
  std::unique_ptr<torch::optim::Optimizer> optim;
  double lr = 0.0;
  if (optimizer) {
    TESSERA_ASSIGN_OR_RETURN(optim, make_optimizer(model->parameters(), *optimizer));
    lr = optimizer->lr;
  }
  return std::shared_ptr<LocalTrainableModule>(new LocalTrainableModule(std::move(model), std::move(optim), lr));
}

Result<at::Tensor> LocalTrainableModule::forward(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                                 const at::Tensor& position_ids, ForwardMode mode, models::HeadRows rows) {
  try {
    model_->train(mode == ForwardMode::train);
    return model_->forward_head(input_ids, attention_mask, position_ids, rows);
  } catch (...) {
    return status_from_current_exception("LocalTrainableModule::forward");
  }
}

Result<at::Tensor> LocalTrainableModule::forward_packed(const PackedBatch& b, ForwardMode mode) {
  try {
    model_->train(mode == ForwardMode::train);
    return model_->forward_packed_head(b.input_ids, b.position_ids, b.segments, b.head_index);
  } catch (...) {
    return status_from_current_exception("LocalTrainableModule::forward_packed");
  }
}

Status LocalTrainableModule::backward(const at::Tensor& loss) {
  try {
    loss.backward();
    return Status();
  } catch (...) {
    return status_from_current_exception("LocalTrainableModule::backward");
  }
}

Result<StepOutcome> LocalTrainableModule::clip_and_step(double max_norm) {
  if (!optimizer_) {
    return make_error(ErrorCode::invalid_argument,
                      "LocalTrainableModule: no optimizer (a frozen reference module cannot be updated)");
  }
  try {
    StepOutcome out;
    out.grad_norm = torch::nn::utils::clip_grad_norm_(model_->parameters(), max_norm);
    if (!std::isfinite(out.grad_norm)) {  // verl: skip the update, drop the gradients
      out.skipped = true;
      zero_grad();
      return out;
    }
    optimizer_->step();
    return out;
  } catch (...) {
    return status_from_current_exception("LocalTrainableModule::clip_and_step");
  }
}

void LocalTrainableModule::zero_grad() {
  for (auto& p : model_->parameters()) p.mutable_grad() = at::Tensor();  // set_to_none, as torch 2.x
}

double LocalTrainableModule::lr() const { return optimizer_ ? lr_ : 0.0; }

// ---- Forward helpers ----------------------------------------------------------------------------

Result<ResponseHead> response_head(TrainableModule& module, const SequenceBatch& seq, ForwardMode mode,
                                   bool remove_padding, const at::Tensor& host_mask,
                                   std::shared_ptr<const UlyssesGroup> sequence_parallel) {
  ResponseHead h;
  if (sequence_parallel && !remove_padding) {
    return make_error(ErrorCode::internal, "response_head: sequence parallelism needs padding-free micro-batches");
  }
  if (!remove_padding) {
    TESSERA_ASSIGN_OR_RETURN(h.head, module.forward(seq.input_ids, seq.attention_mask, seq.position_ids, mode,
                                                    response_rows(seq)));
    return h;
  }
  TESSERA_ASSIGN_OR_RETURN(PackedBatch packed, pack_sequences(seq, host_mask, std::move(sequence_parallel)));
  TESSERA_ASSIGN_OR_RETURN(h.head, module.forward_packed(packed, mode));
  h.packed = std::move(packed);
  return h;
}

Result<LogProbOutput> response_log_probs(const ResponseHead& logits, const at::Tensor& responses, double temperature,
                                         bool calculate_entropy) {
  const at::Tensor& head = logits.head;
  const bool fits = logits.packed ? head.dim() == 2 && head.size(0) == logits.packed->head_index.size(0)
                                  : head.dim() == 3 && responses.dim() == 2 && head.size(0) == responses.size(0) &&
                                        head.size(1) == responses.size(1);
  if (!fits) {
    return make_error(ErrorCode::invalid_argument,
                      "response_log_probs: logits {}-D do not fit responses {}-D (padded [B, R, V] or packed [n, V])",
                      head.dim(), responses.dim());
  }
  if (!(temperature > 0)) {
    return make_error(ErrorCode::invalid_argument, "meta_info.temperature = {} must be > 0", temperature);
  }
  TESSERA_ASSIGN_OR_RETURN(auto t, algos::token_log_probs(head, logits.align(responses), temperature, calculate_entropy));
  LogProbOutput out;
  out.log_probs = logits.to_grid(t.log_probs);
  if (calculate_entropy) out.entropys = logits.to_grid(t.entropy);
  return out;
}

namespace {

Result<double> read_temperature(const proto::DataProto& data) {
  TESSERA_ASSIGN_OR_RETURN(double t, meta_number(data.meta_info(), "temperature"));
  if (!(t > 0)) return make_error(ErrorCode::invalid_argument, "meta_info.temperature = {} must be > 0", t);
  return t;
}

// The loss of one micro-batch and its metrics, from the policy's logits (verl's update_policy body).
// `on_policy`: old_log_probs are this forward's own (Note [On-policy old log-probs]).
Result<MicroLoss> micro_batch_loss(const ActorConfig& config, const algos::PolicyLossFn& loss_fn,
                                   const proto::DataProto& mb, const SequenceBatch& seq, const ResponseHead& logits,
                                   double temperature, bool on_policy) {
  const bool calculate_entropy = config.entropy_coeff != 0 || config.calculate_entropy || on_policy;
  TESSERA_ASSIGN_OR_RETURN(auto out, response_log_probs(logits, seq.responses, temperature, calculate_entropy));
  at::Tensor old_log_prob;
  if (on_policy) {
    old_log_prob = out.log_probs.detach();
  } else {
    TESSERA_ASSIGN_OR_RETURN(old_log_prob, mb.tensor("old_log_probs"));
  }
  TESSERA_ASSIGN_OR_RETURN(at::Tensor advantages, mb.tensor("advantages"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor mask, read_response_mask(mb, seq));
  const std::string& mode = config.loss_agg_mode;
  TESSERA_ASSIGN_OR_RETURN(auto pg, loss_fn(old_log_prob, out.log_probs, advantages, mask, mode,
                                            config.policy_loss_config()));
  MicroLoss r;
  at::Tensor policy_loss = pg.pg_loss;
  if (calculate_entropy) {
    TESSERA_ASSIGN_OR_RETURN(at::Tensor entropy, algos::agg_loss(out.entropys, mask, mode));
    if (config.entropy_coeff != 0) policy_loss = policy_loss - entropy * config.entropy_coeff;
    r.metrics["actor/entropy"] = entropy.detach();
  }
  if (config.use_kl_loss) {
    TESSERA_ASSIGN_OR_RETURN(at::Tensor ref_log_prob, mb.tensor("ref_log_prob"));
    TESSERA_ASSIGN_OR_RETURN(at::Tensor kld, algos::kl_penalty(out.log_probs, ref_log_prob, config.kl_loss_type));
    TESSERA_ASSIGN_OR_RETURN(at::Tensor kl_loss, algos::agg_loss(kld, mask, mode));
    policy_loss = policy_loss + kl_loss * config.kl_loss_coef;
    r.metrics["actor/kl_loss"] = kl_loss.detach();
    r.metrics["actor/kl_coef"] = at::scalar_tensor(config.kl_loss_coef, kl_loss.options().dtype(at::kDouble));
  }
  r.loss = policy_loss;
  r.metrics["actor/pg_loss"] = pg.pg_loss.detach();
  r.metrics["actor/pg_clipfrac"] = pg.pg_clipfrac.detach();
  r.metrics["actor/ppo_kl"] = pg.ppo_kl.detach();
  r.metrics["actor/pg_clipfrac_lower"] = pg.pg_clipfrac_lower.detach();
  return r;
}

}  // namespace

// ---- DataParallelPPOActor -----------------------------------------------------------------------

DataParallelPPOActor::DataParallelPPOActor(ActorConfig config, std::shared_ptr<PolicyModule> module,
                                           MicroBatchCountSync sync, algos::PolicyLossFn loss_fn,
                                           std::shared_ptr<const UlyssesGroup> sequence_parallel)
    : config_(std::move(config)),
      module_(std::move(module)),
      sync_(std::move(sync)),
      loss_fn_(std::move(loss_fn)),
      sequence_parallel_(std::move(sequence_parallel)) {}

Result<std::unique_ptr<DataParallelPPOActor>> DataParallelPPOActor::create(
    ActorConfig config, std::shared_ptr<PolicyModule> module, MicroBatchCountSync sync,
    std::shared_ptr<const UlyssesGroup> sequence_parallel) {
  if (!module) return make_error(ErrorCode::invalid_argument, "DataParallelPPOActor: null module");
  TESSERA_RETURN_IF_ERROR(validate_actor_config(config, "actor"));
  TESSERA_RETURN_IF_ERROR(check_sequence_parallel_group("actor", config.ulysses_sequence_parallel_size,
                                                        config.use_remove_padding, sequence_parallel.get()));
  if (config.ppo_micro_batch_size) {
    return make_error(ErrorCode::invalid_argument,
                      "DataParallelPPOActor: actor.ppo_micro_batch_size is set; run normalize_actor_config first");
  }
  TESSERA_RETURN_IF_ERROR(check_fixed_micro_batch("actor", config.ppo_mini_batch_size,
                                                  config.ppo_micro_batch_size_per_gpu, config.use_dynamic_bsz));
  TESSERA_ASSIGN_OR_RETURN(auto loss_fn, algos::get_policy_loss_fn(config.policy_loss.loss_mode));
  return std::unique_ptr<DataParallelPPOActor>(new DataParallelPPOActor(
      std::move(config), std::move(module), std::move(sync), std::move(loss_fn), std::move(sequence_parallel)));
}

Result<LogProbOutput> DataParallelPPOActor::compute_log_prob(const proto::DataProto& data, bool calculate_entropy) {
  return guarded_call("compute_log_prob", [&] { return compute_log_prob_impl(data, calculate_entropy); });
}

Result<LogProbOutput> DataParallelPPOActor::compute_log_prob_impl(const proto::DataProto& data,
                                                                   bool calculate_entropy) {
  TESSERA_RETURN_IF_ERROR(check_text_only(data));
  if (data.size() == 0) return make_error(ErrorCode::invalid_argument, "compute_log_prob: empty batch");
  TESSERA_ASSIGN_OR_RETURN(double temperature, read_temperature(data));
  TESSERA_ASSIGN_OR_RETURN(bool use_dynamic_bsz, meta_bool(data.meta_info(), "use_dynamic_bsz"));
  TESSERA_RETURN_IF_ERROR(read_sequence_batch(data).status());
  TESSERA_ASSIGN_OR_RETURN(auto selected, data.select(kPpoForwardKeys, std::vector<std::string>{}));
  // Note [Ulysses sequence parallelism]: the group's rows, and a token budget for all of them.
  if (sequence_parallel_) {
    TESSERA_ASSIGN_OR_RETURN(selected, sequence_parallel_->gather_rows(selected));
  }
  const int64_t sp = sequence_parallel_ ? sequence_parallel_->size() : 1;
  MicroBatches micro;
  if (use_dynamic_bsz) {
    TESSERA_ASSIGN_OR_RETURN(int64_t max_token_len, meta_positive_int(data.meta_info(), "max_token_len"));
    TESSERA_ASSIGN_OR_RETURN(micro, rearrange_micro_batches(selected, max_token_len * sp,
                                                            sp > 1 ? "meta_info.max_token_len x the Ulysses group size"
                                                                   : "meta_info.max_token_len",
                                                            sync_));
  } else {
    TESSERA_ASSIGN_OR_RETURN(int64_t mbs, meta_positive_int(data.meta_info(), "micro_batch_size"));
    TESSERA_ASSIGN_OR_RETURN(micro, split_micro_batches(selected, mbs, "meta_info.micro_batch_size"));
  }
  TESSERA_ASSIGN_OR_RETURN(at::Tensor responses, selected.tensor("responses"));
  TESSERA_RETURN_IF_ERROR(
      algos::check_labels_in_vocab("compute_log_prob", "responses", responses, module_->model_config().vocab_size));
  TESSERA_ASSIGN_OR_RETURN(auto host_masks, micro_batch_host_masks(selected, micro, config_.use_remove_padding));
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> log_probs, entropys;
  for (size_t i = 0; i < micro.batches.size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(auto seq, read_sequence_batch(micro.batches[i]));
    TESSERA_ASSIGN_OR_RETURN(ResponseHead logits, response_head(*module_, seq, ForwardMode::eval,
                                                                config_.use_remove_padding, host_masks[i],
                                                                sequence_parallel_));
    TESSERA_ASSIGN_OR_RETURN(auto out, response_log_probs(logits, seq.responses, temperature, calculate_entropy));
    log_probs.push_back(out.log_probs);
    if (calculate_entropy) entropys.push_back(out.entropys);
  }
  LogProbOutput out;
  out.log_probs = at::cat(log_probs, 0);
  if (calculate_entropy) out.entropys = at::cat(entropys, 0);
  if (use_dynamic_bsz) {
    TESSERA_ASSIGN_OR_RETURN(out.log_probs, restore_dynamic_batch(out.log_probs, micro.indices));
    if (calculate_entropy) {
      TESSERA_ASSIGN_OR_RETURN(out.entropys, restore_dynamic_batch(out.entropys, micro.indices));
    }
  }
  if (sequence_parallel_) {  // this rank's rows
    out.log_probs = sequence_parallel_->local_rows(out.log_probs);
    if (calculate_entropy) out.entropys = sequence_parallel_->local_rows(out.entropys);
  }
  return out;
}

Result<Metrics> DataParallelPPOActor::update_policy(const proto::DataProto& data) {
  return guarded_update(*module_, "update_policy", [&] { return update_policy_impl(data); });
}

Result<Metrics> DataParallelPPOActor::update_policy_impl(const proto::DataProto& data) {
  TESSERA_RETURN_IF_ERROR(check_text_only(data));
  if (data.size() == 0) return make_error(ErrorCode::invalid_argument, "update_policy: empty batch");
  TESSERA_ASSIGN_OR_RETURN(double temperature, read_temperature(data));
  // Note [On-policy old log-probs]: a batch without them is trained on this forward's own.
  const bool on_policy = !data.batch().contains("old_log_probs");
  std::vector<std::string> response_keys = {"advantages"};
  if (!on_policy) response_keys.insert(response_keys.begin(), "old_log_probs");
  if (config_.use_kl_loss) response_keys.emplace_back("ref_log_prob");
  TESSERA_ASSIGN_OR_RETURN(auto selected, select_update_inputs(data, response_keys));
  // Note [Ulysses sequence parallelism]: the group's rows.
  if (sequence_parallel_) {
    TESSERA_ASSIGN_OR_RETURN(selected, sequence_parallel_->gather_rows(selected));
  }
  const int64_t mini_batches = (selected.size() + config_.ppo_mini_batch_size - 1) / config_.ppo_mini_batch_size;
  if (on_policy && (config_.ppo_epochs != 1 || mini_batches != 1)) {
    return make_error(ErrorCode::invalid_argument,
                      "update_policy: the batch has no old_log_probs and the update is not on-policy ({} mini-batches "
                      "of actor.ppo_mini_batch_size = {} rows per rank, actor.ppo_epochs = {}): run compute_log_prob "
                      "first",
                      mini_batches, config_.ppo_mini_batch_size, config_.ppo_epochs);
  }
  TESSERA_ASSIGN_OR_RETURN(at::Tensor responses, selected.tensor("responses"));
  TESSERA_RETURN_IF_ERROR(
      algos::check_labels_in_vocab("update_policy", "responses", responses, module_->model_config().vocab_size));
  UpdateSchedule schedule = update_schedule("actor", config_);
  schedule.sequence_parallel = sequence_parallel_;
  return run_ppo_update(*module_, selected, schedule, sync_,
                        [&](const proto::DataProto& mb, const SequenceBatch& seq, const ResponseHead& logits) {
                          return micro_batch_loss(config_, loss_fn_, mb, seq, logits, temperature, on_policy);
                        });
}

}  // namespace tessera::ppo
