// actor_rollout_ref_worker.cpp: ActorRolloutRefWorker (see actor_rollout_ref_worker.hpp).
#include "workers/roles/actor_rollout_ref_worker.hpp"

#include <algorithm>
#include <filesystem>
#include <utility>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "workers/fsdp/checkpoint.hpp"
#include "workers/models/lora.hpp"
#include "workers/models/model_io.hpp"
#include "workers/ppo/flops_counter.hpp"
#include "workers/ppo/ppo_inputs.hpp"
#include "workers/rollout/tensor_parallel.hpp"
#include "workers/tokenizer/chat_template.hpp"
#include "workers/tokenizer/tokenizer.hpp"

namespace tessera::workers {

using json = nlohmann::json;
using dispatch::Args;
namespace Dispatch = dispatch::Dispatch;
using dispatch::Value;

ActorRolloutRefWorker::ActorRolloutRefWorker(runtime::WorkerContext context, json init_config, std::string role)
    : WorkerBase(std::move(context)), init_config_(std::move(init_config)), role_(std::move(role)) {}

Result<std::unique_ptr<ActorRolloutRefWorker>> ActorRolloutRefWorker::create(const runtime::WorkerContext& context,
                                                                             const json& init_config) {
  // Only the role is checked here; the rest is parsed (and refused) by init_model.
  const json role = init_config.is_object() ? init_config.value("role", json()) : json();
  const auto& roles = actor_rollout_ref_roles();
  if (!role.is_string() || std::find(roles.begin(), roles.end(), role.get<std::string>()) == roles.end()) {
    return make_error(ErrorCode::invalid_argument,
                      "actor_rollout_ref init config: role {} is not one of actor, rollout, ref, actor_rollout, "
                      "actor_rollout_ref",
                      role.dump());
  }
  std::unique_ptr<ActorRolloutRefWorker> w(new ActorRolloutRefWorker(context, init_config, role.get<std::string>()));
  w->register_methods();
  return w;
}

void ActorRolloutRefWorker::register_methods() {
  auto proto_method = [this](const char* name, Result<proto::DataProto> (ActorRolloutRefWorker::*fn)(const proto::DataProto&)) {
    Status st = methods().add(name, Dispatch::DP_COMPUTE_PROTO, [this, name, fn](const Args& args) -> Result<Value> {
      return run_on_device(device(), args, name, [this, fn](const proto::DataProto& data) { return (this->*fn)(data); });
    });
    if (!st.ok()) spdlog::error("ActorRolloutRefWorker: {}", st.to_string());
  };
  (void)methods().add("init_model", Dispatch::ONE_TO_ALL, [this](const Args&) -> Result<Value> {
    TESSERA_RETURN_IF_ERROR(init_model());
    return Value(json());
  });
  proto_method("generate_sequences", &ActorRolloutRefWorker::generate_sequences);
  proto_method("compute_log_prob", &ActorRolloutRefWorker::compute_log_prob);
  proto_method("compute_ref_log_prob", &ActorRolloutRefWorker::compute_ref_log_prob);
  proto_method("update_actor", &ActorRolloutRefWorker::update_actor);
  register_split_methods();
  register_checkpoint_methods(*this);
}

Status ActorRolloutRefWorker::require(bool has, const char* method, const char* what) const {
  if (!initialized_) {
    return make_error(ErrorCode::invalid_argument, "{}: init_model has not run on rank {}", method, context().rank);
  }
  if (has) return Status();
  return make_error(ErrorCode::invalid_argument, "{}: role '{}' has no {}", method, role_, what);
}

// ---- init_model ---------------------------------------------------------------------------------

Status ActorRolloutRefWorker::init_model() {
  if (initialized_) return make_error(ErrorCode::invalid_argument, "init_model: already initialised");
  TESSERA_ASSIGN_OR_RETURN(config_, parse_actor_rollout_ref_config(init_config_, context().world_size));
  if (config_.is_actor) TESSERA_RETURN_IF_ERROR(check_activation_offload(config_.model, "actor_rollout_ref.model"));
  const std::string backend = init_config_.value("comm_backend", default_comm_backend(context()));
  TESSERA_ASSIGN_OR_RETURN(world_, world_communicator(context(), backend, config_.nccl_timeout));
  TESSERA_ASSIGN_OR_RETURN(model_config_, models::load_model_config(config_.model.path, config_.model.override_config,
                                                                    config_.model.override_config_key));
  // The generation tokens fall back to the checkpoint's own config.json, as verl's
  // get_generation_config reads it (without the override).
  TESSERA_ASSIGN_OR_RETURN(models::ModelConfig file_config, models::load_model_config(config_.model.path));
  TESSERA_ASSIGN_OR_RETURN(tokens_, generation_tokens(config_.model.path, file_config));
  const bool split_rollout = config_.is_rollout && !config_.is_actor && config_.rollout.placement == "split";
  // Note [Ulysses sequence parallelism]: the actor's groups, which a reference of the same size shares.
  if (config_.is_actor || (config_.is_ref && config_.ref.ulysses_sequence_parallel_size > 1)) {
    TESSERA_ASSIGN_OR_RETURN(ulysses_, ulysses_group(world_, config_.ulysses_sequence_parallel_size, model_config_,
                                                     "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
                                                     config_.model.use_remove_padding,
                                                     "actor_rollout_ref.model.use_remove_padding"));
  }
  if (split_rollout) {
    TESSERA_RETURN_IF_ERROR(build_split_rollout());
  } else if (config_.is_actor || config_.is_rollout) {
    TESSERA_RETURN_IF_ERROR(build_actor_rollout());
  }
  if (config_.is_rollout && config_.rollout.agent_loop_config_path) {
    TESSERA_RETURN_IF_ERROR(build_agent_loops());
  } else if (config_.is_rollout && (config_.rollout.multi_turn.enable || config_.rollout.mode == "async")) {
    TESSERA_RETURN_IF_ERROR(build_multi_turn());
  }
  // verl (ref_in_actor): with LoRA the reference policy is the actor with its adapters disabled.
  if (config_.is_ref && !lora_actor()) TESSERA_RETURN_IF_ERROR(build_ref());
  if (actor_module_) TESSERA_RETURN_IF_ERROR(check_on_device(actor_module_->engine(), device(), context().rank));
  if (ref_module_) TESSERA_RETURN_IF_ERROR(check_on_device(ref_module_->engine(), device(), context().rank));
  initialized_ = true;
  return Status();
}

Status ActorRolloutRefWorker::build_actor_rollout() {
  const std::string fsdp_path = "actor_rollout_ref.actor.fsdp_config";
  TESSERA_ASSIGN_OR_RETURN(c10::ScalarType dtype, fsdp_model_dtype(config_.actor_fsdp_config, fsdp_path));
  models::LoadOptions load;
  load.config_override = config_.model.override_config;
  load.config_override_key = config_.model.override_config_key;
  load.dtype = dtype;
  load.device = device();
  // LoRA: the frozen base in the compute dtype when that is narrower and is also what the rollout
  // serves (FsdpOptions::frozen_units_in_param_dtype); the adapters' master weights in `dtype`.
  bool base_in_param_dtype = false;
  if (lora_actor()) {
    TESSERA_ASSIGN_OR_RETURN(c10::ScalarType param_dtype, fsdp_param_dtype(config_.actor_fsdp_config, fsdp_path));
    TESSERA_ASSIGN_OR_RETURN(c10::ScalarType served, rollout_weight_dtype());
    base_in_param_dtype = c10::elementSize(param_dtype) < c10::elementSize(dtype) && served == param_dtype;
    if (base_in_param_dtype) load.dtype = param_dtype;
  }
  TESSERA_ASSIGN_OR_RETURN(auto model, models::load_causal_lm(config_.model.path, load));
  if (lora_actor()) {
    models::LoraConfig lora = config_.model.lora;
    lora.seed = config_.seed;  // lora_A's initial values follow the run's seed
    lora.dtype = dtype;
    TESSERA_RETURN_IF_ERROR(models::apply_lora(*model, lora, "actor_rollout_ref.model"));
  }
  FsdpBuildOptions b;
  b.fsdp_config = config_.actor_fsdp_config;
  b.fsdp_config_path = fsdp_path;
  b.optim = config_.is_actor ? config_.actor_optim : json();  // a standalone rollout has no optimizer
  b.optim_path = "actor_rollout_ref.actor.optim";
  b.gradient_checkpointing = config_.model.gradient_checkpointing;
  b.offload_activations = config_.model.activation_offload;  // FsdpBuildOptions: trained modules only
  b.offload_activations_key = config_.model.activation_offload_key;
  b.grad_clip = config_.actor.grad_clip;
  b.fused_layers = config_.model.use_liger;
  b.frozen_units_in_param_dtype = base_in_param_dtype;
  TESSERA_ASSIGN_OR_RETURN(actor_module_, build_fsdp_module(model, world_, b));
  if (config_.is_actor) {
    config_.actor.use_remove_padding = config_.model.use_remove_padding;
    TESSERA_ASSIGN_OR_RETURN(actor_, ppo::DataParallelPPOActor::create(config_.actor, actor_module_,
                                                                       ppo::make_dp_count_sync(world_), ulysses_));
  }
  if (config_.is_rollout) {
    // verl: the rollout mesh is (dp, infer_tp) over the world; the engine samples with a per-dp-rank
    // seed so TP peers agree; the generation RNG of the sharding manager is seeded with dp_rank + 1000.
    const int64_t tp = config_.rollout.tensor_model_parallel_size;
    const uint64_t dp_rank = static_cast<uint64_t>(context().rank / tp);
    rollout::ShardingManagerOptions o;
    if (tp > 1) {
      // The infer_tp dimension of verl's (dp, infer_tp) mesh: consecutive ranks. Its dp groups are
      // never used, so they are not built (each would be one more NCCL communicator per GPU).
      std::vector<int> members(static_cast<size_t>(tp));
      for (int64_t i = 0; i < tp; ++i) {
        members[static_cast<size_t>(i)] = static_cast<int>(static_cast<int64_t>(dp_rank) * tp + i);
      }
      TESSERA_ASSIGN_OR_RETURN(rollout_tp_, world_->new_subgroup(members, "infer_tp"));
      o.tp_group = rollout_tp_;
    }
    o.config = config_.rollout;
    o.engine = engine_options(dp_rank);
    o.generation_seed = dp_rank + 1000;
    if (lora_actor()) o.lora_scaling = config_.model.lora.scaling();
    TESSERA_ASSIGN_OR_RETURN(sharding_, rollout::FsdpShardingManager::create(actor_module_->engine(), model_config_, o));
  }
  return Status();
}

// verl: the engine samples with a per-dp-rank seed (dp_rank + 1000, plus rollout.seed or the
// trainer seed), so TP peers agree and the colocated and split rollouts draw alike.
rollout::EngineOptions ActorRolloutRefWorker::engine_options(uint64_t dp_rank) const {
  rollout::EngineOptions eo;
  eo.seed = dp_rank + 1000 + config_.rollout.seed.value_or(config_.seed);
  return eo;
}

Status ActorRolloutRefWorker::build_ref() {
  const std::string fsdp_path = "actor_rollout_ref.ref.fsdp_config";
  const json fsdp_config = frozen_model_fsdp_config(config_.ref.fsdp_config);  // verl: the reference in bf16
  TESSERA_ASSIGN_OR_RETURN(c10::ScalarType dtype, fsdp_model_dtype(fsdp_config, fsdp_path));
  models::LoadOptions load;
  load.config_override = config_.model.override_config;
  load.config_override_key = config_.model.override_config_key;
  load.dtype = dtype;
  load.device = device();
  TESSERA_ASSIGN_OR_RETURN(auto model, models::load_causal_lm(config_.model.path, load));
  FsdpBuildOptions b;
  b.fsdp_config = fsdp_config;
  b.fsdp_config_path = fsdp_path;
  b.force_param_offload = true;  // verl: the reference policy is always CPU-offloaded
  b.fused_layers = config_.model.use_liger;
  TESSERA_ASSIGN_OR_RETURN(ref_module_, build_fsdp_module(model, world_, b));
  // The reference runs only compute_log_prob, whose batching comes from meta_info; its actor
  // config only has to be valid.
  ppo::ActorConfig ref_config;
  ref_config.use_dynamic_bsz = true;
  ref_config.ppo_mini_batch_size = 1;
  ref_config.use_remove_padding = config_.model.use_remove_padding;
  // 1: each rank scores its own rows whole; else the actor's groups (parse_actor_rollout_ref_config).
  ref_config.ulysses_sequence_parallel_size = config_.ref.ulysses_sequence_parallel_size;
  TESSERA_ASSIGN_OR_RETURN(ref_policy_, ppo::DataParallelPPOActor::create(
                                            ref_config, ref_module_, ppo::make_dp_count_sync(world_),
                                            ref_config.ulysses_sequence_parallel_size > 1 ? ulysses_ : nullptr));
  return Status();
}

// ---- Log-prob passes ----------------------------------------------------------------------------

Result<ppo::LogProbOutput> ActorRolloutRefWorker::log_probs(ppo::DataParallelPPOActor& actor, const proto::DataProto& data,
                                                       const std::optional<int64_t>& micro_batch_size,
                                                       bool use_dynamic_bsz, int64_t max_token_len,
                                                       bool calculate_entropy) {
  proto::DataProto d = data;  // shares the tensors; only meta_info changes
  json& meta = d.meta_info();
  if (micro_batch_size) meta["micro_batch_size"] = *micro_batch_size;
  meta["max_token_len"] = max_token_len;
  meta["use_dynamic_bsz"] = use_dynamic_bsz;
  meta["temperature"] = config_.rollout.temperature;  // verl: always the rollout temperature
  return actor.compute_log_prob(d, calculate_entropy);
}

Result<proto::DataProto> ActorRolloutRefWorker::compute_log_prob(const proto::DataProto& data) {
  Stopwatch timer;
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto out, old_log_probs(data));
  record_call_metrics(out, "compute_log_prob", timer.seconds());
  return out;
}

