// fsdp_module.hpp: Tessera's FSDP engine over any torch::nn::Module.
//
// Note [FSDP engine]
// The module is cut into units (sets of named parameters; for the decoder: one per layer plus a
// root unit with the embeddings, final norm and head). Each unit's parameters are flattened into
// one FlatParameter (flat_param.hpp), padded to a multiple of the shard count K, and each rank
// keeps only its shard (in model_dtype, normally fp32; a frozen unit's may be in param_dtype:
// FsdpOptions::frozen_units_in_param_dtype) and the AdamW moments of that shard.
//
// Forward: gathering a unit all-gathers the shards (cast to param_dtype) into a full flat buffer
// and points every module parameter at its slice with Tensor::set_data (no copy; the parameter
// stays a leaf, see models' Note [Swapping parameters]).
// Backward: after autograd, the unit's flat gradient is cast to reduce_dtype and reduce-scattered
// (average over the data-parallel ranks) into the shard gradient; then the unit is released
// (its parameters point at empty tensors again).
//
// Note [Gradients taken over]
// A parameter's .grad is left undefined while its unit is gathered, so autograd's
// AccumulateGrad keeps the gradient tensor backward computed (no copy, no kernel) rather than
// adding it into a pre-set buffer (one more kernel and a read-modify-write per parameter per
// micro-batch, after a zero-fill of the whole buffer). The reduction lays the gradients end to
// end in one concatenation (zeros for a parameter that got none, and the padding), which is the
// copy the cast to reduce_dtype needed anyway when the dtypes differ. The values are the same:
// 0 + g is g, and a tied parameter's two gradients are summed by autograd in the same order.
//
// Strategies (DeviceMesh groups: "fsdp" shards, "ddp" replicates):
//   FULL_SHARD     K = |fsdp|; units routed through run_unit() are freed right after their
//                  forward and re-gathered in backward by recomputing the unit (activation
//                  checkpointing); other units stay gathered until backward.
//   SHARD_GRAD_OP  K = |fsdp|; units stay gathered from forward to backward; units routed through
//                  run_unit() still keep only their input and are recomputed in backward
//                  (activation checkpointing), without a second gather.
//   NO_SHARD       K = 1; gradients are all-reduced (averaged) over the world; run_unit() as
//                  under SHARD_GRAD_OP.
//   HYBRID_SHARD   (ddp, fsdp) mesh: K = |fsdp|; reduce-scatter over fsdp, then all-reduce over ddp;
//                  run_unit() recomputes as in FULL_SHARD.
// Averaging over all ranks means: N ranks each computing the mean loss of an equal share of a
// global batch produce the gradient of the mean loss over the whole batch, as one process would.
//
// Note [FSDP overlap]
// Collectives run beside compute where the backend allows it (Note [Deferred collectives]):
//  - backward prefetch (always): when a recomputed unit starts its backward, the all-gather of
//    the unit whose backward comes next is started too, so it runs during this unit's recompute
//    and backward (torch FSDP's BACKWARD_PRE);
//  - forward prefetch (fsdp_config.forward_prefetch): likewise in forward, the next unit's
//    all-gather starts before this unit's forward runs;
//  - gradient reduction: a unit's reduce-scatter is started when its backward ends and finished
//    (its result added into the shard gradient) when the next unit's backward ends, or when
//    backward() returns; with a replicate group (HYBRID_SHARD, NO_SHARD) the reduction stays
//    blocking (its all-reduce needs the reduce-scatter's result).
// "Next" is the neighbouring recomputed unit in module order (forward) and the one that ran
// before in this forward (backward). Under FULL_SHARD / HYBRID_SHARD at most two recomputed units
// (with their attached units) are gathered at once; under SHARD_GRAD_OP / NO_SHARD every unit is
// gathered by begin_forward(), so there is nothing to prefetch. Nothing changes
// the numbers: the same collectives run on the same tensors in the same order, and each unit's
// shard gradient is accumulated in the same order.
//
// Step: global grad norm = sqrt(sum of squared shard gradients over the fsdp group); non-finite
// skips the update and zeroes gradients (verl); otherwise clip (torch's clip_grad_norm_ formula)
// and run AdamW (optim.hpp) on every shard. A unit that received no gradient since the last step
// is not updated (torch skips parameters whose grad is None).
//
// Note [Attached units]
// A unit may be attached to another (UnitSpec::owner): whenever the owner is gathered (by
// begin_forward, run_unit, a prefetch, a recompute), released or reduced, so is every unit
// attached to it, in the same order on every rank. A LoRA layer is two units: its frozen base
// weights and its trainable adapters (models' Note [LoRA adapters]); a unit's parameters are
// either all trainable or all frozen, so the flat buffers, gradients and AdamW moments exist only
// for the adapters, while both run, and are recomputed, as one layer.
// Units of a trainable module may be frozen (none of their parameters requires grad): they get no
// gradient buffers and no AdamW moments, and step(), checkpoints and optimizer offload skip them;
// with FsdpOptions::frozen_units_in_param_dtype their shards are kept in param_dtype.
//
// Frozen (FsdpOptions::frozen; the reference policy, the reward model): no AdamW moments and no
// gradient buffers are ever allocated; begin_forward(train), backward() and step() fail naming the
// module; offload / load of the optimizer state are no-ops; checkpoints hold no optimizer files.
//
// Offload: param_offload / optimizer_offload move the shards / moments into separate CPU buffers
// (pinned on CUDA builds) and free the working copies; load_* copies them back bitwise. While
// the shards are offloaded, forward and step fail with an error saying what to load. Offloaded
// moments need no loading: step() streams them through the device one unit at a time, and with
// optimizer_offload they are created on the host (Note [Streamed optimizer step] in fsdp_step.cpp).
// Shards that nothing wrote since they were loaded are not copied back (Note [Clean offload]).
//
// Thread contract: one thread drives one FsdpModule; all ranks call the collective methods
// (everything except the accessors and offload/load) in the same order.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "proto/status.hpp"
#include "runtime/collective/communicator.hpp"
#include "runtime/collective/device_mesh.hpp"
#include "workers/fsdp/flat_param.hpp"
#include "workers/fsdp/optim.hpp"
#include "workers/fsdp/options.hpp"

