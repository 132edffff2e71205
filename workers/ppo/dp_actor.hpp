// dp_actor.hpp: verl's DataParallelPPOActor (verl/workers/actor/dp_actor.py, v0.5.0) and the
// narrow module seam it trains through.
//
// The actor is plain code: it slices a DataProto into mini- and micro-batches, runs the policy
// forward through a TrainableModule, computes verl's PPO policy loss (algos registry), and asks the
// module to backpropagate and step. It knows nothing about sharding: the FSDP engine implements
// TrainableModule (gathering parameters in forward, reduce-scattering in backward, taking the
// global norm in clip_and_step), and LocalTrainableModule below implements it over one
// models::PretrainedModel in one process (tests, single-device runs).
//
// Semantics follow reference/verl-fsdp.md §4 (v0.5.0):
//  * compute_log_prob reads temperature / micro_batch_size / use_dynamic_bsz / max_token_len
//    from meta_info, runs in eval mode without autograd, and returns the log-probabilities (and
//    optionally entropies) of the response tokens: logits at positions [T-R-1, T-1) divided by the
//    temperature, log_softmax, gathered at `responses`. Dynamic batching restores the row order.
//  * update_policy splits the batch into ppo_mini_batch_size mini-batches IN ORDER (verl v0.5.0
//    does not shuffle; `shuffle` is accepted and unused, as there), for ppo_epochs passes. Each
//    mini-batch is one optimizer step over micro-batches whose losses are scaled by
//    1 / gradient_accumulation (fixed) or rows / ppo_mini_batch_size (dynamic), like verl. So with
//    token-mean aggregation the gradient depends on how tokens fall into micro-batches, exactly as
//    in verl v0.5.0 (verl main normalises by global token counts instead).
//  * Loss = pg_loss - entropy_coeff * agg(entropy) + kl_loss_coef * agg(kl_penalty(logp, ref)).
//    A non-finite gradient norm skips the step (gradients zeroed); the norm is still reported.
//
// Note [On-policy old log-probs]
// An update of one mini-batch and one epoch is on-policy: its single forward runs on the weights
// that old_log_probs would be computed with, so verl's dp_actor (after v0.5.0) takes
// old_log_prob = log_prob.detach() there (the ratio is exactly 1; the gradient is that of the
// recomputed path, without its recompute noise). Given a batch without old_log_probs, Tessera's
// actor does the same, and the trainer skips the old_log_prob pass over the whole batch (a
// forward of every token, which verl still runs: verl issue #3996) under
// trainer.skip_on_policy_old_log_prob. The entropy that pass reported is then computed by the
// update (actor/entropy, one value per micro-batch, as with entropy_coeff != 0). A batch with
// old_log_probs is trained as in v0.5.0; one without them whose update is not on-policy is an
// error naming actor.ppo_epochs and ppo_mini_batch_size.
//
// Thread contract: one thread drives one actor and its module; the actor holds no other state
// across calls (the optimizer state lives in the module).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "proto/data_proto.hpp"
#include "proto/status.hpp"
#include "workers/algos/policy_loss.hpp"
#include "workers/models/model.hpp"
#include "workers/ppo/ppo_batching.hpp"
#include "workers/ppo/packing.hpp"
#include "workers/ppo/ppo_inputs.hpp"

namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace tessera::ppo {

// ---- The module seam --------------------------------------------------------------------------

/// Whether a forward pass will be followed by backward().
enum class ForwardMode : uint8_t { train, eval };

/// What one clip_and_step() did.
struct StepOutcome {
  double grad_norm = 0.0;  ///< Global gradient norm before clipping (verl's */grad_norm).
  bool skipped = false;    ///< The norm was non-finite: no update, gradients zeroed.
};

/// The engine that owns a model's parameters and optimizer: what DataParallelPPOActor and
/// DataParallelPPOCritic need, and nothing more. Implemented by LocalTrainableModule (one process)
/// and by the FSDP engine's adapter (sharded parameters, collective backward and step).
/// Calls come from one thread, in the order forward -> (backward | end_forward) ...
/// -> clip_and_step; under FSDP every rank makes the same sequence of calls.
class TrainableModule {
 public:
  virtual ~TrainableModule() = default;

  /// The head's output for a left-padded batch [B, T] at `rows` (models::HeadRows; all by
  /// default): logits [B, L, V] for a policy, values [B, L] for a critic, in the model's compute
  /// dtype (bf16 under mixed precision; callers cast what they reduce). With ForwardMode::train
  /// the graph is kept for backward(); with eval the module is in eval mode and the caller holds a
  /// torch::NoGradGuard.
  virtual Result<at::Tensor> forward(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                     const at::Tensor& position_ids, ForwardMode mode,
                                     models::HeadRows rows = models::HeadRows::all()) = 0;

  /// The head's output for a padding-free micro-batch (packing.hpp) at batch.head_index: logits
  /// [n, V] or values [n], in the compute dtype. Same mode contract as forward().
  virtual Result<at::Tensor> forward_packed(const PackedBatch& batch, ForwardMode mode) = 0;

  /// Backpropagates `loss` (a 0-dim tensor from the last train-mode forward); gradients
  /// accumulate until clip_and_step() or zero_grad().
  virtual Status backward(const at::Tensor& loss) = 0;

  /// Abandons a train-mode forward that will not get a backward() (an error path).
  virtual Status end_forward() = 0;

  /// Computes the global gradient norm. Non-finite: zeroes the gradients and skips the update.
  /// Otherwise clips to `max_norm` (torch's clip_grad_norm_ formula) and takes one optimizer
  /// step. Errors: no optimizer (a reference policy), engine failures.
  // REQUIRES: max_norm > 0.
  virtual Result<StepOutcome> clip_and_step(double max_norm) = 0;

  /// Drops accumulated gradients.
  virtual void zero_grad() = 0;

  /// The learning rate the next step uses (verl's actor/lr, critic/lr).
  virtual double lr() const = 0;

  /// The wrapped model's config (its vocabulary bounds the token ids a policy is fed).
  virtual const models::ModelConfig& model_config() const = 0;
};

/// The policy the actor trains: a TrainableModule whose forward returns logits.
using PolicyModule = TrainableModule;

/// Optimizer of a LocalTrainableModule: torch AdamW (verl's) or plain SGD, constant lr.
struct LocalOptimizerOptions {
  std::string optimizer = "adamw";  ///< "adamw" | "sgd".
  double lr = 1e-6;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;  ///< AdamW: decoupled decay; SGD: L2 penalty.
};

/// A TrainableModule over one in-process models::PretrainedModel (CausalLM or ValueModel) and a
/// torch optimizer over all its parameters.
class LocalTrainableModule final : public TrainableModule {
 public:
  /// A trainable module. `optimizer` nullopt gives a frozen one (a reference policy) whose
  /// clip_and_step() fails. Errors: null model, unknown optimizer name, lr < 0.
  static Result<std::shared_ptr<LocalTrainableModule>> create(std::shared_ptr<models::PretrainedModel> model,
                                                              std::optional<LocalOptimizerOptions> optimizer);
  ~LocalTrainableModule() override;

  Result<at::Tensor> forward(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                             const at::Tensor& position_ids, ForwardMode mode,
                             models::HeadRows rows = models::HeadRows::all()) override;
  Result<at::Tensor> forward_packed(const PackedBatch& batch, ForwardMode mode) override;
  Status backward(const at::Tensor& loss) override;
  Status end_forward() override { return Status(); }
  Result<StepOutcome> clip_and_step(double max_norm) override;
  void zero_grad() override;
  double lr() const override;
  const models::ModelConfig& model_config() const override { return model_->config(); }

  models::PretrainedModel& model() const { return *model_; }

 private:
  LocalTrainableModule(std::shared_ptr<models::PretrainedModel> model, std::unique_ptr<torch::optim::Optimizer> optim,
                       double lr);
  std::shared_ptr<models::PretrainedModel> model_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;  // null when frozen
  double lr_ = 0.0;
};

// ---- Actor config ---------------------------------------------------------------------------

/// `actor.policy_loss` (verl's PolicyLossConfig).
struct ActorPolicyLossConfig {
  std::string loss_mode = "vanilla";  ///< A name in algos' policy-loss registry.
  double clip_cov_ratio = 0.0002;
  double clip_cov_lb = 1.0;
  double clip_cov_ub = 5.0;
  double kl_cov_ratio = 0.0002;
  double ppo_kl_coef = 0.1;
};

/// `actor_rollout_ref.actor` keys the actor uses, with verl v0.5.0 defaults. Batch sizes are in
/// samples per dp rank once normalize_actor_config() has run (in prompts before).
struct ActorConfig {
  std::string strategy = "fsdp";  ///< "fsdp" | "fsdp2" (one engine here; both accepted).
  int64_t ppo_mini_batch_size = 256;
  std::optional<int64_t> ppo_micro_batch_size;  ///< Deprecated global form of *_per_gpu.
  std::optional<int64_t> ppo_micro_batch_size_per_gpu;
  bool use_dynamic_bsz = false;
  int64_t ppo_max_token_len_per_gpu = 16384;
  int64_t ppo_epochs = 1;
  bool shuffle = false;  ///< Accepted and unused, as in verl v0.5.0's update_policy.
  double clip_ratio = 0.2;
  std::optional<double> clip_ratio_low;   ///< Defaults to clip_ratio.
  std::optional<double> clip_ratio_high;  ///< Defaults to clip_ratio.
  double clip_ratio_c = 3.0;
  ActorPolicyLossConfig policy_loss;
  std::string loss_agg_mode = "token-mean";
  double entropy_coeff = 0.0;
  bool calculate_entropy = false;  ///< verl main: compute (and report) entropy even at coeff 0.
  bool use_kl_loss = false;
  /// actor_rollout_ref.model.use_remove_padding (set by the worker role): padding-free forwards
  /// (packing.hpp); same maths, no work on padding.
  bool use_remove_padding = false;
  double kl_loss_coef = 0.001;
  std::string kl_loss_type = "low_var_kl";
  double grad_clip = 1.0;
  int64_t ulysses_sequence_parallel_size = 1;  ///< Only 1 is implemented.

  /// The algos-side view of the clip ratios and policy_loss.* knobs.
  algos::PolicyLossConfig policy_loss_config() const;
};

/// Parses an `actor` mapping with verl's keys; `path` (e.g. "actor_rollout_ref.actor") prefixes
/// errors. Unknown keys are errors naming the key. Keys owned by other components (optim,
/// fsdp_config, checkpoint, profiler) and performance-only switches (use_torch_compile,
/// use_fused_kernels, use_remove_padding, entropy_from_logits_with_chunking,
/// entropy_checkpointing, _target_) are accepted and not read here. The result is validated
/// (validate_actor_config).
Result<ActorConfig> parse_actor_config(const nlohmann::json& json, const std::string& path);

/// Checks values: positive sizes and epochs, grad_clip > 0, loss_agg_mode in algos'
/// agg_loss_modes(), a registered loss_mode, kl_loss_type in algos' kl_penalty_types(), SP == 1.
/// Errors name `path`.key and the value.
Status validate_actor_config(const ActorConfig& config, const std::string& path);

/// verl's per-worker batch-size normalisation (verl-fsdp.md §3.4): ppo_mini_batch_size becomes
/// mini x rollout_n / dp; a deprecated ppo_micro_batch_size becomes ppo_micro_batch_size_per_gpu
/// (dp division); without use_dynamic_bsz, ppo_micro_batch_size_per_gpu must be set and divide the
/// normalised mini-batch. Errors name the keys and values (see ppo_batching.hpp).
Result<ActorConfig> normalize_actor_config(ActorConfig config, int64_t rollout_n, const DataParallelShape& shape);

// ---- The actor --------------------------------------------------------------------------------

/// compute_log_prob's result, over the response tokens [B, R].
struct LogProbOutput {
  at::Tensor log_probs;  ///< verl's old_log_probs (or ref_log_prob when run by the reference).
  at::Tensor entropys;   ///< Defined only when calculate_entropy was requested.
};

/// verl's DataParallelPPOActor.
class DataParallelPPOActor {
 public:
  /// `config` must be normalised (per-rank sizes). `sync` agrees dynamic micro-batch counts across
  /// dp ranks (empty: one rank). With config.ulysses_sequence_parallel_size > 1, `sequence_parallel`
  /// is this rank's group of that size (Note [Ulysses sequence parallelism]): every pass gathers
  /// the group's rows and returns this rank's. Errors: invalid config (validate_actor_config),
  /// fixed batching without ppo_micro_batch_size_per_gpu or one that does not divide the
  /// mini-batch, null module, a sequence-parallel size without a group of that size or without
  /// use_remove_padding.
  static Result<std::unique_ptr<DataParallelPPOActor>> create(ActorConfig config, std::shared_ptr<PolicyModule> module,
                                                              MicroBatchCountSync sync = {},
                                                              std::shared_ptr<const UlyssesGroup> sequence_parallel = nullptr);

  /// Log-probs (and entropies) of `responses` under the current policy, in eval mode, no grad.
  /// Reads keys responses, input_ids, attention_mask, position_ids and meta_info temperature,
  /// use_dynamic_bsz, then micro_batch_size (fixed) or max_token_len (dynamic). Errors name the
  /// missing or malformed key.
  Result<LogProbOutput> compute_log_prob(const proto::DataProto& data, bool calculate_entropy);

  /// One PPO update over `data` (verl's update_policy). Reads keys responses, input_ids,
  /// attention_mask, position_ids, old_log_probs (optional on-policy: Note [On-policy old
  /// log-probs]), advantages, response_mask (else attention_mask[:, -R:]), ref_log_prob (with
  /// use_kl_loss), and meta_info.temperature.
  /// Returns verl's metric lists: actor/pg_loss, actor/pg_clipfrac, actor/ppo_kl,
  /// actor/pg_clipfrac_lower (per micro-batch), actor/entropy (when computed), actor/kl_loss and
  /// actor/kl_coef (with use_kl_loss), actor/grad_norm (per mini-batch), actor/lr (once).
  Result<Metrics> update_policy(const proto::DataProto& data);

  const ActorConfig& config() const { return config_; }
  PolicyModule& module() const { return *module_; }

 private:
  DataParallelPPOActor(ActorConfig config, std::shared_ptr<PolicyModule> module, MicroBatchCountSync sync,
                       algos::PolicyLossFn loss_fn, std::shared_ptr<const UlyssesGroup> sequence_parallel);
  Result<LogProbOutput> compute_log_prob_impl(const proto::DataProto& data, bool calculate_entropy);
  Result<Metrics> update_policy_impl(const proto::DataProto& data);

  ActorConfig config_;
  std::shared_ptr<PolicyModule> module_;
  MicroBatchCountSync sync_;
  algos::PolicyLossFn loss_fn_;
  std::shared_ptr<const UlyssesGroup> sequence_parallel_;
};

/// A forward's head output at the response positions: [B, R, ...] from a padded forward, or
/// [n, ...] at the packed head positions (use_remove_padding).
struct ResponseHead {
  at::Tensor head;
  std::optional<PackedBatch> packed;
  /// A [B, R, ...] response tensor lined up with `head`'s leading dimension(s).
  at::Tensor align(const at::Tensor& per_response) const {
    return packed ? select_responses(per_response, *packed) : per_response;
  }
  /// Results lined up with `head` back on the [B, R, ...] grid (0 where packing computed nothing).
  at::Tensor to_grid(const at::Tensor& values) const { return packed ? unpack_responses(values, *packed) : values; }
};

/// `module`'s head at the response positions of `seq`: a padded forward over response_rows, or,
/// with `remove_padding`, a packed one (pack_sequences; `host_mask`, when given, is seq's
/// attention mask already on the host, which saves a device read per micro-batch).
/// With `sequence_parallel` (REQUIRES remove_padding), this rank's slice of the packed row, and the
/// head's outputs are gathered over the group by to_grid (Note [Ulysses sequence parallelism]).
Result<ResponseHead> response_head(TrainableModule& module, const SequenceBatch& seq, ForwardMode mode,
                                   bool remove_padding, const at::Tensor& host_mask = at::Tensor(),
                                   std::shared_ptr<const UlyssesGroup> sequence_parallel = nullptr);

/// The response part of a forward pass (verl's _forward_micro_batch, padded path): log-probs of
/// `responses` under logits / `temperature`, and the entropy when `calculate_entropy`, in fp32
/// (algos::token_log_probs), on the [B, R] grid. `logits` are the policy's response head (any
/// floating dtype); `responses` [B, R]. Token ids are not range-checked here (the callers check
/// a whole batch at once).
Result<LogProbOutput> response_log_probs(const ResponseHead& logits, const at::Tensor& responses, double temperature,
                                         bool calculate_entropy);

}  // namespace tessera::ppo