Result<proto::DataProto> ActorRolloutRefWorker::old_log_probs(const proto::DataProto& data, bool calculate_entropy) {
  TESSERA_RETURN_IF_ERROR(require(actor_ != nullptr, "compute_log_prob", "actor"));
  // verl: meta_info.is_lora runs the actor with its adapters disabled (the reference policy).
  const json& is_lora = data.meta_info().contains("is_lora") ? data.meta_info()["is_lora"] : json(false);
  if (!is_lora.is_boolean()) {
    return make_error(ErrorCode::invalid_argument, "compute_log_prob: meta_info.is_lora = {}: expected true or false",
                      is_lora.dump());
  }
  const bool base_model = is_lora.get<bool>();
  if (base_model && !lora_actor()) {
    return make_error(ErrorCode::invalid_argument,
                      "compute_log_prob: meta_info.is_lora on an actor without LoRA adapters "
                      "(actor_rollout_ref.model.lora_rank = 0)");
  }
  const auto& fc = actor_module_->engine().options();
  TESSERA_ASSIGN_OR_RETURN(auto scope, OffloadScope::enter(actor_module_->engine(), fc.param_offload));
  const auto& r = config_.rollout;
  Result<ppo::LogProbOutput> lp = [&] {
    struct AdaptersOff {  // the adapters are on again however the pass ends
      models::PretrainedModel* model;
      ~AdaptersOff() {
        if (model) models::set_lora_enabled(*model, true);
      }
    } off{base_model ? &actor_module_->model() : nullptr};
    if (off.model) models::set_lora_enabled(*off.model, false);
    return log_probs(*actor_, data, r.log_prob_micro_batch_size_per_gpu, r.log_prob_use_dynamic_bsz,
                     r.log_prob_max_token_len_per_gpu, calculate_entropy);
  }();
  if (!lp.ok()) {
    return name_memory_keys(lp.status(), micro_batch_key("actor_rollout_ref.rollout.log_prob", r.log_prob_use_dynamic_bsz));
  }
  TESSERA_RETURN_IF_ERROR(scope->exit());
  proto::TensorDict t;
  t.insert_or_assign("old_log_probs", lp->log_probs);
  if (calculate_entropy) t.insert_or_assign("entropys", lp->entropys);
  return proto::DataProto::from_dict(std::move(t), {}, json{{"temperature", r.temperature}});
}

