// worker_support.hpp: what the FSDP worker classes (ActorRolloutRefWorker, CriticWorker,
// RewardModelWorker) share: the world communicator of a worker group, building an FSDP-wrapped
// model from verl's config blocks, offload around a call (verl's load -> compute -> offload),
// method arguments, checkpoint arguments and rotation, and the perf figures every method reports.
//
// Thread contract: free functions are re-entrant; an OffloadScope and a CheckpointRotation belong
// to the worker's (single) actor thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "dispatch/methods.hpp"
#include "dispatch/modes.hpp"
#include "dispatch/value.hpp"
#include "proto/data_proto.hpp"
#include "proto/status.hpp"
#include "runtime/collective/communicator.hpp"
#include "runtime/messages.hpp"
#include "workers/fsdp/fsdp_module.hpp"
#include "workers/ppo/fsdp_trainable.hpp"
#include "workers/ppo/sequence_parallel.hpp"
#include "workers/models/config.hpp"
#include "workers/models/lora.hpp"
#include "workers/models/model.hpp"

namespace tessera::workers {

// ---- Communicator ---------------------------------------------------------------------------------

/// The collective backend a worker uses unless its init config names one ("comm_backend"):
/// "nccl" on a cuda device, otherwise "gloo".
std::string default_comm_backend(const runtime::WorkerContext& context);

/// The world communicator of this rank's worker group, rendezvousing at the context's
/// master_addr:master_port (a group of one uses an in-process group of its own). Colocated roles
/// of one worker actor share one communicator (verl: one torch.distributed world per process):
/// a process-wide cache returns the live communicator of the same (backend, address, rank, world).
/// Collective on first use: every rank of the group must call it. `timeout` bounds the rendezvous
/// and is every collective's default (actor_rollout_ref.nccl_timeout); zero keeps the library's
/// default. A cached communicator keeps the timeout it was made with.
Result<std::shared_ptr<collective::Communicator>> world_communicator(const runtime::WorkerContext& context,
                                                                     const std::string& backend,
                                                                     std::chrono::milliseconds timeout = {});

/// This rank's Ulysses sequence-parallel group for `size` (verl's (dp, sp) device mesh over the
/// world: groups of `size` consecutive ranks), or null for 1. Errors name `key`: a size that does
/// not divide the world, that the model's heads do not allow (models::check_sequence_parallel), or
/// above 1 without padding-free micro-batches (`padding_key`). Collective over `world` when size > 1.
Result<std::shared_ptr<ppo::UlyssesGroup>> ulysses_group(const std::shared_ptr<collective::Communicator>& world,
                                                         int64_t size, const models::ModelConfig& model,
                                                         const std::string& key, bool use_remove_padding,
                                                         const std::string& padding_key);

// ---- Models ---------------------------------------------------------------------------------------

/// The `model` block of a worker config (actor_rollout_ref.model, critic.model,
/// reward_model.model). Only `path` is read by every worker; keys that ask for a feature Tessera
/// does not implement (external_lib, ...) are unimplemented errors naming the key; a worker that
/// cannot adapt its model refuses lora_rank > 0 itself; performance-only switches are accepted.
struct ModelSection {
  std::string path;                 ///< HF directory: config.json + safetensors (+ tokenizer files).
  nlohmann::json fsdp_config;       ///< model.fsdp_config (critic / reward model), null otherwise.
  std::optional<std::string> input_tokenizer;  ///< reward_model.model.input_tokenizer.
  /// enable_gradient_checkpointing (verl reads it with .get(..., False)): training keeps only each
  /// decoder layer's input and recomputes the layer in backward, under every strategy (under
  /// FULL_SHARD / HYBRID_SHARD this is also what lets the layer be freed right after its forward);
  /// false keeps every activation and the layers gathered until backward.
  bool gradient_checkpointing = false;
  /// use_remove_padding: actor, reference and critic forwards pack their micro-batches without
  /// padding (workers/ppo/packing.hpp). The reward model's one forward per batch stays padded.
  bool use_remove_padding = false;
  /// use_liger: on a GPU, RMSNorm, rotary and SwiGLU run as one fused kernel each way (verl applies
  /// Liger's kernels; models' Note [Fused layers]). No effect on the CPU.
  bool use_liger = false;
  /// enable_activation_offload: a trained model's checkpointed layer inputs wait in host memory
  /// between forward and backward (Note [Activation offload]); needs gradient checkpointing
  /// (check_activation_offload). Nothing to offload for a model that is never trained.
  bool activation_offload = false;
  std::string activation_offload_key;  ///< Its dotted path, for errors.
  /// override_config: config.json fields set over the checkpoint's (verl's update_model_config),
  /// and its full key for errors.
  nlohmann::json override_config;
  std::string override_config_key;
  /// lora_rank, lora_alpha, target_modules, exclude_modules (models' Note [LoRA adapters]).
  models::LoraConfig lora;
};

/// Parses a model block; `path` (e.g. "critic.model") prefixes errors. Unknown keys are errors.
Result<ModelSection> parse_model_section(const nlohmann::json& json, const std::string& path);

/// How build_fsdp_module wraps a model.
struct FsdpBuildOptions {
  nlohmann::json fsdp_config;       ///< verl's fsdp_config block (may be null: defaults).
  std::string fsdp_config_path;     ///< Its dotted config path, for errors.
  nlohmann::json optim;             ///< verl's optim block; null: a frozen module (no optimizer).
  std::string optim_path;
  double grad_clip = 1.0;           ///< actor.grad_clip / critic.grad_clip.
  /// Trainable modules: recompute each decoder layer in backward (every strategy; FULL_SHARD /
  /// HYBRID_SHARD also free it after forward). Frozen modules always free after forward under those.
  bool gradient_checkpointing = true;
  bool force_param_offload = false; ///< verl's reference / reward model: always CPU-offloaded.
  bool fused_layers = false;        ///< model.use_liger (ModelSection::use_liger).
  /// A LoRA model: its frozen base units keep param_dtype shards (FsdpOptions::frozen_units_in_param_dtype).
  bool frozen_units_in_param_dtype = false;
  /// model.enable_activation_offload of a trained model (FsdpOptions::offload_activations).
  bool offload_activations = false;
  std::string offload_activations_key;  ///< Its dotted path, for errors.
};

/// Refuses enable_activation_offload without gradient checkpointing, naming both keys: what
/// Tessera parks in host memory is each checkpointed layer's input (Note [Activation offload]).
Status check_activation_offload(const ModelSection& model, const std::string& path);

/// Wraps `model` in an FsdpModule over `world` (mesh and strategy from fsdp_config: fsdp_size,
/// reshard_after_forward, wrap_policy, mixed_precision, offload flags) and an optimizer from
/// `optim` (AdamW + verl's LR schedule); a null `optim` wraps it frozen (no optimizer state, no
/// gradient buffers). With gradient checkpointing (or frozen) each decoder layer runs through
/// FsdpModule::run_unit (recomputed in backward; under FULL_SHARD / HYBRID_SHARD also freed after
/// its forward). Collective over `world`.
Result<std::shared_ptr<ppo::FsdpTrainableModule>> build_fsdp_module(std::shared_ptr<models::PretrainedModel> model,
                                                               std::shared_ptr<collective::Communicator> world,
                                                               const FsdpBuildOptions& options);

/// The model dtype (master weights) named by fsdp_config.model_dtype (default fp32).
Result<c10::ScalarType> fsdp_model_dtype(const nlohmann::json& fsdp_config, const std::string& path);
/// The compute dtype named by fsdp_config.mixed_precision.param_dtype (default bf16). A LoRA model
/// is loaded in it (its frozen base stays there: FsdpOptions::frozen_units_in_param_dtype), and its
/// adapters are created in the model dtype (their master weights).
Result<c10::ScalarType> fsdp_param_dtype(const nlohmann::json& fsdp_config, const std::string& path);

/// `fsdp_config` with model_dtype set to bf16 where it is absent or null: verl loads the models it
/// never trains (the reference policy, the reward model) in bf16 and only the trained ones in fp32
/// (for their optimizer), which halves what a frozen model holds and moves when it is offloaded.
nlohmann::json frozen_model_fsdp_config(nlohmann::json fsdp_config);

// ---- Offload around a call ------------------------------------------------------------------------

/// verl's "load -> compute -> offload" for the parameters of an engine that keeps them offloaded
/// between calls: loads them, and offloads them again at exit() or destruction. Offloaded AdamW
/// moments stay on the host: the step streams them (Note [Streamed optimizer step] in
/// workers/fsdp/fsdp_step.cpp).
class OffloadScope {
 public:
  /// Loads the parameters if `params` and they are offloaded.
  static Result<std::unique_ptr<OffloadScope>> enter(fsdp::FsdpModule& engine, bool params);
  /// Offloads again whatever enter() loaded. Idempotent.
  Status exit();
  ~OffloadScope();

