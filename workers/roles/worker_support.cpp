// worker_support.cpp: see worker_support.hpp.
#include "workers/roles/worker_support.hpp"


#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include <unistd.h>

#include <ATen/record_function.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "proto/device.hpp"
#include "runtime/collective/device_mesh.hpp"
#include "workers/fsdp/checkpoint.hpp"
#include "workers/fsdp/options.hpp"
#include "workers/fsdp/units.hpp"
#include "workers/models/fused_layers.hpp"
#include "workers/ppo/ppo_inputs.hpp"

namespace tessera::workers {

namespace fs = std::filesystem;
using json = nlohmann::json;

// ---- Communicator ---------------------------------------------------------------------------------

std::string default_comm_backend(const runtime::WorkerContext& context) {
  return context.device.rfind("cuda", 0) == 0 ? "nccl" : "gloo";
}

namespace {

std::mutex& comm_cache_mutex() {
  static std::mutex mu;
  return mu;
}

std::map<std::string, std::weak_ptr<collective::Communicator>>& comm_cache() {
  static std::map<std::string, std::weak_ptr<collective::Communicator>> cache;
  return cache;
}

// The address Gloo binds and gives its peers. On a node agent that is the host the agent
// advertises (--advertise-host): what other nodes reach it by. Resolving this machine's own name
// instead, Gloo's default, gives the loopback wherever the name maps to 127.0.1.1 (Debian's
// /etc/hosts) or does not resolve, and ranks on other hosts then cannot connect. Embedded
// workers carry this machine's name, and a wildcard listen address is no address to give peers:
// both keep Gloo's default.
std::string gloo_bind_host(const std::string& host) {
  char name[256] = {};
  if (host.empty() || host == "0.0.0.0" || host == "::") return "";
  if (::gethostname(name, sizeof(name) - 1) == 0 && host == name) return "";
  return host;
}

}  // namespace

Result<std::shared_ptr<collective::Communicator>> world_communicator(const runtime::WorkerContext& context,
                                                                     const std::string& backend,
                                                                     std::chrono::milliseconds timeout) {
  collective::CommunicatorOptions o;
  if (timeout.count() > 0) o.timeout = timeout;
  o.rank = context.rank;
  o.world_size = context.world_size;
  o.master_addr = context.master_addr.empty() ? "127.0.0.1" : context.master_addr;
  o.master_port = context.master_port;
  o.group_name = context.group.empty() ? "world" : context.group;
  o.backend = backend;
  o.gloo_hostname = gloo_bind_host(context.host);
  // NCCL runs on the worker's own device (not a guess from the rank).
  if (auto device = proto::parse_device(context.device); device.ok() && device->is_cuda()) o.cuda_device = device->index();
  if (context.world_size == 1) {
    // A group of one never talks to anyone: an in-process group private to this worker.
    static std::atomic<uint64_t> next{0};
    o.backend = "inproc";
    o.inproc_key = fmt::format("solo-{}-{}", context.group, next++);
  }
  const std::string key = fmt::format("{}|{}:{}|{}|{}/{}", o.backend, o.master_addr, o.master_port, o.group_name,
                                      o.rank, o.world_size);
  {
    std::lock_guard<std::mutex> lock(comm_cache_mutex());
    if (context.world_size > 1) {
      if (auto live = comm_cache()[key].lock()) return live;
    }
  }
  auto comm = collective::make_communicator(o);
  if (!comm.ok()) {
    return comm.status().with_context(fmt::format("world communicator of group '{}' rank {}", context.group,
                                                  context.rank));
  }
  std::lock_guard<std::mutex> lock(comm_cache_mutex());
  if (context.world_size > 1) comm_cache()[key] = *comm;
  return *comm;
}

Result<std::shared_ptr<ppo::UlyssesGroup>> ulysses_group(const std::shared_ptr<collective::Communicator>& world,
                                                         int64_t size, const models::ModelConfig& model,
                                                         const std::string& key, bool use_remove_padding,
                                                         const std::string& padding_key) {
  TESSERA_RETURN_IF_ERROR(models::check_sequence_parallel(model, size, key));
  if (size == 1) return std::shared_ptr<ppo::UlyssesGroup>();
  if (!use_remove_padding) {
    return make_error(ErrorCode::invalid_argument, "{} = {} > 1 requires {} = true", key, size, padding_key);
  }
  if (world->size() % size != 0) {
    return make_error(ErrorCode::invalid_argument, "{} = {} must divide the worker group's {} ranks", key, size,
                      world->size());
  }
  // verl's (dp, sp) mesh: groups of `size` consecutive ranks. Only the "sp" groups are built (the
  // dp dimension needs no communicator of its own); every rank creates its group in the same order.
  const int sp = static_cast<int>(size), first = world->rank() / sp * sp;
  std::vector<int> members;
  for (int r = first; r < first + sp; ++r) members.push_back(r);
  TESSERA_ASSIGN_OR_RETURN(auto group, world->new_subgroup(members, "sp"));
  if (world->rank() == 0) {
    spdlog::info("{} = {}: {} Ulysses groups of {} ranks split each micro-batch's tokens", key, size,
                 world->size() / sp, sp);
  }
  return ppo::UlyssesGroup::create(std::move(group));
}

// ---- Models ---------------------------------------------------------------------------------------

namespace {

// Keys of a model block that select a faster kernel or a loading mechanism for the same maths.
constexpr const char* kModelKeysAccepted[] = {
    "_target_",        "tokenizer_path",         "custom_chat_template", "use_shm",
    "use_fused_kernels",      "fused_kernel_options", "trust_remote_code",
};

Status refuse_if_set(ppo::ConfigReader& r, const char* key, const json& value, bool set) {
  if (!set) return Status();
  return make_error(ErrorCode::unimplemented, "{} = {}: not implemented by Tessera's workers", r.key_path(key),
                    value.dump());
}

}  // namespace

Result<ModelSection> parse_model_section(const json& json_in, const std::string& path) {
  ModelSection m;
  ppo::ConfigReader r(json_in, path);
  for (const char* key : kModelKeysAccepted) r.skip(key);
  r.field("path", m.path);
  m.fsdp_config = r.nested("fsdp_config");
  TESSERA_ASSIGN_OR_RETURN(m.lora, models::lora_config_from_json(json_in, path));
  for (const char* key : {"lora_rank", "lora_alpha", "target_modules", "exclude_modules"}) r.skip(key);
  const json& lib = r.nested("external_lib");
  r.fail(refuse_if_set(r, "external_lib", lib, !lib.is_null()));
  m.override_config = r.nested("override_config");
  m.override_config_key = r.key_path("override_config");
  if (!m.override_config.is_null() && !m.override_config.is_object()) {
    return make_error(ErrorCode::invalid_argument, "{} = {}: expected a mapping of config.json fields",
                      m.override_config_key, m.override_config.dump());
  }
  const json& ckpt = r.nested("enable_gradient_checkpointing");
  if (!ckpt.is_null() && !ckpt.is_boolean()) {
    return make_error(ErrorCode::invalid_argument, "{} = {}: expected true or false", r.key_path("enable_gradient_checkpointing"),
                      ckpt.dump());
  }
  m.gradient_checkpointing = ckpt.is_boolean() && ckpt.get<bool>();
  const json& rmpad = r.nested("use_remove_padding");
  if (!rmpad.is_null() && !rmpad.is_boolean()) {
    return make_error(ErrorCode::invalid_argument, "{} = {}: expected true or false", r.key_path("use_remove_padding"),
                      rmpad.dump());
  }
  m.use_remove_padding = rmpad.is_boolean() && rmpad.get<bool>();
  const json& liger = r.nested("use_liger");
  if (!liger.is_null() && !liger.is_boolean()) {
    return make_error(ErrorCode::invalid_argument, "{} = {}: expected true or false", r.key_path("use_liger"),
                      liger.dump());
  }
  m.use_liger = liger.is_boolean() && liger.get<bool>();
  const json& offload = r.nested("enable_activation_offload");
  if (!offload.is_null() && !offload.is_boolean()) {
    return make_error(ErrorCode::invalid_argument, "{} = {}: expected true or false",
                      r.key_path("enable_activation_offload"), offload.dump());
  }
  m.activation_offload = offload.is_boolean() && offload.get<bool>();
  m.activation_offload_key = r.key_path("enable_activation_offload");
  const json& tok = r.nested("input_tokenizer");
  if (!tok.is_null() && !tok.is_string()) {
    return make_error(ErrorCode::invalid_argument, "{} = {}: expected a tokenizer directory or null",
                      r.key_path("input_tokenizer"), tok.dump());
  }
  if (tok.is_string()) m.input_tokenizer = tok.get<std::string>();
  TESSERA_RETURN_IF_ERROR(r.finish());
  if (m.path.empty()) return make_error(ErrorCode::invalid_argument, "{}.path must be set (an HF model directory)", path);
  return m;
}

Status check_activation_offload(const ModelSection& model, const std::string& path) {
  if (!model.activation_offload || model.gradient_checkpointing) return Status();
  return make_error(ErrorCode::invalid_argument,
                    "{} = true requires {}.enable_gradient_checkpointing = true: Tessera offloads the checkpointed layer "
                    "inputs (with every activation kept, there is no recompute to bring them back for)",
                    model.activation_offload_key, path);
}

json frozen_model_fsdp_config(json fsdp_config) {
  if (!fsdp_config.is_object()) fsdp_config = json::object();
  if (!fsdp_config.contains("model_dtype") || fsdp_config["model_dtype"].is_null()) fsdp_config["model_dtype"] = "bf16";
  return fsdp_config;
}

Result<c10::ScalarType> fsdp_model_dtype(const json& fsdp_config, const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(fsdp::FsdpConfig c, fsdp::parse_fsdp_config(fsdp_config, path));
  return c.model_dtype;
}

Result<c10::ScalarType> fsdp_param_dtype(const json& fsdp_config, const std::string& path) {
  TESSERA_ASSIGN_OR_RETURN(fsdp::FsdpConfig c, fsdp::parse_fsdp_config(fsdp_config, path));
  return c.mixed_precision.param_dtype;
}

Result<std::shared_ptr<ppo::FsdpTrainableModule>> build_fsdp_module(std::shared_ptr<models::PretrainedModel> model,
                                                               std::shared_ptr<collective::Communicator> world,
                                                               const FsdpBuildOptions& o) {
  TESSERA_ASSIGN_OR_RETURN(fsdp::FsdpConfig config, fsdp::parse_fsdp_config(o.fsdp_config, o.fsdp_config_path));
  models::set_fused_layers(*model, o.fused_layers);
  const bool trainable = !o.optim.is_null();
  fsdp::OptimizerOptions optim;
  if (trainable) {
    TESSERA_ASSIGN_OR_RETURN(optim, fsdp::parse_optim_config(o.optim, o.optim_path));
  }
  optim.clip_grad = o.grad_clip;
  fsdp::FsdpOptions options = fsdp::fsdp_options_from_config(config, world->size());
  if (o.force_param_offload) options.param_offload = true;
  options.frozen_units_in_param_dtype = o.frozen_units_in_param_dtype;
  options.offload_activations = trainable && o.offload_activations;
  options.name = o.fsdp_config_path;
  if (!trainable) {
    options.frozen = true;  // no AdamW moments, no gradient buffers
    options.optimizer_offload = false;
    for (auto& p : model->parameters()) p.set_requires_grad(false);
  }
  // Layers run through run_unit when nothing needs them again (a frozen module) or when training
  // recomputes them in backward (gradient checkpointing, every strategy); FULL_SHARD and
  // HYBRID_SHARD also free them after their forward.
  const bool free_layers = !trainable || o.gradient_checkpointing;
  std::vector<fsdp::UnitSpec> units;
  if (free_layers) {
    TESSERA_ASSIGN_OR_RETURN(units, fsdp::make_decoder_units(*model, config.wrap_policy));
  } else {
    TESSERA_ASSIGN_OR_RETURN(units, fsdp::make_units(*model, config.wrap_policy));
  }
  if (options.offload_activations &&
      std::none_of(units.begin(), units.end(), [](const fsdp::UnitSpec& u) { return u.recompute; })) {
    // Note [Activation offload]: what moves is a recomputed layer's input; a wrapping with no
    // whole decoder layer as a unit recomputes nothing, so nothing would move.
    return make_error(ErrorCode::invalid_argument,
                      "{} = true: {} recomputes no layer in backward ({}), so there is no layer input to offload; it "
                      "needs decoder-layer wrapping",
                      o.offload_activations_key, o.fsdp_config_path,
                      config.wrap_policy.min_num_params > 0 ? "size-based wrapping" : "no unit is a whole decoder layer");
  }
  TESSERA_ASSIGN_OR_RETURN(auto mesh, collective::DeviceMesh::for_fsdp(world, config.fsdp_size));
  auto engine = fsdp::FsdpModule::wrap(model, std::move(units), std::move(mesh), options, optim);
  if (!engine.ok()) return engine.status().with_context(o.fsdp_config_path);
  if (free_layers) TESSERA_RETURN_IF_ERROR(fsdp::install_layer_runner(**engine, *model));
  return ppo::FsdpTrainableModule::create(std::move(model), std::move(*engine), trainable);
}

// ---- Offload ----------------------------------------------------------------------------------------

Result<std::unique_ptr<OffloadScope>> OffloadScope::enter(fsdp::FsdpModule& engine, bool params) {
  std::unique_ptr<OffloadScope> scope(new OffloadScope(engine, false));
  if (params && engine.params_offloaded()) {
    TESSERA_RETURN_IF_ERROR(engine.load_params());
    scope->params_ = true;
  }
  return scope;
}

Status OffloadScope::exit() {
  Status st;
  if (params_ && !engine_.params_offloaded()) st = engine_.offload_params();
  params_ = false;
  return st;
}

OffloadScope::~OffloadScope() {
  Status st = exit();
  if (!st.ok()) spdlog::error("offload after a worker call failed: {}", st.to_string());
}

// ---- Out of memory ------------------------------------------------------------------------------

Status name_memory_keys(const Status& st, const std::string& keys) {
  if (st.code() != ErrorCode::resource_exhausted) return st;
  return make_error(ErrorCode::resource_exhausted, "{}; lower {}", st.message(), keys);
}

std::string micro_batch_key(const std::string& prefix, bool dynamic) {
  return prefix + (dynamic ? "_max_token_len_per_gpu" : "_micro_batch_size_per_gpu");
}

// ---- Method arguments -----------------------------------------------------------------------------

Result<proto::DataProto> proto_arg(const dispatch::Args& args, const std::string& method) {
  if (args.size() != 1 || !args[0].is_proto()) {
    return make_error(ErrorCode::invalid_argument, "{}: expects exactly one DataProto argument, got {} argument(s){}",
                      method, args.size(), args.empty() ? "" : fmt::format(" (first: {})", dispatch::kind(args[0])));
  }
  return args[0].proto();
}

Result<dispatch::Value> run_on_device(const c10::Device& device, const dispatch::Args& args,
                                      const std::string& method, const DeviceBody& body) {
  RECORD_USER_SCOPE(method.c_str());  // the method's span in a trainer.profile_steps trace
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto data, proto_arg(args, method));
  TESSERA_RETURN_IF_ERROR(data.to(device, /*non_blocking=*/true).with_context(method + " argument"));
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto out, body(data));
  TESSERA_RETURN_IF_ERROR(out.to(c10::Device(c10::DeviceType::CPU), /*non_blocking=*/true)
                              .with_context(method + " result"));
  return dispatch::Value(std::move(out));
}