Result<proto::DataProto> ActorRolloutRefWorker::compute_ref_log_prob(const proto::DataProto& data) {
  Stopwatch timer;
  if (ref_policy_ == nullptr && actor_ != nullptr && lora_actor()) {
    // verl's ref_in_actor: the actor with its adapters disabled, batched as compute_log_prob.
    proto::DataProto d = data;  // shares the tensors; only meta_info changes
    d.meta_info()["is_lora"] = true;
    TESSERA_ASSIGN_OR_RETURN(proto::DataProto lp, old_log_probs(d, /*calculate_entropy=*/false));
    TESSERA_ASSIGN_OR_RETURN(at::Tensor ref, lp.tensor("old_log_probs"));
    proto::TensorDict t;
    t.insert_or_assign("ref_log_prob", ref);
    TESSERA_ASSIGN_OR_RETURN(proto::DataProto out, proto::DataProto::from_dict(std::move(t)));
    record_call_metrics(out, "compute_ref_log_prob", timer.seconds());
    return out;
  }
  TESSERA_RETURN_IF_ERROR(require(ref_policy_ != nullptr, "compute_ref_log_prob", "reference model"));
  TESSERA_ASSIGN_OR_RETURN(auto scope, OffloadScope::enter(ref_module_->engine(), true));
  const auto& ref = config_.ref;
  Result<ppo::LogProbOutput> lp = log_probs(*ref_policy_, data, ref.log_prob_micro_batch_size_per_gpu,
                                            ref.log_prob_use_dynamic_bsz, ref.log_prob_max_token_len_per_gpu,
                                            /*calculate_entropy=*/false);
  if (!lp.ok()) {
    return name_memory_keys(lp.status(), micro_batch_key("actor_rollout_ref.ref.log_prob", ref.log_prob_use_dynamic_bsz));
  }
  TESSERA_RETURN_IF_ERROR(scope->exit());
  proto::TensorDict t;
  t.insert_or_assign("ref_log_prob", lp->log_probs);
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto out, proto::DataProto::from_dict(std::move(t)));
  record_call_metrics(out, "compute_ref_log_prob", timer.seconds());
  return out;
}

