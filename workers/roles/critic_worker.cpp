// critic_worker.cpp: CriticWorker (see critic_worker.hpp).
#include "workers/roles/critic_worker.hpp"

#include <utility>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "workers/models/lora.hpp"
#include "workers/models/model_io.hpp"
#include "workers/ppo/flops_counter.hpp"

namespace tessera::workers {

using json = nlohmann::json;
using dispatch::Args;
namespace Dispatch = dispatch::Dispatch;
using dispatch::Value;

CriticWorker::CriticWorker(runtime::WorkerContext context, json init_config)
    : WorkerBase(std::move(context)), init_config_(std::move(init_config)) {}

Result<std::unique_ptr<CriticWorker>> CriticWorker::create(const runtime::WorkerContext& context,
                                                           const json& init_config) {
  if (!init_config.is_object() || !init_config.contains("config")) {
    return make_error(ErrorCode::invalid_argument, "critic init config: 'config' (the critic subtree) is required");
  }
  std::unique_ptr<CriticWorker> w(new CriticWorker(context, init_config));
  w->register_methods();
  return w;
}

void CriticWorker::register_methods() {
  using Fn = Result<proto::DataProto> (CriticWorker::*)(const proto::DataProto&);
  for (auto [name, fn] : {std::pair<const char*, Fn>{"compute_values", &CriticWorker::compute_values},
                          std::pair<const char*, Fn>{"update_critic", &CriticWorker::update_critic}}) {
    (void)methods().add(name, Dispatch::DP_COMPUTE_PROTO, [this, name = name, fn = fn](const Args& args) -> Result<Value> {
      return run_on_device(device(), args, name, [this, fn](const proto::DataProto& data) { return (this->*fn)(data); });
    });
  }
  (void)methods().add("init_model", Dispatch::ONE_TO_ALL, [this](const Args&) -> Result<Value> {
    TESSERA_RETURN_IF_ERROR(init_model());
    return Value(json());
  });
  register_checkpoint_methods(*this);
}

Status CriticWorker::require_init(const char* method) const {
  if (critic_) return Status();
  return make_error(ErrorCode::invalid_argument, "{}: init_model has not run on critic rank {}", method,
                    context().rank);
}

Status CriticWorker::init_model() {
  if (critic_) return make_error(ErrorCode::invalid_argument, "critic init_model: already initialised");
  const json& c = init_config_["config"];
  TESSERA_ASSIGN_OR_RETURN(ppo::CriticConfig parsed, ppo::parse_critic_config(c, "critic"));
  TESSERA_ASSIGN_OR_RETURN(config_, ppo::normalize_critic_config(parsed, ppo::DataParallelShape{context().world_size,
                                                                                      parsed.ulysses_sequence_parallel_size}));
  TESSERA_ASSIGN_OR_RETURN(model_, parse_model_section(c.value("model", json()), "critic.model"));
  config_.use_remove_padding = model_.use_remove_padding;
  TESSERA_RETURN_IF_ERROR(check_activation_offload(model_, "critic.model"));
  const std::string backend = init_config_.value("comm_backend", default_comm_backend(context()));
  TESSERA_ASSIGN_OR_RETURN(world_, world_communicator(context(), backend));
  const std::string fsdp_path = "critic.model.fsdp_config";
  TESSERA_ASSIGN_OR_RETURN(c10::ScalarType dtype, fsdp_model_dtype(model_.fsdp_config, fsdp_path));
  models::LoadOptions load;
  load.config_override = model_.override_config;
  load.config_override_key = model_.override_config_key;
  load.dtype = dtype;
  load.score_seed = init_config_.value("seed", uint64_t{0});
  load.device = device();
  // LoRA (verl's critic with lora_rank > 0): the frozen base in the compute dtype when that is
  // narrower (FsdpOptions::frozen_units_in_param_dtype); the adapters' master weights in `dtype`.
  bool base_in_param_dtype = false;
  if (model_.lora.enabled()) {
    TESSERA_ASSIGN_OR_RETURN(c10::ScalarType param_dtype, fsdp_param_dtype(model_.fsdp_config, fsdp_path));
    base_in_param_dtype = c10::elementSize(param_dtype) < c10::elementSize(dtype);
    if (base_in_param_dtype) load.dtype = param_dtype;
  }
  TESSERA_ASSIGN_OR_RETURN(auto model, models::load_value_model(model_.path, load));
  model_config_ = model->config();
  if (model_.lora.enabled()) {
    models::LoraConfig lora = model_.lora;
    lora.seed = init_config_.value("seed", uint64_t{0});  // lora_A's initial values follow the run's seed
    lora.dtype = dtype;
    TESSERA_RETURN_IF_ERROR(models::apply_lora(*model, lora, "critic.model"));
  }
  FsdpBuildOptions b;
  b.fsdp_config = model_.fsdp_config;
  b.fsdp_config_path = fsdp_path;
  b.optim = c.value("optim", json::object());
  if (b.optim.is_null()) b.optim = json::object();
  b.optim_path = "critic.optim";
  b.gradient_checkpointing = model_.gradient_checkpointing;
  b.offload_activations = model_.activation_offload;
  b.offload_activations_key = model_.activation_offload_key;
  b.grad_clip = config_.grad_clip;
  b.fused_layers = model_.use_liger;
  b.frozen_units_in_param_dtype = base_in_param_dtype;
  TESSERA_ASSIGN_OR_RETURN(module_, build_fsdp_module(model, world_, b));
  // Note [Ulysses sequence parallelism]
  TESSERA_ASSIGN_OR_RETURN(auto ulysses, ulysses_group(world_, config_.ulysses_sequence_parallel_size, model_config_,
                                                       "critic.ulysses_sequence_parallel_size",
                                                       config_.use_remove_padding, "critic.model.use_remove_padding"));
  TESSERA_ASSIGN_OR_RETURN(critic_, ppo::DataParallelPPOCritic::create(config_, module_, ppo::make_dp_count_sync(world_),
                                                                       std::move(ulysses)));
  return check_on_device(module_->engine(), device(), context().rank);
}

Result<proto::DataProto> CriticWorker::compute_values(const proto::DataProto& data) {
  TESSERA_RETURN_IF_ERROR(require_init("compute_values"));
  Stopwatch timer;
  TESSERA_ASSIGN_OR_RETURN(auto scope,
                           OffloadScope::enter(module_->engine(), module_->engine().options().param_offload));
  proto::DataProto d = data;
  json& meta = d.meta_info();
  if (config_.forward_micro_batch_size_per_gpu) meta["micro_batch_size"] = *config_.forward_micro_batch_size_per_gpu;
  meta["max_token_len"] = config_.forward_max_token_len_per_gpu.value_or(config_.ppo_max_token_len_per_gpu);
  meta["use_dynamic_bsz"] = config_.use_dynamic_bsz;
  Result<at::Tensor> values = critic_->compute_values(d);
  if (!values.ok()) return name_memory_keys(values.status(), micro_batch_key("critic.forward", config_.use_dynamic_bsz));
  TESSERA_RETURN_IF_ERROR(scope->exit());
  proto::TensorDict t;
  t.insert_or_assign("values", *values);
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto out, proto::DataProto::from_dict(std::move(t)));
  record_call_metrics(out, "compute_values", timer.seconds());
  return out;
}

