// ppo_state.hpp (private to driver/): what RayPPOTrainer holds besides its worker groups, read
// once from the config (ppo_trainer_state.cpp).
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "driver/checkpoint_manager.hpp"
#include "driver/data.hpp"
#include "driver/logger.hpp"
#include "driver/ppo_trainer.hpp"
#include "driver/profiler.hpp"
#include "driver/python_sampler.hpp"
#include "driver/reward.hpp"
#include "workers/algos/kl.hpp"
#include "workers/tokenizer/tokenizer.hpp"

namespace tessera::driver {

struct RayPPOTrainer::State {
  /// The next batch's row indices from the sampler or the dataloader; nullopt at an epoch's end.
  Result<std::optional<std::vector<int64_t>>> next_batch() {
    if (sampler) return sampler->next();
    return train_loader->next();
  }
  /// The epoch the next batch comes from, and the batches per epoch.
  int64_t epoch() const { return sampler ? sampler->epoch() : train_loader->epoch(); }
  int64_t batches_per_epoch() const { return sampler ? sampler->size() : train_loader->size(); }

  std::optional<tokenizer::Tokenizer> tokenizer;
  std::optional<RLHFDataset> train_dataset;
  std::optional<RLHFDataset> val_dataset;  ///< Unset when data.val_files is null / empty.
  std::optional<StatefulDataLoader> train_loader;
  /// data.sampler.class_path: the user's sampler picks the batches instead of train_loader.
  std::unique_ptr<PythonSampler> sampler;
  std::unique_ptr<NaiveRewardManager> reward_fn;
  std::unique_ptr<NaiveRewardManager> val_reward_fn;
  std::unique_ptr<algos::KLController> kl_ctrl;  ///< Only with algorithm.use_kl_in_reward.
  std::optional<Tracking> tracking;
  std::optional<CheckpointManager> ckpt;
  std::unique_ptr<ProgressBar> bar;
  std::unique_ptr<StepProfiler> profiler;  ///< trainer.profile_steps; null when none are listed.

  bool use_critic = false, use_ref = false, use_rm = false, use_kl_in_reward = false;
  /// verl's ref_in_actor: with actor_rollout_ref.model.lora_rank > 0 the reference policy is the
  /// actor with its adapters disabled; compute_ref_log_prob goes to the actor group, and no
  /// reference group is spawned.
  bool ref_in_actor = false;
  bool balance = true, norm_adv_by_std_in_grpo = true;
  bool multi_turn = false;  ///< actor_rollout_ref.rollout.multi_turn.enable (the update's meta_info).
  /// reward_model.launch_reward_fn_async: the reward function scores while the log-prob, reference
  /// and value passes run, and is waited for before the advantages (verl's Ray task).
  bool reward_async = false;
  /// trainer.skip_on_policy_old_log_prob, where it applies (no KL in the reward, no curriculum
  /// sampler, actor.ppo_epochs 1, ppo_mini_batch_size == data.train_batch_size): a step whose batch
  /// holds train_batch_rows rows
  /// skips the old_log_prob pass (Note [On-policy old log-probs] in workers/ppo/dp_actor.hpp).
  bool skip_old_log_prob = false;
  int64_t train_batch_rows = 0;  ///< data.train_batch_size x rollout.n.
  int64_t train_batch_size = 0;  ///< data.train_batch_size (prompts).
  /// algorithm.filter_groups (DAPO's dynamic sampling): enable, metric (a reward extra-info
  /// column, or seq_reward / seq_final_reward), max_num_gen_batches (<= 0: no limit).
  bool filter_groups = false;
  std::string filter_metric;
  int64_t max_num_gen_batches = 0;
  int64_t seed = 1, n = 1, total_training_steps = 0, critic_warmup = 0, test_freq = -1, save_freq = -1;
  int64_t world_size = 1;
  std::string adv_estimator, kl_penalty, loss_agg_mode;
  double gamma = 1.0, lam = 1.0, temperature = 1.0;
  int64_t val_n = 1;
  bool val_do_sample = false;
  std::string rollout_data_dir, validation_data_dir;  ///< Empty: no dumps (generations.hpp).
  int64_t log_val_generations = 0;
  bool use_pf_ppo = false;  ///< algorithm.use_pf_ppo, with pf_ppo.{reweight_method, weight_pow}.
  std::string pf_reweight_method = "pow";
  double pf_weight_pow = 2.0;
  std::vector<std::string> reward_extra_keys;  ///< Columns the last add_scores set.
  int64_t eos_token_id = 0, pad_token_id = 0;
};

/// Tokenizer, datasets, dataloader, reward managers, KL controller, loggers and checkpoint
/// manager from a validated PPO config. `console` null leaves the console logger out.
Result<std::unique_ptr<RayPPOTrainer::State>> make_ppo_state(const nlohmann::json& cfg, std::FILE* console);

}  // namespace tessera::driver