// ---- update_actor -------------------------------------------------------------------------------

Result<proto::DataProto> ActorRolloutRefWorker::update_actor(const proto::DataProto& data) {
  TESSERA_RETURN_IF_ERROR(require(actor_ != nullptr, "update_actor", "actor"));
  fsdp::FsdpModule& engine = actor_module_->engine();
  TESSERA_ASSIGN_OR_RETURN(auto scope, OffloadScope::enter(engine, engine.options().param_offload));
  Stopwatch timer;
  Result<ppo::Metrics> metrics = actor_->update_policy(data);
  if (!metrics.ok()) {
    std::string keys = micro_batch_key("actor_rollout_ref.actor.ppo", config_.actor.use_dynamic_bsz);
    if (!config_.model.gradient_checkpointing) keys += ", or set actor_rollout_ref.model.enable_gradient_checkpointing=true";
    if (!engine.options().optimizer_offload) keys += ", or set actor_rollout_ref.actor.fsdp_config.optimizer_offload=true";
    return name_memory_keys(metrics.status(), keys);
  }
  const double seconds = timer.seconds();
  const double lr = engine.current_lr();
  engine.lr_scheduler_step();  // verl: once per update_actor call
  TESSERA_RETURN_IF_ERROR(scope->exit());
  json m = ppo::metrics_to_json(*metrics);
  m["actor/lr"] = lr;
  m["perf/mfu/actor"] = ppo::model_flops_utilization(model_config_, data.meta_info(), config_.actor.ppo_epochs,
                                                     seconds, device(), context().world_size);
  add_device_memory_metrics(m, device());
  m["perf/cpu_memory_used_gb"] = cpu_memory_used_gb();
  m["timing_s/update_policy"] = seconds;
  return metrics_proto(std::move(m));
}