Result<proto::DataProto> CriticWorker::update_critic(const proto::DataProto& data) {
  TESSERA_RETURN_IF_ERROR(require_init("update_critic"));
  fsdp::FsdpModule& engine = module_->engine();
  TESSERA_ASSIGN_OR_RETURN(auto scope, OffloadScope::enter(engine, engine.options().param_offload));
  Stopwatch timer;
  Result<ppo::Metrics> metrics = critic_->update_critic(data);
  if (!metrics.ok()) {
    std::string keys = micro_batch_key("critic.ppo", config_.use_dynamic_bsz);
    if (!model_.gradient_checkpointing) keys += ", or set critic.model.enable_gradient_checkpointing=true";
    return name_memory_keys(metrics.status(), keys);
  }
  const double seconds = timer.seconds();
  engine.lr_scheduler_step();
  TESSERA_RETURN_IF_ERROR(scope->exit());
  json m = ppo::metrics_to_json(*metrics);
  m["critic/lr"] = engine.current_lr();  // verl v0.5.0 reads get_last_lr() after stepping
  m["perf/mfu/critic"] = ppo::model_flops_utilization(model_config_, data.meta_info(), config_.ppo_epochs, seconds,
                                                      device(), context().world_size);
  add_device_memory_metrics(m, device());
  m["perf/cpu_memory_used_gb"] = cpu_memory_used_gb();
  m["timing_s/update_critic_worker"] = seconds;
  return metrics_proto(std::move(m));
}

Status CriticWorker::save_checkpoint(const SaveCheckpointArgs& args) {
  TESSERA_RETURN_IF_ERROR(require_init("save_checkpoint"));
  CheckpointFiles adapter;
  if (model_.lora.enabled()) {
    TESSERA_ASSIGN_OR_RETURN(adapter, lora_adapter_files(*module_, model_.lora, "critic.model", model_.path, context().rank));
  }
  return save_worker_checkpoint(module_->engine(), args, model_.path, model_config_, context().rank, rotation_, adapter);
}

Status CriticWorker::load_checkpoint(const LoadCheckpointArgs& args) {
  TESSERA_RETURN_IF_ERROR(require_init("load_checkpoint"));
  return load_worker_checkpoint(module_->engine(), args, context().rank, *world_);
}

}  // namespace tessera::workers
