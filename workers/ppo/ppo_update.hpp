// ppo_update.hpp: the update loop DataParallelPPOActor and DataParallelPPOCritic share (verl's
// update_policy / update_critic body, v0.5.0): sequential mini-batches for ppo_epochs passes, each
// one optimizer step over fixed or dynamic micro-batches with verl's loss scaling. The role's
// loss of one micro-batch is the only part that differs; it is passed in (see dp_actor.hpp for
// the semantics).
//
// Thread contract: as DataParallelPPOActor (one thread drives the module).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "proto/data_proto.hpp"
#include "proto/status.hpp"
#include "workers/ppo/dp_actor.hpp"
#include "workers/ppo/ppo_batching.hpp"
#include "workers/ppo/ppo_inputs.hpp"

namespace tessera::ppo {

/// The keys every PPO forward reads (verl's select_keys before the role's own).
inline const std::vector<std::string> kPpoForwardKeys = {"responses", "input_ids", "attention_mask", "position_ids"};

/// The loss of one micro-batch and the metrics it appends (one value per micro-batch). Metrics
/// are 0-dim tensors, on any device: the update reads them all in one host transfer per
/// optimizer step (see run_ppo_update), so a micro-batch never waits for its kernels.
struct MicroLoss {
  at::Tensor loss;
  std::map<std::string, at::Tensor> metrics;
};

/// A role's loss of one micro-batch from the module's train-mode output `head` at the response
/// positions (response_head): logits or values in the compute dtype, padded or packed.
using MicroLossFn = std::function<Result<MicroLoss>(const proto::DataProto& micro_batch, const SequenceBatch& seq,
                                                     const ResponseHead& head)>;

/// The normalised batch keys one update follows (a role's ppo_* config).
struct UpdateSchedule {
  std::string role;  ///< "actor" | "critic": prefixes the config keys in errors and the metric names.
  int64_t ppo_mini_batch_size = 1;
  int64_t ppo_epochs = 1;
  bool use_dynamic_bsz = false;
  int64_t max_token_len = 0;  ///< Token budget of a dynamic micro-batch (<role>.ppo_max_token_len_per_gpu).
  std::optional<int64_t> ppo_micro_batch_size_per_gpu;  ///< Required without use_dynamic_bsz.
  double grad_clip = 1.0;
  bool use_remove_padding = false;  ///< Padding-free forwards (packing.hpp).
  /// Ulysses sequence parallelism (sequence_parallel.hpp); null without.
  std::shared_ptr<const UlyssesGroup> sequence_parallel;
};

/// The schedule of a normalised ActorConfig / CriticConfig for `role`; the dynamic token budget is
/// ppo_max_token_len_per_gpu x ulysses_sequence_parallel_size (verl's).
template <class Config>
UpdateSchedule update_schedule(std::string role, const Config& c) {
  return UpdateSchedule{std::move(role),      c.ppo_mini_batch_size,
                        c.ppo_epochs,         c.use_dynamic_bsz,
                        c.ppo_max_token_len_per_gpu * c.ulysses_sequence_parallel_size,
                        c.ppo_micro_batch_size_per_gpu, c.grad_clip, c.use_remove_padding, nullptr};
}

/// Checks the sequence tensors of `data`, each of `response_keys` as a floating [B, R] tensor and
/// the response mask, and selects kPpoForwardKeys, `response_keys` and response_mask (when
/// present), in that order. Errors name the key.
Result<proto::DataProto> select_update_inputs(const proto::DataProto& data, const std::vector<std::string>& response_keys);

/// verl's update loop over `selected`: ppo_epochs passes over mini-batches of ppo_mini_batch_size
/// rows IN ORDER; per mini-batch, gradients are zeroed, each micro-batch runs a train-mode forward,
/// `micro_loss`, and backward of the loss times 1 / gradient_accumulation (fixed) or rows /
/// ppo_mini_batch_size (dynamic), then clip_and_step(grad_clip). When `micro_loss` fails the
/// forward is ended before the error is returned. Returns the micro-batch metrics,
/// <role>/grad_norm per mini-batch and <role>/lr once; gradients are dropped at the end. The host
/// waits for the device once per optimizer step (the grad norm decides clipping and skipping);
/// the metrics of the mini-batch's micro-batches come back in one transfer right after it.
// REQUIRES: without use_dynamic_bsz, ppo_micro_batch_size_per_gpu is set (check_fixed_micro_batch).
Result<Metrics> run_ppo_update(TrainableModule& module, const proto::DataProto& selected,
                               const UpdateSchedule& schedule, const MicroBatchCountSync& sync,
                               const MicroLossFn& micro_loss);

}  // namespace tessera::ppo