// ---- generate_sequences -------------------------------------------------------------------------

// The multi-turn rollout (rollout.multi_turn.enable, or mode=async's agent loops) renders prompts
// as the driver's dataset does (the model's tokenizer, its
// chat template or custom_chat_template, data.apply_chat_template_kwargs passed in the init
// config), now with the tools' schemas.
Status ActorRolloutRefWorker::build_multi_turn() {
  const std::string key = "actor_rollout_ref.rollout.multi_turn";
  auto tok = tokenizer::Tokenizer::from_dir_as_verl(config_.model.path);
  if (!tok.ok()) return tok.status().with_context(key + ": the model's tokenizer");
  const json& model = init_config_["config"].value("model", json::object());
  std::string template_name = "auto";
  if (auto it = model.find("custom_chat_template"); it != model.end() && it->is_string()) template_name = *it;
  auto chat = tokenizer::ChatTemplate::from_name(template_name, tok->config(),
                                                 init_config_.value("chat_template_kwargs", json::object()));
  if (!chat.ok()) return chat.status().with_context(key + ": the chat template");
  std::unique_ptr<rollout::ToolSet> tools;  // the agent loops may run without tools
  const rollout::MultiTurnConfig& mt = config_.rollout.multi_turn;
  if (mt.tool_config_path || mt.interaction_config_path) {
    rollout::ToolHostOptions options;
    options.config_path = mt.tool_config_path.value_or("");
    options.interaction_config_path = mt.interaction_config_path.value_or("");
    options.timeout = std::chrono::milliseconds(static_cast<int64_t>(config_.rollout.multi_turn.tool_timeout_s * 1000));
    if (rollout_tp_) {  // the TP peers run the same conversations: rank 0 runs the tools for all
      Result<std::unique_ptr<rollout::ToolHost>> host =
          rollout_tp_->rank() == 0 ? rollout::ToolHost::start(options) : std::unique_ptr<rollout::ToolHost>();
      TESSERA_ASSIGN_OR_RETURN(tools, rollout::relay_tools(rollout_tp_, std::move(host), options.timeout));
    } else {
      TESSERA_ASSIGN_OR_RETURN(tools, rollout::ToolHost::start(options));
    }
  }
  TESSERA_ASSIGN_OR_RETURN(multi_turn_, rollout::MultiTurnRollout::create(
                                            config_.rollout, std::make_shared<const tokenizer::Tokenizer>(std::move(*tok)),
                                            std::make_shared<const tokenizer::ChatTemplate>(std::move(*chat)),
                                            std::move(tools)));
  return Status();
}