 private:
  OffloadScope(fsdp::FsdpModule& engine, bool params) : engine_(engine), params_(params) {}
  fsdp::FsdpModule& engine_;
  bool params_;
};

// ---- Out of memory ------------------------------------------------------------------------------

/// `st`, and when it reports a device out of memory (ErrorCode::resource_exhausted) the keys that
/// shrink the failing call's footprint appended: "<message>; lower <keys>".
Status name_memory_keys(const Status& st, const std::string& keys);

/// The key that sizes a micro-batched phase: `<prefix>_max_token_len_per_gpu` with dynamic
/// micro-batches, else `<prefix>_micro_batch_size_per_gpu` (prefix e.g. "critic.forward").
std::string micro_batch_key(const std::string& prefix, bool dynamic);

// ---- Method arguments -----------------------------------------------------------------------------

/// The single DataProto argument of a DP_COMPUTE_PROTO method; errors name `method`.
Result<proto::DataProto> proto_arg(const dispatch::Args& args, const std::string& method);

/// A DataProto method body, given its argument on the worker's device.
using DeviceBody = std::function<Result<proto::DataProto>(const proto::DataProto&)>;

/// Runs `body` on `device` (Note [Crossing the worker boundary] in proto/device.hpp): the single
/// DataProto argument of `method` moves to the device, and the result comes back to the host.
Result<dispatch::Value> run_on_device(const c10::Device& device, const dispatch::Args& args,
                                      const std::string& method, const DeviceBody& body);

// ---- Devices --------------------------------------------------------------------------------------

/// Fail fast after init_model: OK if `engine`'s working state is on `device`
/// (fsdp::FsdpModule::check_device); the error names the rank, the module and the tensor.
Status check_on_device(const fsdp::FsdpModule& engine, const c10::Device& device, int rank);

/// verl's perf/max_memory_allocated_gb and perf/max_memory_reserved_gb: the allocator's peaks on
/// `device` since the last reset (0 on a CPU device), in GiB; then starts a new peak.
void add_device_memory_metrics(nlohmann::json& metrics, const c10::Device& device);

/// save_checkpoint(local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None), verl's
/// signature: positional JSON args, or one JSON object with those keys.
struct SaveCheckpointArgs {
  std::string local_path;
  std::optional<std::string> hdfs_path;
  int64_t global_step = 0;
  std::optional<int64_t> max_ckpt_to_keep;
};
Result<SaveCheckpointArgs> parse_save_checkpoint_args(const dispatch::Args& args);

/// load_checkpoint(local_path, hdfs_path=None, del_local_after_load=False): positional (a bool
/// in second place is taken as del_local_after_load) or one JSON object.
struct LoadCheckpointArgs {
  std::string local_path;
  std::optional<std::string> hdfs_path;
  bool del_local_after_load = false;
};
Result<LoadCheckpointArgs> parse_load_checkpoint_args(const dispatch::Args& args);

/// Registers verl's save_checkpoint and load_checkpoint (ONE_TO_ALL, returning null) on `worker`,
/// which has methods() and save_checkpoint(SaveCheckpointArgs) / load_checkpoint(LoadCheckpointArgs).
template <class Worker>
void register_checkpoint_methods(Worker& worker) {
  Worker* w = &worker;
  (void)worker.methods().add("save_checkpoint", dispatch::Dispatch::ONE_TO_ALL,
                             [w](const dispatch::Args& args) -> Result<dispatch::Value> {
                               TESSERA_ASSIGN_OR_RETURN(auto a, parse_save_checkpoint_args(args));
                               TESSERA_RETURN_IF_ERROR(w->save_checkpoint(a));
                               return dispatch::Value(nlohmann::json());
                             });
  (void)worker.methods().add("load_checkpoint", dispatch::Dispatch::ONE_TO_ALL,
                             [w](const dispatch::Args& args) -> Result<dispatch::Value> {
                               TESSERA_ASSIGN_OR_RETURN(auto a, parse_load_checkpoint_args(args));
                               TESSERA_RETURN_IF_ERROR(w->load_checkpoint(a));
                               return dispatch::Value(nlohmann::json());
                             });
}

// ---- Checkpoints ----------------------------------------------------------------------------------

/// verl's FSDPCheckpointManager bookkeeping: the directories this worker saved, oldest first;
/// beyond max_ckpt_to_keep the oldest are removed (by rank 0).
class CheckpointRotation {
 public:
  /// Records `dir` as saved and removes the oldest directories beyond `max_keep` (when set and
  /// > 0) if `remover`. Errors name the directory that could not be removed.
  Status saved(const std::string& dir, std::optional<int64_t> max_keep, bool remover);

