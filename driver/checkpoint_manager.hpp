// checkpoint_manager.hpp: the driver's checkpoint bookkeeping in verl's layout
// (reference/verl-fsdp.md §3.7):
//   <default_local_dir>/global_step_N/actor/            worker saves (the trainer calls them)
//   <default_local_dir>/global_step_N/critic/
//   <default_local_dir>/global_step_N/data.json         dataloader state (verl: data.pt)
//   <default_local_dir>/global_step_N/trainer_state.json driver state; written LAST, so its
//                                                        presence marks a complete step dir
//   <default_local_dir>/latest_checkpointed_iteration.txt  "N", replaced atomically
// Protocol: begin_save(N) (clears a stale global_step_N left by a crash) -> workers save into
// actor_dir / critic_dir -> write_driver_state(N, ...) -> commit(N), which writes the marker
// through a temporary file + fsync + rename (so a crash leaves the previous marker intact) and
// then prunes: beyond max_actor_ckpt_to_keep complete steps the oldest actor/ dirs are removed
// (critic/ likewise with max_critic_ckpt_to_keep), and a step dir with neither left is removed
// whole. null or <= 0 keeps everything (verl). The just-committed step is never pruned.
// resolve_resume() implements trainer.resume_mode:
//   disable      start from scratch;
//   auto         the marker's step if the marker exists, else from scratch;
//   resume_path  trainer.resume_from_path, which must name a global_step_N directory
//                (relative paths are taken from the working directory, as verl).
// Errors name the path involved. Thread-safety: none (the driver thread owns it).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "proto/status.hpp"

namespace tessera::driver {

/// trainer.* checkpoint settings.
struct CheckpointOptions {
  std::filesystem::path default_local_dir;
  std::optional<int64_t> max_actor_ckpt_to_keep;
  std::optional<int64_t> max_critic_ckpt_to_keep;
  std::string resume_mode = "auto";  ///< auto | resume_path | disable
  std::optional<std::string> resume_from_path;

  /// From trainer.{default_local_dir,max_actor_ckpt_to_keep,max_critic_ckpt_to_keep,
  /// resume_mode,resume_from_path} (SFT configs: trainer.max_ckpt_to_keep for both).
  static Result<CheckpointOptions> from_config(const nlohmann::json& cfg);
};

/// Where training resumes from.
struct ResumePoint {
  int64_t global_step = 0;               ///< The completed step (training continues at +1).
  std::filesystem::path step_dir;        ///< .../global_step_N
  nlohmann::json dataloader_state;       ///< data.json (null when absent, as verl warns)
  nlohmann::json trainer_state;          ///< trainer_state.json
};

/// verl's checkpoint directory bookkeeping for the driver.
class CheckpointManager {
 public:
  explicit CheckpointManager(CheckpointOptions options) : options_(std::move(options)) {}

  /// <root>/global_step_N, and its actor/ and critic/ subdirectories.
  std::filesystem::path step_dir(int64_t step) const;
  std::filesystem::path actor_dir(int64_t step) const { return step_dir(step) / "actor"; }
  std::filesystem::path critic_dir(int64_t step) const { return step_dir(step) / "critic"; }
  /// <root>/latest_checkpointed_iteration.txt
  std::filesystem::path marker_path() const;

  /// Prepares global_step_N: removes a stale incomplete one (a step > the marker's, or without
  /// trainer_state.json) and creates it. Returns its path. Error if step < 1 or on I/O failure.
  Result<std::filesystem::path> begin_save(int64_t step);
  /// Writes data.json then trainer_state.json (each temp + fsync + rename) into global_step_N.
  Status write_driver_state(int64_t step, const nlohmann::json& dataloader_state,
                            const nlohmann::json& trainer_state);
  /// Points the marker at N (atomically), then prunes (see the header comment).
  /// REQUIRES: write_driver_state(N) succeeded (checked: trainer_state.json must exist).
  Status commit(int64_t step);

  /// The marker's step, or nullopt when there is no marker. corrupt_data names the file.
  Result<std::optional<int64_t>> latest_checkpointed_iteration() const;
  /// Completed steps present under the root (dirs named global_step_N with
  /// trainer_state.json, N <= the marker), ascending.
  Result<std::vector<int64_t>> complete_steps() const;
  /// trainer.resume_mode resolution (nullopt: start from scratch).
  Result<std::optional<ResumePoint>> resolve_resume() const;

  const CheckpointOptions& options() const { return options_; }

 private:
  Status prune();
  CheckpointOptions options_;
};

/// N from a path whose last component is "global_step_N"; errors name the path.
Result<int64_t> parse_global_step(const std::filesystem::path& dir);

}  // namespace tessera::driver