// The user's agent loops (agent.agent_loop_config_path) and verl's own, in a Python host that
// gets the whole trainer config (the loops' trainer_config) from the init config. With rollout TP
// the group's rank 0 hosts them and relays their requests to its peers.
Status ActorRolloutRefWorker::build_agent_loops() {
  rollout::AgentHostOptions options;
  options.agent_loop_config_path = *config_.rollout.agent_loop_config_path;
  if (!init_config_.contains("trainer_config") || !init_config_["trainer_config"].is_object()) {
    return make_error(ErrorCode::invalid_argument, "actor_rollout_ref.rollout.agent.agent_loop_config_path: the "
                      "worker's init config has no trainer_config for the loops (the driver passes the whole config)");
  }
  options.trainer_config = init_config_["trainer_config"];
  options.tokenizer_path = config_.model.path;
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(config_.rollout.multi_turn.tool_timeout_s * 1000));
  std::unique_ptr<rollout::AgentLoops> loops;
  if (rollout_tp_) {
    Result<std::unique_ptr<rollout::AgentHost>> host =
        rollout_tp_->rank() == 0 ? rollout::AgentHost::start_host(options) : std::unique_ptr<rollout::AgentHost>();
    TESSERA_ASSIGN_OR_RETURN(loops, rollout::relay_agent_loops(rollout_tp_, std::move(host), options.timeout));
  } else {
    TESSERA_ASSIGN_OR_RETURN(loops, rollout::AgentHost::start_host(options));
  }
  TESSERA_ASSIGN_OR_RETURN(agent_loops_,
                           rollout::AgentLoopRollout::create(config_.rollout, std::move(loops), model_config_.vocab_size,
                                                             model_config_.context_length()));
  return Status();
}