 private:
  std::deque<std::string> saved_;
};

/// Files a worker adds to its checkpoint: called with the checkpoint's temporary directory before
/// it is published (fsdp::SaveOptions::after_rank_files), so they appear atomically with it.
using CheckpointFiles = std::function<Status(const std::string& dir)>;
/// Saves `engine` to args.local_path (fsdp::save_checkpoint: sharded, atomic, huggingface/
/// config.json, and what `extra_files` writes), copies the tokenizer files of `model_path` into
/// local_path/huggingface (rank 0), then rotates. hdfs_path is unimplemented. Collective over the
/// engine's world.
Status save_worker_checkpoint(fsdp::FsdpModule& engine, const SaveCheckpointArgs& args, const std::string& model_path,
                              const models::ModelConfig& model_config, int rank, CheckpointRotation& rotation,
                              const CheckpointFiles& extra_files = nullptr);

/// verl's _save_lora_adapter: lora_adapter/adapter_model.safetensors and adapter_config.json as
/// PEFT's save_pretrained writes them (keys "base_model.model.<parameter>", the adapters in their
/// fp32 master values; models::peft_adapter_config over `base_path`), so PeftModel.from_pretrained
/// loads them over the base model. Gathers only the adapter units (collective); returns the
/// writer on rank 0 and an empty function elsewhere. `key_path` (e.g. "actor_rollout_ref.model")
/// names the LoRA keys in errors.
Result<CheckpointFiles> lora_adapter_files(ppo::FsdpTrainableModule& module, const models::LoraConfig& lora,
                                           const std::string& key_path, const std::string& base_path, int rank);
/// Loads args.local_path into `engine` (any world size); keeps the offload state. With
/// del_local_after_load, rank 0 removes the directory once every rank has loaded.
Status load_worker_checkpoint(fsdp::FsdpModule& engine, const LoadCheckpointArgs& args, int rank,
                              collective::Communicator& world);

// ---- Perf figures ---------------------------------------------------------------------------------

/// verl's perf/cpu_memory_used_gb (psutil.virtual_memory().used / 2**30): MemTotal - MemAvailable
/// from /proc/meminfo, in GiB; -1 if it cannot be read.
double cpu_memory_used_gb();

/// Seconds since construction (steady clock).
class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

/// Adds the per-call figures of `method` to out.meta_info()["metrics"]: timing_s/<method> (the
/// worker-side wall time) and perf/cpu_memory_used_gb. After collection across ranks each becomes
/// a list (DataProto.concat); the driver pops meta_info["metrics"] before union-ing outputs.
void record_call_metrics(proto::DataProto& out, const std::string& method, double seconds);

/// A DataProto with no rows whose meta_info is {"metrics": metrics} (update_actor's return).
Result<proto::DataProto> metrics_proto(nlohmann::json metrics);

}  // namespace tessera::workers
