// ppo_trainer.hpp: verl's RayPPOTrainer (verl/trainer/ppo/ray_trainer.py, v0.5.0) over Tessera's
// runtime and WorkerGroups: worker placement, fit() in verl's step order, validation,
// checkpoint/resume.
//
// Placement (reference/verl-fsdp.md §7.1): one resource pool over trainer.nnodes x
// trainer.n_gpus_per_node devices (embedded "cpu:N" / "cuda:0-N" by default, or the agents of
// cluster.agents), one colocated worker actor per rank hosting the roles verl maps to the global
// pool: "actor_rollout" (always), "critic" (adv_estimator gae), "ref" (use_kl_in_reward or
// actor.use_kl_loss), "rm" (reward_model.enable). Each role's WorkerGroup is a role view of the
// colocated group. init_model order: critic, ref, rm, actor_rollout last (verl).
//
// fit() (§7.2), per batch of data.train_batch_size prompts (data.gen_batch_size, the loader's):
//   pop generation keys -> repeat n (interleave) -> gen (+gen_max for remax) -> uid ->
//   repeat + union -> response_mask -> balance_batch -> reward (rm scores, then the rule reward
//   manager) -> old_log_prob (actor/entropy; skipped on-policy, Note [On-policy old log-probs]
//   in workers/ppo/dp_actor.hpp) -> ref -> values -> adv (KL in reward, then
//   compute_advantage) -> update_critic -> update_actor (after critic_warmup) -> validation every
//   test_freq -> checkpoint every save_freq -> metrics, loggers, progress bar.
// Rollout uids are deterministic ("<global_step>-<row>") instead of verl's uuid4: they only
// group samples, and determinism makes resumed runs comparable.
// With algorithm.filter_groups (DAPO's dynamic sampling) the data loader yields batches of
// data.gen_batch_size prompts, each scored right after generation; prompts whose n samples all
// have the same metric value are dropped, and generation goes on (into the next epoch if need
// be) until data.train_batch_size prompts are kept, then the step trains on them as above
// (balance_batch after the filter). train/num_gen_batches counts the batches a step took.
//
// Checkpoints follow verl's layout through CheckpointManager; the driver state (trainer_state.json)
// records global_step and the KL controller's coefficient, data.json the dataloader position. On
// resume the workers' checkpoints and the dataloader position are restored; an adaptive KL
// coefficient restarts from algorithm.kl_ctrl.kl_coef, as in verl v0.5.0.
//
// Thread contract: one driver thread owns a trainer.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "dispatch/worker_group.hpp"
#include "driver/data.hpp"
#include "driver/metrics.hpp"
#include "proto/data_proto.hpp"
#include "proto/status.hpp"
#include "runtime/runtime.hpp"
#include "runtime/worker.hpp"

namespace tessera::driver {

/// Knobs of a trainer run that are not part of verl's config.
struct PpoTrainerOptions {
  std::FILE* console = stdout;   ///< Console logger output (null: no console logging).
  std::FILE* progress = stderr;  ///< Progress bar output (null: no bar).
  /// Called after each completed step (after its checkpoint): tests stop or kill here.
  std::function<Status(int64_t global_step, const Metrics& metrics)> after_step;
};

/// verl's RayPPOTrainer. See the header comment.
class RayPPOTrainer {
 public:
  /// Validates `cfg` (validate_ppo_config), loads the tokenizer and datasets, starts the runtime
  /// (embedded, or cluster.agents) and spawns the worker groups; init_workers() builds the models.
  /// REQUIRES: `registry` holds the worker types and outlives the trainer.
  static Result<std::unique_ptr<RayPPOTrainer>> create(nlohmann::json cfg, const runtime::WorkerTypeRegistry& registry,
                                                       PpoTrainerOptions options = {});
  ~RayPPOTrainer();

  /// init_model on every group, critic / ref / rm first and actor_rollout last (verl).
  Status init_workers();

  /// verl's fit(): resume, optional validation before training, then the training loop.
  Status fit();

  /// One step of fit()'s loop, driven from outside (the REPL): the first call resumes like fit()
  /// (without the validation before training); each call takes the next batch (rolling over
  /// epochs), trains, logs and returns the step's metrics. nullopt once trainer.total_epochs or
  /// total_training_steps are done, or when dynamic sampling runs out of data. A failed step
  /// leaves global_steps() unchanged.
  Result<std::optional<Metrics>> step();
  /// verl's _save_checkpoint at the current global step (workers' shards, dataloader position,
  /// driver state, then the atomic latest marker).
  Status save_checkpoint();
  /// The role views in use, by verl role name ("actor_rollout", "critic", "ref", "rm").
  std::vector<std::pair<std::string, dispatch::WorkerGroup*>> worker_groups() const;
  /// The tokenizer the datasets use (data.tokenizer, else actor_rollout_ref.model.path).
  const tokenizer::Tokenizer& tokenizer() const;
  /// The training dataset (data.train_files) the dataloader draws from.
  const RLHFDataset& train_dataset() const;
  /// verl's _validate(): val-core/... and val-aux/... metrics over the whole validation set.
  Result<Metrics> validate();

  /// Metrics of every logged step (validation before training is step 0 when enabled).
  const std::vector<std::pair<int64_t, Metrics>>& history() const { return history_; }
  int64_t global_steps() const { return global_steps_; }
  int64_t total_training_steps() const { return total_training_steps_; }
  const nlohmann::json& config() const { return cfg_; }

  /// The role views (null when the role is not used).
  dispatch::WorkerGroup* actor_rollout_wg() const { return actor_rollout_wg_.get(); }
  dispatch::WorkerGroup* critic_wg() const { return critic_wg_.get(); }
  /// The split-placement rollout group (null when the rollout is colocated with the actor).
  dispatch::WorkerGroup* rollout_wg() const { return rollout_wg_.get(); }