// ---- Devices --------------------------------------------------------------------------------------

Status check_on_device(const fsdp::FsdpModule& engine, const c10::Device& device, int rank) {
  Status st = engine.check_device(device);
  if (st.ok()) return st;
  return make_error(ErrorCode::internal, "rank {}: init_model left state off the worker's device: {}", rank,
                    st.message());
}

void add_device_memory_metrics(json& metrics, const c10::Device& device) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  const proto::DeviceMemory m = proto::memory_stats(device);
  metrics["perf/max_memory_allocated_gb"] = static_cast<double>(m.max_allocated) / kGiB;
  metrics["perf/max_memory_reserved_gb"] = static_cast<double>(m.max_reserved) / kGiB;
  proto::reset_peak_memory(device);
}

namespace {

// The JSON value of argument `name` at position `pos`: from a single object argument by key, or
// positionally. Null when absent.
Result<json> arg_value(const dispatch::Args& args, size_t pos, const char* name, const char* method) {
  for (const auto& a : args) {
    if (!a.is_json()) {
      return make_error(ErrorCode::invalid_argument, "{}: arguments must be JSON values, got a {}", method,
                        dispatch::kind(a));
    }
  }
  if (args.size() == 1 && args[0].json().is_object()) {
    const json& o = args[0].json();
    return o.contains(name) ? o.at(name) : json();
  }
  return pos < args.size() ? args[pos].json() : json();
}

template <class T>
Result<std::optional<T>> optional_arg(const json& v, const char* name, const char* method) {
  if (v.is_null()) return std::optional<T>();
  try {
    return std::optional<T>(v.get<T>());
  } catch (const std::exception&) {
    return make_error(ErrorCode::invalid_argument, "{}: argument '{}' has the wrong type: {}", method, name, v.dump());
  }
}

}  // namespace