Result<proto::DataProto> ActorRolloutRefWorker::generate_on(rollout::RolloutEngine& engine,
                                                            const proto::DataProto& prompts) {
  if (agent_loops_) return agent_loops_->generate(engine, prompts);
  if (multi_turn_) return multi_turn_->generate(engine, prompts);
  return engine.generate_sequences(prompts);
}

// With rollout TP, verl's preprocess/postprocess: the TP peers all-gather their prompts, each
// generates the whole group's batch (identically: same weights after the all-reduces, same seed),
// and keeps its own rows.
Result<proto::DataProto> ActorRolloutRefWorker::generate_with_sharding(const proto::DataProto& prompts,
                                                                       double& reshard_seconds) {
  proto::DataProto in = prompts;
  std::vector<int64_t> offsets;
  if (rollout_tp_) {
    TESSERA_ASSIGN_OR_RETURN(in, rollout::all_gather_data_proto(*rollout_tp_, prompts, offsets));
  }
  TESSERA_RETURN_IF_ERROR(sharding_->enter());
  reshard_seconds = sharding_->last_reshard().reshard_seconds;
  Result<proto::DataProto> out = generate_on(sharding_->engine(), in);
  Status exited = sharding_->exit();
  if (!out.ok()) return out.status();
  if (!exited.ok()) return exited;
  if (!rollout_tp_) return out;
  const auto r = static_cast<size_t>(rollout_tp_->rank());
  return out->slice(offsets[r], offsets[r + 1]);
}