  struct State;  ///< Datasets, loaders, reward managers, KL controller (ppo_trainer.cpp).

 private:
  RayPPOTrainer() = default;
  Status start_workers(const runtime::WorkerTypeRegistry& registry);
  // One step from the batch of `indices`; nullopt when dynamic sampling (algorithm.filter_groups)
  // ran out of data before the batch was full (verl ends the run there, untrained).
  Result<std::optional<Metrics>> train_step(const std::vector<int64_t>& indices, bool is_last_step);
  // The next batch of prompt indices, into the next epoch at an epoch's end; nullopt after the
  // last epoch (trainer.total_epochs).
  Result<std::optional<std::vector<int64_t>>> next_training_batch();
  // Collates `indices`, generates (gen, gen_max for remax), sets uids and unions the rollout
  // into the repeated batch with its response_mask. `gen_index` > 0 (dynamic sampling's further
  // generation batches) keeps the uids apart.
  Result<proto::DataProto> rollout_batch(const std::vector<int64_t>& indices, int64_t gen_index, Metrics& metrics,
                                         TimingRaw& timing);
  // DAPO's dynamic sampling (verl's recipe/dapo): scores `first`, keeps the prompts whose samples
  // differ in algorithm.filter_groups.metric, and generates further batches until
  // data.train_batch_size prompts are kept; their first train_batch_size x n rows, scored.
  Result<std::optional<proto::DataProto>> dynamic_sampling(proto::DataProto first, Metrics& metrics, TimingRaw& timing);
  // The reward model's rm_scores unioned into `batch` (nothing without reward_model.enable).
  Status add_rm_scores(proto::DataProto& batch, Metrics& metrics, TimingRaw& timing);
  Status fit_loop();  // fit() less the loggers' finish
  Status load_checkpoint();
  Status log_step(int64_t step, const Metrics& metrics);
  void announce() const;  // the start-up summary on the console stream
  Status start_split_rollout(int64_t nnodes, int64_t per_node, int64_t split);
  // generate_sequences on the generating group (colocated: the actor's; split: the rollout group's,
  // after syncing changed weights). Worker metrics go to `metrics` / `timing`.
  Result<proto::DataProto> generate(const proto::DataProto& batch, Metrics& metrics, TimingRaw& timing);
  Status sync_rollout_weights(TimingRaw& timing);
  dispatch::WorkerGroup& generation_wg() const { return rollout_wg_ ? *rollout_wg_ : *actor_rollout_wg_; }

  nlohmann::json cfg_;
  PpoTrainerOptions options_;
  std::unique_ptr<State> state_;
  std::unique_ptr<runtime::Runtime> runtime_;
  std::shared_ptr<dispatch::WorkerGroup> colocated_;
  std::shared_ptr<dispatch::WorkerGroup> actor_rollout_wg_, critic_wg_, ref_wg_, rm_wg_;
  std::shared_ptr<dispatch::WorkerGroup> rollout_pool_, rollout_wg_;  // split placement only
  int64_t weights_version_ = 0;   // bumped whenever the actor's weights change
  int64_t synced_version_ = -1;   // the version the split rollout holds
  int64_t global_steps_ = 0;
  bool stepping_ = false;  // step() resumed already
  int64_t total_training_steps_ = 0;
  std::vector<std::pair<int64_t, Metrics>> history_;
};


// ---- The driver-side steps (ppo_trainer_steps.cpp), exposed for tests ---------------------------

/// verl's get_seqlen_balanced_partitions(equal_size=True): Karmarkar-Karp split of the rows into
/// k partitions of equal size with balanced sums of `seqlens`; each partition sorted ascending.
/// REQUIRES: k >= 1 and seqlens.size() divisible by k (error otherwise, naming both).
Result<std::vector<std::vector<int64_t>>> balanced_equal_partitions(const std::vector<int64_t>& seqlens, int64_t k);

/// verl's _balance_batch: reorders `batch` so that dp rank i gets partition i of the attention-
/// mask lengths; adds global_seqlen/{min,max,minmax_diff,balanced_min,balanced_max,mean}.
Status balance_batch(proto::DataProto& batch, int64_t world_size, Metrics& metrics);

/// verl's apply_kl_penalty: token_level_rewards = token_level_scores - beta * kl(old, ref) *
/// response_mask; returns the batch-mean KL (actor/reward_kl_penalty) for the controller update.
Result<double> apply_kl_penalty(proto::DataProto& batch, double beta, const std::string& kl_penalty);

/// verl's compute_advantage: the registered estimator `adv_estimator` (algos) over
/// token_level_rewards, response_mask, values (gae), uid (group estimators) and
/// reward_baselines (remax); sets advantages and returns.
Status compute_advantage(proto::DataProto& batch, const std::string& adv_estimator, double gamma, double lam,
                         bool norm_adv_by_std_in_grpo);

/// verl's compute_pf_ppo_reweight_data (algorithm.use_pf_ppo): resamples the batch's rows with
/// replacement (torch.multinomial on the default generator), with weights from each row's summed
/// token_level_scores: `pow` |score|^weight_pow, `max_min` 1 at the batch's max and min score and
/// 0 elsewhere, `max_random` 0.4 at the max and 0.1 elsewhere (all + 1e-8). meta_info lists of
/// one value per row are resampled too. Errors name an unknown method.
Status pf_ppo_reweight(proto::DataProto& batch, const std::string& reweight_method, double weight_pow);

/// verl's compute_response_mask: attention_mask[:, -R:] with R = responses.size(1).
Result<at::Tensor> compute_response_mask(const proto::DataProto& batch);

}  // namespace tessera::driver