Result<SaveCheckpointArgs> parse_save_checkpoint_args(const dispatch::Args& args) {
  constexpr const char* m = "save_checkpoint";
  SaveCheckpointArgs out;
  TESSERA_ASSIGN_OR_RETURN(json path, arg_value(args, 0, "local_path", m));
  TESSERA_ASSIGN_OR_RETURN(auto local, optional_arg<std::string>(path, "local_path", m));
  if (!local || local->empty()) return make_error(ErrorCode::invalid_argument, "{}: local_path is required", m);
  out.local_path = *local;
  TESSERA_ASSIGN_OR_RETURN(json hdfs, arg_value(args, 1, "hdfs_path", m));
  TESSERA_ASSIGN_OR_RETURN(out.hdfs_path, optional_arg<std::string>(hdfs, "hdfs_path", m));
  TESSERA_ASSIGN_OR_RETURN(json step, arg_value(args, 2, "global_step", m));
  TESSERA_ASSIGN_OR_RETURN(auto gs, optional_arg<int64_t>(step, "global_step", m));
  out.global_step = gs.value_or(0);
  TESSERA_ASSIGN_OR_RETURN(json keep, arg_value(args, 3, "max_ckpt_to_keep", m));
  TESSERA_ASSIGN_OR_RETURN(out.max_ckpt_to_keep, optional_arg<int64_t>(keep, "max_ckpt_to_keep", m));
  return out;
}