namespace tessera::fsdp::internal {
class ActivationStash;
}  // namespace tessera::fsdp::internal

namespace tessera::fsdp {

/// A set of named parameters that is gathered and sharded as one FlatParameter.
struct UnitSpec {
  std::string name;                      ///< e.g. "model.layers.3" or "root".
  std::vector<std::string> param_names;  ///< Module parameter names, in flat order.
  /// The model runs this unit through run_unit(), which recomputes it in backward (activation
  /// checkpointing); under FULL_SHARD / HYBRID_SHARD it is then also not gathered by
  /// begin_forward(), and freed after its forward.
  bool recompute = false;
  /// Non-empty: the unit this one is attached to (Note [Attached units]); it is never run or
  /// gathered on its own.
  std::string owner;
};

/// How an FsdpModule shards, casts and offloads.
struct FsdpOptions {
  ShardingStrategy strategy = ShardingStrategy::full_shard;
  MixedPrecision mixed_precision;
  c10::ScalarType model_dtype = c10::ScalarType::Float;  ///< Dtype of the shards (master weights).
  bool param_offload = false;      ///< Offload shards right after wrapping.
  bool optimizer_offload = false;  ///< Offload the AdamW moments right after wrapping.
  bool sync_module_states = true;  ///< Broadcast world rank 0's parameters when wrapping.
  bool forward_prefetch = false;   ///< Note [FSDP overlap].
  /// No optimizer: no AdamW moments or gradient buffers; training calls fail. See Note [FSDP engine].
  bool frozen = false;
  /// Shards of frozen units of a trainable module (a LoRA base: Note [Attached units]) in
  /// mixed_precision.param_dtype instead of model_dtype: nothing ever updates them, and the gather
  /// casts them to param_dtype anyway, so the numbers are the same and they take half the memory
  /// and transfer in bf16.
  bool frozen_units_in_param_dtype = false;
  /// Recomputed units park their inputs in host memory from their forward to their recompute
  /// (model.enable_activation_offload; Note [Activation offload] in activation_stash.cpp). No
  /// effect on a CPU device, where they are in host memory already.
  bool offload_activations = false;
  std::string name;  ///< Names the module in errors (e.g. its config path); may be empty.
  collective::CollectiveOptions comm;  ///< Timeout of every collective.
};

/// Builds FsdpOptions from a parsed fsdp_config for a world of `world_size`.
FsdpOptions fsdp_options_from_config(const FsdpConfig& config, int world_size);

/// What one optimizer step did.
struct StepResult {
  double grad_norm = 0.0;       ///< Global norm before clipping (verl's actor/grad_norm).
  bool skipped = false;         ///< Non-finite norm: nothing updated, gradients zeroed.
  double lr = 0.0;              ///< Learning rate used.
  int64_t optimizer_steps = 0;  ///< AdamW steps taken so far (skips not counted).
};

/// Whether a forward pass will be followed by backward().
enum class ForwardMode : uint8_t { train, eval };

/// The FSDP engine. See Note [FSDP engine].
class FsdpModule {
 public:
  /// Wraps `module`: checks that `units` cover every parameter exactly once, flattens and shards
  /// them (rank k of the fsdp group keeps shard k), frees the module's parameter storage, casts
  /// floating buffers to buffer_dtype, and allocates AdamW state (none when options.frozen;
  /// `optim` is then only kept for optimizer_options()). Collective over the mesh.
  /// The module must outlive nothing: the FsdpModule holds it.
  static Result<std::unique_ptr<FsdpModule>> wrap(std::shared_ptr<torch::nn::Module> module,
                                                  std::vector<UnitSpec> units,
                                                  collective::DeviceMesh mesh,
                                                  const FsdpOptions& options,
                                                  const OptimizerOptions& optim);
  ~FsdpModule();

