// fsdp_trainable.hpp: the TrainableModule seam (dp_actor.hpp) implemented over the FSDP engine
// (workers/fsdp/fsdp_module.hpp), so DataParallelPPOActor / DataParallelPPOCritic train a sharded
// model exactly as they train a LocalTrainableModule.
//
//  * forward(train): FsdpModule::begin_forward(train), then the model's forward (logits for a
//    policy, values for a critic); backward() reduce-scatters the gradients into the shards and
//    frees the gathered parameters; end_forward() abandons the pass.
//  * forward(eval): begin_forward(eval), forward, end_forward(): the full parameters never outlive
//    the call (verl reshards the FSDP root after compute_log_prob for the same reason).
//  * clip_and_step(max_norm): FsdpModule::step() (global norm over the shards, skip on a
//    non-finite norm). The clip threshold is fixed when the engine is wrapped
//    (OptimizerOptions::clip_grad); a different max_norm is an error, not a silent mismatch.
//    The LR schedule is NOT advanced here: verl steps it once per update_actor / update_critic
//    call, which the worker does through engine().lr_scheduler_step().
//  * make_dp_count_sync: verl's all-reduce MAX of the dynamic micro-batch count over the
//    data-parallel group, so every rank runs the same number of collective forwards.
//
// Thread contract: as FsdpModule (one thread; every rank makes the same sequence of calls).
#pragma once

#include <memory>

#include <ATen/core/Tensor.h>

#include "proto/status.hpp"
#include "runtime/collective/communicator.hpp"
#include "workers/ppo/dp_actor.hpp"
#include "workers/fsdp/fsdp_module.hpp"
#include "workers/models/model.hpp"
#include "workers/ppo/ppo_batching.hpp"

namespace tessera::ppo {

/// A TrainableModule whose parameters and optimizer state live in an FsdpModule.
class FsdpTrainableModule final : public TrainableModule {
 public:
  /// Wraps `engine`, which must have been built over `model` (the same torch module).
  /// `trainable` false gives a frozen module (reference policy, reward model): clip_and_step fails.
  /// Errors: null model or engine.
  static Result<std::shared_ptr<FsdpTrainableModule>> create(std::shared_ptr<models::PretrainedModel> model,
                                                             std::unique_ptr<fsdp::FsdpModule> engine,
                                                             bool trainable);
  ~FsdpTrainableModule() override;

  Result<at::Tensor> forward(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                             const at::Tensor& position_ids, ForwardMode mode,
                             models::HeadRows rows = models::HeadRows::all()) override;
  Result<at::Tensor> forward_packed(const PackedBatch& batch, ForwardMode mode) override;
  Status backward(const at::Tensor& loss) override;
  Status end_forward() override;
  Result<StepOutcome> clip_and_step(double max_norm) override;
  void zero_grad() override;
  double lr() const override;
  const models::ModelConfig& model_config() const override { return model_->config(); }

  /// The FSDP engine (offload, checkpoints, LR schedule, gathers for the rollout).
  fsdp::FsdpModule& engine() const { return *engine_; }
  /// The wrapped model (its parameters are empty between forwards).
  models::PretrainedModel& model() const { return *model_; }
  bool trainable() const { return trainable_; }

 private:
  template <class F>
  Result<at::Tensor> run_forward(ForwardMode mode, F&& head);
  FsdpTrainableModule(std::shared_ptr<models::PretrainedModel> model, std::unique_ptr<fsdp::FsdpModule> engine,
                      bool trainable);
  std::shared_ptr<models::PretrainedModel> model_;
  std::unique_ptr<fsdp::FsdpModule> engine_;
  bool trainable_ = false;
  bool in_train_forward_ = false;
};

/// verl's dp micro-batch count agreement: all-reduce MAX of the local count over `dp_group`.
/// A null group or a group of one gives an empty function (no sync needed).
MicroBatchCountSync make_dp_count_sync(std::shared_ptr<collective::Communicator> dp_group);

}  // namespace tessera::ppo