Result<LoadCheckpointArgs> parse_load_checkpoint_args(const dispatch::Args& args) {
  constexpr const char* m = "load_checkpoint";
  LoadCheckpointArgs out;
  TESSERA_ASSIGN_OR_RETURN(json path, arg_value(args, 0, "local_path", m));
  TESSERA_ASSIGN_OR_RETURN(auto local, optional_arg<std::string>(path, "local_path", m));
  if (!local || local->empty()) return make_error(ErrorCode::invalid_argument, "{}: local_path is required", m);
  out.local_path = *local;
  TESSERA_ASSIGN_OR_RETURN(json second, arg_value(args, 1, "hdfs_path", m));
  size_t del_pos = 2;
  if (second.is_boolean() && !(args.size() == 1 && args[0].json().is_object())) {
    del_pos = 1;  // load_checkpoint(local_path, del_local_after_load)
  } else {
    TESSERA_ASSIGN_OR_RETURN(out.hdfs_path, optional_arg<std::string>(second, "hdfs_path", m));
  }
  TESSERA_ASSIGN_OR_RETURN(json del, arg_value(args, del_pos, "del_local_after_load", m));
  TESSERA_ASSIGN_OR_RETURN(auto d, optional_arg<bool>(del, "del_local_after_load", m));
  out.del_local_after_load = d.value_or(false);
  return out;
}