Result<proto::DataProto> ActorRolloutRefWorker::generate_sequences(const proto::DataProto& prompts) {
  TESSERA_RETURN_IF_ERROR(require(sharding_ != nullptr || split_engine_ != nullptr, "generate_sequences", "rollout"));
  proto::DataProto in = prompts;
  in.meta_info()["eos_token_id"] = tokens_.eos_token_ids;
  in.meta_info()["pad_token_id"] = tokens_.pad_token_id;
  Stopwatch timer;
  double reshard = 0;  // split placement: the trainer times the weight sync itself
  proto::DataProto out;
  if (split_engine_) {
    if (importer_->version() < 0) {
      return make_error(ErrorCode::invalid_argument, "generate_sequences: the split-placement rollout on rank {} has no "
                        "weights yet (load_rollout_weights runs first)", context().rank);
    }
    TESSERA_ASSIGN_OR_RETURN(out, generate_on(*split_engine_, in));
  } else {
    TESSERA_ASSIGN_OR_RETURN(out, generate_with_sharding(in, reshard));
  }
  const double generate_seconds = timer.seconds();
  const rollout::GenerationStats& stats = agent_loops_   ? agent_loops_->last_stats().generation
                                          : multi_turn_   ? multi_turn_->last_stats().generation
                                          : split_engine_ ? split_engine_->last_stats()
                                                          : sharding_->engine().last_stats();
  const json& recompute = prompts.meta_info().contains("recompute_log_prob") ? prompts.meta_info()["recompute_log_prob"] : json(true);
  if (actor_ && out.size() > 0 && !(recompute.is_boolean() && !recompute.get<bool>())) {
    // The seed: "the actor model will recompute the old log prob for the generated response".
    TESSERA_ASSIGN_OR_RETURN(proto::DataProto lp, old_log_probs(out));
    TESSERA_ASSIGN_OR_RETURN(at::Tensor old, lp.tensor("old_log_probs"));
    TESSERA_RETURN_IF_ERROR(out.set_tensor("old_log_probs", old));
    out.meta_info()["temperature"] = config_.rollout.temperature;  // as compute_log_prob's output
  }
  out.meta_info()["metrics"] = json{{"timing_s/reshard", reshard},
                                    {"timing_s/generate_sequences", generate_seconds},
                                    {"perf/cpu_memory_used_gb", cpu_memory_used_gb()},
                                    // Prefill work done and saved by sharing it between samples of a prompt.
                                    {"rollout/prefill_tokens", stats.prefill_tokens},
                                    {"rollout/shared_prompt_tokens", stats.shared_prompt_tokens},
                                    {"rollout/prefill_tflops", stats.prefill_flops / 1e12},
                                    {"rollout/shared_prefill_tflops", stats.shared_prefill_flops / 1e12},
                                    // ... and by reusing an earlier turn's blocks (multi-turn, agent loops).
                                    {"rollout/cached_prompt_tokens", stats.cached_prompt_tokens},
                                    {"rollout/cached_prefill_tflops", stats.cached_prefill_flops / 1e12},
                                    // The paged KV cache: its size, the prompt blocks held once for
                                    // several samples, and the decode steps replayed from CUDA graphs.
                                    {"rollout/kv_cache_gb", static_cast<double>(stats.kv_cache_bytes) / 1e9},
                                    {"rollout/shared_kv_blocks", stats.shared_kv_blocks},
                                    {"rollout/preemptions", stats.preemptions},
                                    {"rollout/graph_decode_steps", stats.graph_replays}};
  if (multi_turn_) {
    // Tool use per sequence (ranks hold equal shares, so the trainer's mean over ranks is the
    // batch's): assistant turns, calls made, calls whose tool raised, blocks that did not parse.
    const rollout::MultiTurnStats& mt = multi_turn_->last_stats();
    const double rows = static_cast<double>(std::max<int64_t>(mt.rows, 1));
    json& m = out.meta_info()["metrics"];
    m["rollout/assistant_turns_mean"] = static_cast<double>(mt.assistant_turns) / rows;
    m["rollout/tool_calls_mean"] = static_cast<double>(mt.tool_calls) / rows;
    m["rollout/tool_errors_mean"] = static_cast<double>(mt.tool_errors) / rows;
    m["rollout/malformed_tool_calls_mean"] = static_cast<double>(mt.malformed_calls) / rows;
    m["timing_s/tool_calls"] = mt.tool_seconds;
  }
  if (agent_loops_) {
    const rollout::AgentLoopStats& al = agent_loops_->last_stats();
    json& m = out.meta_info()["metrics"];
    for (const auto& [k, v] : al.metrics.items()) m[k] = v;
    m["rollout/agent_requests"] = al.requests;          // the loops' generate() calls
    m["rollout/agent_engine_calls"] = al.engine_calls;  // the engine calls they were batched into
  }
  return out;
}

// ---- Checkpoints --------------------------------------------------------------------------------

Status ActorRolloutRefWorker::save_checkpoint(const SaveCheckpointArgs& args) {
  TESSERA_RETURN_IF_ERROR(require(actor_ != nullptr, "save_checkpoint", "actor"));
  CheckpointFiles adapter;
  if (lora_actor()) {
    TESSERA_ASSIGN_OR_RETURN(adapter, lora_adapter_files(*actor_module_, config_.model.lora, "actor_rollout_ref.model",
                                                         config_.model.path, context().rank));
  }
  TESSERA_RETURN_IF_ERROR(save_worker_checkpoint(actor_module_->engine(), args, config_.model.path, model_config_,
                                                 context().rank, rotation_, adapter));
  if (!config_.save_hf_model || context().rank != 0) return Status();
  // save_contents lists hf_model: a complete HF directory beside the shards (config.json and the
  // tokenizer files are already there); LoRA adapters are merged into it.
  return fsdp::export_hf(args.local_path, (std::filesystem::path(args.local_path) / "huggingface").string());
}

Status ActorRolloutRefWorker::load_checkpoint(const LoadCheckpointArgs& args) {
  TESSERA_RETURN_IF_ERROR(require(actor_ != nullptr, "load_checkpoint", "actor"));
  return load_worker_checkpoint(actor_module_->engine(), args, context().rank, *world_);
}

}  // namespace tessera::workers