  /// Gathers every unit into the module, except (under FULL_SHARD / HYBRID_SHARD) those the model
  /// runs through run_unit() with recompute. `train` also sets up gradient buffers; follow it with
  /// backward(). Errors: `train` on a frozen module; a failed gather (the forward is ended).
  Status begin_forward(ForwardMode mode);

  /// Runs `fn(input)` as unit `unit`, gathering it first if needed; in training mode a recompute
  /// unit keeps only `input` and is recomputed in backward (Note [Recompute unit]), and under
  /// FULL_SHARD and HYBRID_SHARD it is also freed after the call.
  /// `fn` is kept until backward: capture tensors by value. Collective.
  Result<at::Tensor> run_unit(int unit, std::function<at::Tensor(const at::Tensor&)> fn,
                              const at::Tensor& input);

  /// Index of the unit called `name`.
  Result<int> unit_index(const std::string& name) const;

  /// loss.backward(), then reduces every gathered unit's gradient into its shard and frees the
  /// full parameters. Gradients accumulate over calls until step(). Collective.
  Status backward(const at::Tensor& loss);

  /// Frees the full parameters after an eval forward (or abandons a train forward).
  Status end_forward();

  /// Clips by the global norm and runs AdamW on every shard (or skips on a non-finite norm),
  /// then zeroes the gradients. Does not advance the LR schedule. Collective. With the moments
  /// offloaded they stay offloaded (Note [Streamed optimizer step]).
  Result<StepResult> step();

  /// Advances the LR schedule by one (verl: once per update_actor call).
  void lr_scheduler_step() { scheduler_.step(); }
  /// The learning rate the next step() uses.
  double current_lr() const { return scheduler_.current_lr(); }
  /// Drops accumulated shard gradients.
  void zero_grad();

  /// Moves the shards to the offload buffers and frees the working copies; shards unchanged since
  /// load_params() are only freed (Note [Clean offload]).
  Status offload_params();
  /// Copies the shards back from the offload buffers (bitwise).
  Status load_params();
  /// Moves the AdamW moments to the offload buffers and frees the working copies.
  Status offload_optimizer();
  /// Copies the AdamW moments back (bitwise).
  Status load_optimizer();
  bool params_offloaded() const { return params_offloaded_; }
  bool optimizer_offloaded() const { return optimizer_offloaded_; }
  /// Bytes of working (non-offloaded) shards, shard gradients and AdamW moments.
  int64_t resident_bytes() const;
  /// Bytes of AdamW moments held, working and offloaded (0 for a frozen module).
  int64_t optimizer_state_bytes() const;
  /// Whether the module was wrapped frozen (no optimizer).
  bool frozen() const { return options_.frozen; }
  /// Indices of the units whose full parameters are gathered right now.
  std::vector<int> gathered_units() const;
  /// Expires when this FsdpModule is destroyed (for hooks that hold a pointer to it).
  std::weak_ptr<const bool> lifetime() const { return alive_; }

  /// Every parameter by name, gathered and cast to `dtype` (fresh tensors); with `include`, only
  /// the units it accepts (every rank must pass the same filter). Offloaded shards are read from
  /// their host buffers, a unit at a time. Collective over the fsdp group.
  Result<std::map<std::string, at::Tensor>> full_state_dict(
      c10::ScalarType dtype, const std::function<bool(const FlatLayout&)>& include = nullptr);

  /// This rank's shard of unit `unit` (model_dtype). REQUIRES: params loaded.
  const at::Tensor& shard(int unit) const;

  const std::vector<FlatLayout>& layouts() const { return layouts_; }
  ShardingStrategy strategy() const { return options_.strategy; }
  const FsdpOptions& options() const { return options_; }
  const OptimizerOptions& optimizer_options() const { return optim_; }
  const collective::DeviceMesh& mesh() const { return mesh_; }
  /// K: shards per unit; and this rank's shard index in [0, K).
  int shard_count() const { return shard_count_; }
  int shard_index() const { return shard_index_; }
  torch::nn::Module& module() const { return *module_; }
  /// The device of the wrapped module's parameters, where shards, gradients, AdamW moments and
  /// gathered units live (Note [FSDP on the module's device] in fsdp_module.cpp).
  const c10::Device& device() const { return device_; }
  /// OK if every working tensor (shards, shard gradients, AdamW moments, gathered units, the
  /// module's parameters and buffers) is on `device`; offload buffers are on the host by design.
  /// The error names the module, the unit or parameter and the tensor's device.
  Status check_device(const c10::Device& device) const;
  int64_t optimizer_steps() const { return optimizer_steps_; }