// ---- Checkpoints ----------------------------------------------------------------------------------

Status CheckpointRotation::saved(const std::string& dir, std::optional<int64_t> max_keep, bool remover) {
  auto same = std::find(saved_.begin(), saved_.end(), dir);
  if (same != saved_.end()) saved_.erase(same);
  saved_.push_back(dir);
  if (!max_keep || *max_keep <= 0) return Status();
  while (static_cast<int64_t>(saved_.size()) > *max_keep) {
    const std::string old = saved_.front();
    saved_.pop_front();
    if (!remover) continue;
    std::error_code ec;
    fs::remove_all(old, ec);
    if (ec) return make_error(ErrorCode::io_error, "checkpoint rotation: cannot remove '{}': {}", old, ec.message());
  }
  return Status();
}

namespace {

constexpr const char* kTokenizerFiles[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                           "generation_config.json", "vocab.json", "merges.txt"};

Status copy_tokenizer_files(const std::string& model_path, const std::string& hf_dir) {
  std::error_code ec;
  fs::create_directories(hf_dir, ec);
  if (ec) return make_error(ErrorCode::io_error, "save_checkpoint: cannot create '{}': {}", hf_dir, ec.message());
  for (const char* name : kTokenizerFiles) {
    const fs::path src = fs::path(model_path) / name;
    if (!fs::exists(src)) continue;
    fs::copy_file(src, fs::path(hf_dir) / name, fs::copy_options::overwrite_existing, ec);
    if (ec) return make_error(ErrorCode::io_error, "save_checkpoint: cannot copy '{}': {}", src.string(), ec.message());
  }
  return Status();
}

}  // namespace

