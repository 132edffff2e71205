// ppo_trainer_step.cpp: what interactive drivers (the REPL) use: fit()'s loop body as a public
// step(), the role views, the tokenizer and the training data.
#include <optional>

#include "driver/config.hpp"
#include "driver/ppo_trainer.hpp"
#include "driver/internal/ppo_state.hpp"

namespace tessera::driver {

Result<std::optional<Metrics>> RayPPOTrainer::step() {
  State& s = *state_;
  if (!stepping_) {
    global_steps_ = 0;
    TESSERA_RETURN_IF_ERROR(load_checkpoint());
    stepping_ = true;
  }
  if (global_steps_ >= total_training_steps_) return std::optional<Metrics>();
  TESSERA_ASSIGN_OR_RETURN(std::optional<std::vector<int64_t>> indices, next_training_batch());
  if (!indices) return std::optional<Metrics>();
  global_steps_ += 1;  // train_step() numbers the step it runs (uids, save_freq, test_freq)
  Result<std::optional<Metrics>> metrics = train_step(*indices, global_steps_ >= total_training_steps_);
  if (!metrics.ok() || !*metrics) {
    global_steps_ -= 1;
    if (!metrics.ok()) return metrics.status();
    return std::optional<Metrics>();  // dynamic sampling ran out of data
  }
  Metrics& m = **metrics;
  m["training/epoch"] = static_cast<double>(s.epoch());  // of the step's last batch, as verl's
  TESSERA_RETURN_IF_ERROR(log_step(global_steps_, m));
  if (global_steps_ >= total_training_steps_ && s.tracking) s.tracking->finish(true);  // the last step
  return std::optional<Metrics>(std::move(m));
}

std::vector<std::pair<std::string, dispatch::WorkerGroup*>> RayPPOTrainer::worker_groups() const {
  std::vector<std::pair<std::string, dispatch::WorkerGroup*>> out;
  const std::pair<const char*, dispatch::WorkerGroup*> all[] = {
      {"actor_rollout", actor_rollout_wg_.get()}, {"critic", critic_wg_.get()}, {"ref", ref_wg_.get()}, {"rm", rm_wg_.get()}};
  for (const auto& [name, wg] : all) {
    if (wg != nullptr) out.emplace_back(name, wg);
  }
  return out;
}

const tokenizer::Tokenizer& RayPPOTrainer::tokenizer() const { return *state_->tokenizer; }

const RLHFDataset& RayPPOTrainer::train_dataset() const { return *state_->train_dataset; }

}  // namespace tessera::driver