  // ---- used by checkpoint.cpp -------------------------------------------------------------
  struct UnitState;
  /// Write access: the next offload_params() copies every shard (Note [Clean offload]).
  UnitState& unit_state(int unit);
  const UnitState& unit_state(int unit) const;
  LrScheduler& scheduler() { return scheduler_; }
  void set_optimizer_steps(int64_t steps) { optimizer_steps_ = steps; }

  // ---- used by the recompute autograd function (recompute.cpp) ------------------------------
  Status gather_unit(int unit, bool train);
  /// Starts gathering the unit that runs after `unit` (in forward, or in backward), if any and
  /// not gathered yet (Note [FSDP overlap]).
  Status prefetch_after(int unit, bool backward);
  Status reduce_unit(int unit);
  void release_unit(int unit);

 private:
  explicit FsdpModule(collective::DeviceMesh mesh) : mesh_(std::move(mesh)) {}
  Status init_units(const std::vector<UnitSpec>& units);
  Status shard_unit(UnitState& state, const FlatLayout& layout);
  /// Zero AdamW moments for a trainable unit: in the offload buffers with optimizer_offload.
  void init_moments(UnitState& state);
  Status check_loaded(const char* what) const;
  Status check_trainable(const char* what) const;
  bool recompute_in_backward() const;
  Status reduce_pending();
  Status start_gather(int unit);
  Status finish_reductions();
  Result<double> global_grad_norm();

  std::shared_ptr<torch::nn::Module> module_;
  collective::DeviceMesh mesh_;
  c10::Device device_ = c10::Device(c10::DeviceType::CPU);
  FsdpOptions options_;
  OptimizerOptions optim_;
  LrScheduler scheduler_{0.0, {}};
  std::shared_ptr<collective::Communicator> shard_group_;      // null when K == 1
  std::shared_ptr<collective::Communicator> replicate_group_;  // ddp (HYBRID) or world (NO_SHARD)
  int shard_count_ = 1;
  int shard_index_ = 0;
  std::vector<FlatLayout> layouts_;
  std::vector<std::unique_ptr<UnitState>> units_;
  std::vector<std::function<at::Tensor(const at::Tensor&)>> recompute_fns_;  // live until backward
  std::vector<int> forward_order_;  // recomputed units in the order this forward ran them
  // Inputs of recomputed units in host memory, by recompute_fns_ index (offload_activations).
  std::shared_ptr<internal::ActivationStash> activations_;
  int64_t optimizer_steps_ = 0;
  bool params_offloaded_ = false;
  bool optimizer_offloaded_ = false;
  bool in_forward_ = false;
  ForwardMode mode_ = ForwardMode::eval;
  std::shared_ptr<const bool> alive_ = std::make_shared<const bool>(true);

  friend struct RecomputeUnit;
};

/// Per-unit tensors. Owned by FsdpModule; exposed for checkpoint.cpp and recompute.cpp.
struct FsdpModule::UnitState {
  std::vector<at::Tensor> params;  ///< The module's parameters (same TensorImpl), flat order.
  bool trainable = true;           ///< All parameters require grad (mixed units are refused).
  int owner = -1;                  ///< The unit this one is attached to (Note [Attached units]).
  std::vector<int> attached;       ///< Units attached to this one, in unit order.
  bool recompute = false;          ///< UnitSpec::recompute.
  at::Tensor shard;                ///< [S] model_dtype (a frozen unit's may be param_dtype); undefined while offloaded.
  at::Tensor shard_grad;           ///< [S] model_dtype reduced gradient; undefined when none.
  AdamWState adam;                 ///< Moments; undefined while offloaded or frozen.
  at::Tensor offload_shard;        ///< CPU copy while offloaded (kept allocated).
  bool host_current = false;       ///< offload_shard holds the shard's values (Note [Clean offload]).
  AdamWState offload_adam;         ///< CPU copies of the moments.
  at::Tensor full;                 ///< [padded] param_dtype while gathered (or being gathered).
  collective::PendingCollective gathering;  ///< The all-gather into `full`, until gather_unit waits.
  collective::PendingCollective reducing;   ///< The reduction into `reduced`, until it is added.
  at::Tensor reduced;              ///< [S] reduce_dtype: this micro-batch's reduced gradient, in flight.
  bool pending_reduce = false;     ///< Gathered for training, gradient not yet reduced.
  at::Tensor anchor;               ///< Zero-size leaf that makes run_unit outputs require grad.
};

}  // namespace tessera::fsdp