Status save_worker_checkpoint(fsdp::FsdpModule& engine, const SaveCheckpointArgs& args, const std::string& model_path,
                              const models::ModelConfig& model_config, int rank, CheckpointRotation& rotation,
                              const CheckpointFiles& extra_files) {
  if (args.hdfs_path) {
    return make_error(ErrorCode::unimplemented, "save_checkpoint: hdfs_path '{}' is not supported (local paths only)",
                      *args.hdfs_path);
  }
  fsdp::SaveOptions options;
  options.hf_config = models::model_config_to_json(model_config);
  options.after_rank_files = extra_files;  // inside the temporary directory: published with the rest
  TESSERA_RETURN_IF_ERROR(fsdp::save_checkpoint(engine, args.local_path, options));
  if (rank == 0) {
    TESSERA_RETURN_IF_ERROR(copy_tokenizer_files(model_path, (fs::path(args.local_path) / "huggingface").string()));
  }
  return rotation.saved(args.local_path, args.max_ckpt_to_keep, rank == 0);
}

// verl's _save_lora_adapter in PEFT's format (see the header); only the adapter units are gathered.
Result<CheckpointFiles> lora_adapter_files(ppo::FsdpTrainableModule& module, const models::LoraConfig& lora,
                                           const std::string& key_path, const std::string& base_path, int rank) {
  TESSERA_ASSIGN_OR_RETURN(auto adapters, module.engine().full_state_dict(at::kFloat, fsdp::is_adapter_unit));
  if (rank != 0) return CheckpointFiles();
  // Everything that can fail on rank 0 alone runs inside the writer, whose error the ranks agree
  // on (fsdp::save_checkpoint), rather than here, where the others would wait for rank 0.
  const models::PretrainedModel* model = &module.model();
  return CheckpointFiles([adapters = std::move(adapters), model, lora, key_path, base_path](const std::string& dir) -> Status {
    TESSERA_ASSIGN_OR_RETURN(std::vector<std::string> targets, models::lora_target_modules(*model, lora, key_path));
    models::TensorMap peft;
    try {
      // Host boundary, deliberate: the adapter file is written from the host, once per save.
      for (const auto& [name, t] : adapters) peft["base_model.model." + name] = t.cpu();
    } catch (...) {
      return proto::status_from_current_exception("save_checkpoint: the LoRA adapter");
    }
    const json config = models::peft_adapter_config(lora, targets, base_path);
    const fs::path out = fs::path(dir) / "lora_adapter";
    std::error_code ec;
    fs::create_directories(out, ec);
    if (ec) return make_error(ErrorCode::io_error, "save_checkpoint: cannot create '{}': {}", out.string(), ec.message());
    TESSERA_RETURN_IF_ERROR(models::write_safetensors((out / "adapter_model.safetensors").string(), peft));
    std::ofstream file(out / "adapter_config.json");
    file << config.dump(4);
    file.close();
    if (!file) return make_error(ErrorCode::io_error, "save_checkpoint: cannot write '{}'", (out / "adapter_config.json").string());
    return Status();
  });
}

