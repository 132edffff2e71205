// sft_trainer.hpp: verl's FSDPSFTTrainer (verl/trainer/fsdp_sft_trainer.py, v0.5.0) as a driver
// loop over the "sft" worker group (workers/roles/sft_worker.hpp).
//
// create() validates the config (validate_sft_config), loads the tokenizer of
// model.partial_pretrain and the SFT datasets, starts the runtime (embedded or cluster.agents) and
// spawns one "sft" worker per rank (trainer.nnodes x trainer.n_gpus_per_node); init_model builds
// the FSDP model. fit() runs verl's loop: per step one train_batch of data.train_batch_size rows
// (metrics train/loss, train/lr, train/grad_norm); val/loss over the whole validation set every
// trainer.test_freq steps and at the last step; a checkpoint every trainer.save_freq steps and at
// the last step. Steps = len(dataloader) x total_epochs, or trainer.total_training_steps.
//
// Checkpoints use CheckpointManager's layout: global_step_N/actor holds the worker's sharded
// checkpoint and a complete HF model directory (actor/huggingface), global_step_N/data.json the
// dataloader position; trainer.resume_mode auto|resume_path|disable resumes from them.
// Validation pads its last batch to the world size with copies whose loss_mask is zeroed, so the
// loss is the exact token mean over the validation set.
//
// Thread contract: one driver thread owns a trainer.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "dispatch/worker_group.hpp"
#include "driver/metrics.hpp"
#include "proto/status.hpp"
#include "runtime/runtime.hpp"
#include "runtime/worker.hpp"

namespace tessera::driver {

class ProgressBar;

/// Knobs of an SFT run that are not part of verl's config.
struct SftTrainerOptions {
  std::FILE* console = stdout;   ///< Console logger output (null: none).
  std::FILE* progress = stderr;  ///< Progress bar output (null: none).
};

/// verl's FSDPSFTTrainer. See the header comment.
class FSDPSFTTrainer {
 public:
  /// REQUIRES: `registry` holds the "sft" worker type and outlives the trainer.
  static Result<std::unique_ptr<FSDPSFTTrainer>> create(nlohmann::json cfg, const runtime::WorkerTypeRegistry& registry,
                                                        SftTrainerOptions options = {});
  ~FSDPSFTTrainer();

  /// Resume (trainer.resume_mode), then train to the last step.
  Status fit();

  /// The token-mean loss over the validation set (verl's val/loss).
  Result<double> validate();

  /// The HF model directory of the newest checkpoint this run saved (nullopt before any save).
  const std::optional<std::filesystem::path>& last_hf_dir() const { return last_hf_dir_; }
  const std::vector<std::pair<int64_t, Metrics>>& history() const { return history_; }
  int64_t global_step() const { return global_step_; }
  int64_t total_training_steps() const { return total_training_steps_; }

  struct State;  ///< Datasets, loader, loggers, checkpoint manager (sft_trainer.cpp).

 private:
  FSDPSFTTrainer() = default;
  Status save_checkpoint();
  Status load_checkpoint();
  Status fit_loop();  // fit() less the loggers' finish
  Status log_step(int64_t step, const Metrics& metrics);
  void announce() const;  // the start-up summary on the console stream

  nlohmann::json cfg_;
  SftTrainerOptions options_;
  std::unique_ptr<State> state_;
  std::unique_ptr<runtime::Runtime> runtime_;
  std::shared_ptr<dispatch::WorkerGroup> wg_;
  std::unique_ptr<ProgressBar> bar_;  // during fit()
  int64_t global_step_ = 0;
  int64_t total_training_steps_ = 0;
  std::optional<std::filesystem::path> last_hf_dir_;
  std::vector<std::pair<int64_t, Metrics>> history_;
};

}  // namespace tessera::driver