Status load_worker_checkpoint(fsdp::FsdpModule& engine, const LoadCheckpointArgs& args, int rank,
                              collective::Communicator& world) {
  if (args.hdfs_path) {
    return make_error(ErrorCode::unimplemented, "load_checkpoint: hdfs_path '{}' is not supported (local paths only)",
                      *args.hdfs_path);
  }
  TESSERA_RETURN_IF_ERROR(fsdp::load_checkpoint(engine, args.local_path));
  if (!args.del_local_after_load) return Status();
  TESSERA_RETURN_IF_ERROR(world.barrier());
  if (rank != 0) return Status();
  std::error_code ec;
  fs::remove_all(args.local_path, ec);
  if (ec) {
    return make_error(ErrorCode::io_error, "load_checkpoint: cannot delete '{}': {}", args.local_path, ec.message());
  }
  return Status();
}

// ---- Perf figures ---------------------------------------------------------------------------------

double cpu_memory_used_gb() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  double total = -1, available = -1;
  while (std::getline(in, line)) {
    std::istringstream s(line);
    std::string key;
    double kb = 0;
    s >> key >> kb;
    if (key == "MemTotal:") total = kb;
    if (key == "MemAvailable:") available = kb;
  }
  if (total < 0 || available < 0) return -1.0;
  return (total - available) * 1024.0 / (1024.0 * 1024.0 * 1024.0);
}

void record_call_metrics(proto::DataProto& out, const std::string& method, double seconds) {
  json& m = out.meta_info()["metrics"];
  if (!m.is_object()) m = json::object();
  m["timing_s/" + method] = seconds;
  m["perf/cpu_memory_used_gb"] = cpu_memory_used_gb();
}

Result<proto::DataProto> metrics_proto(json metrics) {
  proto::DataProto out;
  out.meta_info()["metrics"] = std::move(metrics);
  return out;
}

}  // namespace tessera::workers
