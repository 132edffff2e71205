// sft_worker.cpp: the "sft" worker type (see sft_worker.hpp).
#include "workers/roles/sft_worker.hpp"

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <torch/torch.h>

#include "dispatch/worker_group.hpp"
#include "workers/algos/torch_functional.hpp"
#include "workers/fsdp/checkpoint.hpp"
#include "workers/models/model_io.hpp"
#include "workers/ppo/packing.hpp"
#include "workers/ppo/ppo_inputs.hpp"
#include "workers/roles/worker_support.hpp"

namespace tessera::workers {
namespace {

using nlohmann::json;

// "[2, 5]" for error messages.
std::string shape(const at::Tensor& t) {
  std::string out = "[";
  for (int64_t d = 0; d < t.dim(); ++d) out += (d ? ", " : "") + std::to_string(t.size(d));
  return out + "]";
}

// The parts of verl's sft_trainer config the worker reads, translated to the actor's forms.
struct SftWorkerConfig {
  std::string model_path;
  json fsdp_config = json::object();  // actor-style fsdp_config for build_fsdp_module
  json optim = json::object();        // actor-style optim block
  double grad_clip = 1.0;
  int64_t micro_batch_size_per_gpu = 1;
  bool gradient_checkpointing = false;  // model.enable_gradient_checkpointing
  bool use_remove_padding = false;      // padding-free micro-batches (workers/ppo/packing.hpp)
  int64_t ulysses_sequence_parallel_size = 1;  // Note [Ulysses sequence parallelism]; needs use_remove_padding
  bool use_liger = false;               // model.use_liger: fused layer ops on a GPU (Note [Fused layers])
  models::LoraConfig lora;              // model.lora_rank, lora_alpha, target_modules (Note [LoRA adapters])
};

// sft_loss_terms over a packed micro-batch: logits [n, V] at the packed tokens of columns [0, T-1).
Result<SftLossTerms> sft_loss_terms_packed(const at::Tensor& logits, const ppo::PackedBatch& packed,
                                           const at::Tensor& input_ids, const at::Tensor& loss_mask) {
  const int64_t T = input_ids.size(1);
  const at::Tensor labels = ppo::select_responses(input_ids.narrow(1, 1, T - 1), packed);
  const at::Tensor mask = ppo::select_responses(loss_mask.narrow(1, 0, T - 1).to(torch::kFloat32), packed);
  TESSERA_ASSIGN_OR_RETURN(auto lp, algos::token_log_probs(logits, labels, /*temperature=*/1.0, /*with_entropy=*/false));
  SftLossTerms out;
  out.loss_sum = -(lp.log_probs * mask).sum();
  out.tokens = mask.sum();
  return out;
}

// model.fsdp_config (verl SFT keys) -> the actor-style block build_fsdp_module reads.
Result<json> translate_fsdp_config(const json& in, const std::string& path) {
  json out = json::object();
  ppo::ConfigReader r(in, path);
  for (const char* key : {"model_dtype", "wrap_policy", "mixed_precision", "fsdp_size", "sharding_strategy"}) {
    const json& v = r.nested(key);
    if (!v.is_null()) out[key] = v;
  }
  bool cpu_offload = false, offload_params = false;
  r.field("cpu_offload", cpu_offload);
  r.field("offload_params", offload_params);
  TESSERA_RETURN_IF_ERROR(r.finish());
  if (cpu_offload || offload_params) {
    return make_error(ErrorCode::unimplemented, "{}.{}: CPU offload of the SFT model is not implemented", path,
                      cpu_offload ? "cpu_offload" : "offload_params");
  }
  return out;
}

Status read_model_block(const json& model, SftWorkerConfig& out) {
  ppo::ConfigReader r(model, "model");
  r.field("partial_pretrain", out.model_path);
  const json& fsdp = r.nested("fsdp_config");
  const json& external = r.nested("external_lib");
  r.field("enable_gradient_checkpointing", out.gradient_checkpointing);
  r.field("use_liger", out.use_liger);
  std::string strategy = "fsdp2";
  r.field("strategy", strategy);
  // verl's SFT trainer passes lora_rank, lora_alpha and target_modules to PEFT (no exclude_modules).
  TESSERA_ASSIGN_OR_RETURN(out.lora, models::lora_config_from_json(model, "model"));
  for (const char* key : {"trust_remote_code", "use_shm", "lora_rank", "lora_alpha", "target_modules"}) {
    r.skip(key);
  }
  TESSERA_RETURN_IF_ERROR(r.finish());
  if (strategy != "fsdp" && strategy != "fsdp2") {  // one FSDP engine serves both, as for PPO's workers
    return make_error(ErrorCode::invalid_argument, "model.strategy='{}': expected fsdp or fsdp2", strategy);
  }
  if (out.model_path.empty()) return make_error(ErrorCode::invalid_argument, "model.partial_pretrain: required");
  if (!external.is_null()) return make_error(ErrorCode::unimplemented, "model.external_lib: not supported");
  TESSERA_ASSIGN_OR_RETURN(out.fsdp_config, translate_fsdp_config(fsdp, "model.fsdp_config"));
  return Status();
}

Status read_optim_block(const json& optim, int64_t total_steps, SftWorkerConfig& out) {
  ppo::ConfigReader r(optim, "optim");
  double lr = 1e-5, weight_decay = 0.01, warmup_ratio = 0.1, min_lr_ratio = 0.0;
  std::string scheduler = "cosine";
  r.field("lr", lr);
  r.field("weight_decay", weight_decay);
  r.field("warmup_steps_ratio", warmup_ratio);
  r.field("clip_grad", out.grad_clip);
  r.field("lr_scheduler", scheduler);
  r.field("min_lr_ratio", min_lr_ratio);
  const json& betas = r.nested("betas");
  TESSERA_RETURN_IF_ERROR(r.finish());
  out.optim = {{"lr", lr},
               {"weight_decay", weight_decay},
               {"lr_warmup_steps_ratio", warmup_ratio},
               {"lr_scheduler_type", scheduler},
               {"min_lr_ratio", min_lr_ratio},
               {"total_training_steps", total_steps}};
  out.optim["betas"] = betas.is_null() ? json::array({0.9, 0.95}) : betas;  // verl's SFT default
  return Status();
}

Result<SftWorkerConfig> parse_sft_worker_config(const json& init) {
  SftWorkerConfig out;
  const json& c = init.contains("config") ? init["config"] : json();
  if (!c.is_object()) return make_error(ErrorCode::invalid_argument, "sft worker: init config has no 'config' object");
  const int64_t total = init.value("total_training_steps", int64_t{0});
  if (total < 1) return make_error(ErrorCode::invalid_argument, "sft worker: total_training_steps {} must be >= 1", total);
  TESSERA_RETURN_IF_ERROR(read_model_block(c.value("model", json()), out));
  TESSERA_RETURN_IF_ERROR(read_optim_block(c.value("optim", json()), total, out));
  const json data = c.value("data", json::object());
  out.micro_batch_size_per_gpu = data.value("micro_batch_size_per_gpu", int64_t{4});
  const json rmpad = c.value("use_remove_padding", json(false));
  if (!rmpad.is_boolean()) return make_error(ErrorCode::invalid_argument, "use_remove_padding = {}: expected true or false", rmpad.dump());
  out.use_remove_padding = rmpad.get<bool>();
  const json sp = c.value("ulysses_sequence_parallel_size", json(1));
  if (!sp.is_number_integer() || sp.get<int64_t>() < 1) {
    return make_error(ErrorCode::invalid_argument, "ulysses_sequence_parallel_size = {}: expected an integer >= 1",
                      sp.dump());
  }
  out.ulysses_sequence_parallel_size = sp.get<int64_t>();
  if (out.ulysses_sequence_parallel_size > 1 && !out.use_remove_padding) {
    return make_error(ErrorCode::invalid_argument,
                      "ulysses_sequence_parallel_size = {} > 1 requires use_remove_padding = true (as verl's SFT trainer)",
                      out.ulysses_sequence_parallel_size);
  }
  if (out.micro_batch_size_per_gpu < 1) {
    return make_error(ErrorCode::invalid_argument, "data.micro_batch_size_per_gpu: {} must be >= 1",
                      out.micro_batch_size_per_gpu);
  }
  return out;
}

// The four [B, T] tensors of an SFT batch.
struct SftBatch {
  at::Tensor input_ids, attention_mask, position_ids, loss_mask;
};

Result<SftBatch> read_sft_batch(const proto::DataProto& d, const std::string& method) {
  SftBatch b;
  std::pair<const char*, at::Tensor*> keys[] = {{"input_ids", &b.input_ids},
                                                {"attention_mask", &b.attention_mask},
                                                {"position_ids", &b.position_ids},
                                                {"loss_mask", &b.loss_mask}};
  for (auto& [key, out] : keys) {
    auto t = d.tensor(key);
    if (!t.ok()) return make_error(ErrorCode::not_found, "sft {}: batch has no '{}'", method, key);
    if (t->dim() != 2) return make_error(ErrorCode::invalid_argument, "sft {}: '{}' must be [B, T], got {}", method, key, shape(*t));
    *out = *t;
  }
  if (b.input_ids.size(0) == 0) return make_error(ErrorCode::invalid_argument, "sft {}: empty batch on this rank", method);
  if (b.input_ids.size(1) < 2) return make_error(ErrorCode::invalid_argument, "sft {}: sequences need >= 2 tokens", method);
  return b;
}

class SftWorker : public dispatch::WorkerBase {
 public:
  SftWorker(const runtime::WorkerContext& ctx, json init) : WorkerBase(ctx), init_(std::move(init)) {
    auto& m = methods();
    (void)m.add("init_model", dispatch::Dispatch::ONE_TO_ALL, [this](const dispatch::Args&) -> Result<dispatch::Value> {
      TESSERA_RETURN_IF_ERROR(init_model());
      return dispatch::Value(json());
    });
    (void)m.add("train_batch", dispatch::Dispatch::DP_COMPUTE_PROTO, [this](const dispatch::Args& a) -> Result<dispatch::Value> {
      return run_on_device(device(), a, "train_batch", [this](const proto::DataProto& d) { return run_batch(d, true); });
    });
    (void)m.add("validate_batch", dispatch::Dispatch::DP_COMPUTE_PROTO,
                [this](const dispatch::Args& a) -> Result<dispatch::Value> {
                  return run_on_device(device(), a, "validate_batch",
                                       [this](const proto::DataProto& d) { return run_batch(d, false); });
                });
    (void)m.add("save_checkpoint", dispatch::Dispatch::ONE_TO_ALL, [this](const dispatch::Args& a) -> Result<dispatch::Value> {
      TESSERA_ASSIGN_OR_RETURN(SaveCheckpointArgs args, parse_save_checkpoint_args(a));
      TESSERA_RETURN_IF_ERROR(save_checkpoint(args));
      return dispatch::Value(json());
    });
    (void)m.add("load_checkpoint", dispatch::Dispatch::ONE_TO_ALL, [this](const dispatch::Args& a) -> Result<dispatch::Value> {
      TESSERA_ASSIGN_OR_RETURN(LoadCheckpointArgs args, parse_load_checkpoint_args(a));
      TESSERA_RETURN_IF_ERROR(require_init("load_checkpoint"));
      TESSERA_RETURN_IF_ERROR(load_worker_checkpoint(module_->engine(), args, context().rank, *world_));
      return dispatch::Value(json());
    });
  }

 private:
  Status require_init(const char* method) const {
    if (module_) return Status();
    return make_error(ErrorCode::invalid_argument, "sft {}: init_model has not run on rank {}", method, context().rank);
  }

  Status init_model() {
    if (module_) return make_error(ErrorCode::invalid_argument, "sft init_model: already initialised");
    TESSERA_ASSIGN_OR_RETURN(config_, parse_sft_worker_config(init_));
    // verl's SFT trainer hard-codes bf16 parameters for its CUDA FSDP; on CPU devices Tessera
    // computes in fp32 unless model.fsdp_config.mixed_precision says otherwise.
    json& mp = config_.fsdp_config["mixed_precision"];
    const bool param_set = mp.is_object() && mp.contains("param_dtype") && !mp["param_dtype"].is_null();
    if (!param_set && device().is_cpu()) mp["param_dtype"] = "fp32";
    if (mp.is_null()) config_.fsdp_config.erase("mixed_precision");
    torch::manual_seed(init_.value("seed", uint64_t{0}));
    const std::string backend = init_.value("comm_backend", default_comm_backend(context()));
    TESSERA_ASSIGN_OR_RETURN(world_, world_communicator(context(), backend));
    TESSERA_ASSIGN_OR_RETURN(c10::ScalarType dtype, fsdp_model_dtype(config_.fsdp_config, "model.fsdp_config"));
    models::LoadOptions load;
    load.dtype = dtype;
    load.device = device();
    // LoRA: the frozen base in the compute dtype when that is narrower (FsdpOptions::
    // frozen_units_in_param_dtype); the adapters' master weights in `dtype`.
    bool base_in_param_dtype = false;
    if (config_.lora.enabled()) {
      TESSERA_ASSIGN_OR_RETURN(c10::ScalarType param_dtype, fsdp_param_dtype(config_.fsdp_config, "model.fsdp_config"));
      base_in_param_dtype = c10::elementSize(param_dtype) < c10::elementSize(dtype);
      if (base_in_param_dtype) load.dtype = param_dtype;
    }
    TESSERA_ASSIGN_OR_RETURN(auto model, models::load_causal_lm(config_.model_path, load));
    model_config_ = model->config();
    models::LoraConfig lora = config_.lora;
    lora.seed = init_.value("seed", uint64_t{0});  // lora_A's initial values follow the run's seed
    lora.dtype = dtype;
    TESSERA_RETURN_IF_ERROR(models::apply_lora(*model, lora, "model"));
    FsdpBuildOptions b;
    b.fsdp_config = config_.fsdp_config;
    b.fsdp_config_path = "model.fsdp_config";
    b.optim = config_.optim;
    b.optim_path = "optim";
    b.gradient_checkpointing = config_.gradient_checkpointing;
    b.fused_layers = config_.use_liger;
    b.grad_clip = config_.grad_clip;
    b.frozen_units_in_param_dtype = base_in_param_dtype;
    TESSERA_ASSIGN_OR_RETURN(module_, build_fsdp_module(model, world_, b));
    TESSERA_ASSIGN_OR_RETURN(ulysses_, ulysses_group(world_, config_.ulysses_sequence_parallel_size, model_config_,
                                                     "ulysses_sequence_parallel_size", config_.use_remove_padding,
                                                     "use_remove_padding"));
    return check_on_device(module_->engine(), device(), context().rank);
  }

  // Σ over the world of a local double (sum).
  Result<double> world_sum(double local) {
    at::Tensor t = torch::full({1}, local, torch::kFloat64);
    TESSERA_RETURN_IF_ERROR(world_->all_reduce(t, collective::ReduceOp::sum));
    return t.item<double>();
  }

  // One micro-batch: forward, loss terms, and (train) backward of the globally normalised loss.
  // Returns the micro-batch's summed loss as a 0-dim tensor on the device: the caller reads the
  // batch's total once, so micro-batches queue on the GPU without a host wait between them.
  Result<at::Tensor> micro_step(const SftBatch& b, int64_t start, int64_t rows, bool train, double global_tokens) {
    const ppo::ForwardMode mode = train ? ppo::ForwardMode::train : ppo::ForwardMode::eval;
    std::optional<torch::NoGradGuard> no_grad;
    if (!train) no_grad.emplace();
    const int64_t T = b.input_ids.size(1);
    const at::Tensor ids = b.input_ids.narrow(0, start, rows), mask = b.attention_mask.narrow(0, start, rows);
    const at::Tensor pos = b.position_ids.narrow(0, start, rows), loss_mask = b.loss_mask.narrow(0, start, rows);
    std::optional<ppo::PackedBatch> packed;  // padding-free: the head runs on each row's real tokens
    if (config_.use_remove_padding) {
      // With sequence parallelism: this rank's slice of the packed row; its loss terms are its
      // slice's, and the group's ranks together cover every token once.
      TESSERA_ASSIGN_OR_RETURN(packed, ppo::pack_rows(ids, mask, pos, models::HeadRows{0, T - 1}, at::Tensor(), ulysses_));
    }
    TESSERA_ASSIGN_OR_RETURN(at::Tensor logits, packed ? module_->forward_packed(*packed, mode)
                                                       : module_->forward(ids, mask, pos, mode, models::HeadRows{0, T - 1}));
    auto terms = packed ? sft_loss_terms_packed(logits, *packed, ids, loss_mask) : sft_loss_terms(logits, ids, loss_mask);
    if (!terms.ok()) {
      if (train) (void)module_->end_forward();
      return terms.status();
    }
    if (train) {
      const double scale = static_cast<double>(world_->size()) / std::max(global_tokens, 1.0);
      TESSERA_RETURN_IF_ERROR(module_->backward(terms->loss_sum * scale));
    }
    return terms->loss_sum.detach().to(at::kDouble);
  }

  Result<proto::DataProto> run_batch(const proto::DataProto& d, bool train) {
    const char* method = train ? "train_batch" : "validate_batch";
    TESSERA_RETURN_IF_ERROR(require_init(method));
    TESSERA_ASSIGN_OR_RETURN(SftBatch b, read_sft_batch(d, method));
    TESSERA_RETURN_IF_ERROR(
        algos::check_labels_in_vocab(method, "input_ids", b.input_ids, module_->model_config().vocab_size));
    if (ulysses_) {  // Note [Ulysses sequence parallelism]: the group's rows
      TESSERA_ASSIGN_OR_RETURN(auto selected, d.select(std::vector<std::string>{"input_ids", "attention_mask",
                                                                                "position_ids", "loss_mask"},
                                                       std::vector<std::string>{}));
      TESSERA_ASSIGN_OR_RETURN(auto gathered, ulysses_->gather_rows(selected));
      TESSERA_ASSIGN_OR_RETURN(b, read_sft_batch(gathered, method));
    }
    // Host boundary, deliberate: the batch's token count normalises the loss (one read per batch).
    const double local_tokens = b.loss_mask.narrow(1, 0, b.loss_mask.size(1) - 1).sum().item<double>();
    TESSERA_ASSIGN_OR_RETURN(double world_tokens, world_sum(local_tokens));
    // The ranks of a Ulysses group hold the same rows: count them once.
    const double global_tokens = world_tokens / static_cast<double>(config_.ulysses_sequence_parallel_size);
    const int64_t rows = b.input_ids.size(0), micro = config_.micro_batch_size_per_gpu;
    Result<double> loss_sum = [&]() -> Result<double> {
      try {
        at::Tensor total;
        for (int64_t start = 0; start < rows; start += micro) {
          TESSERA_ASSIGN_OR_RETURN(at::Tensor s, micro_step(b, start, std::min(micro, rows - start), train, global_tokens));
          total = total.defined() ? total + s : s;
        }
        // Host boundary, deliberate: the batch's loss, once per batch (the metric and the world sum).
        return total.defined() ? total.item<double>() : 0.0;
      } catch (...) {
        return ppo::status_from_current_exception(fmt::format("sft {} (rank {})", method, context().rank));
      }
    }();
    if (!loss_sum.ok()) {
      return name_memory_keys(loss_sum.status(), config_.gradient_checkpointing
                                                     ? "data.micro_batch_size_per_gpu"
                                                     : "data.micro_batch_size_per_gpu, or set model.enable_gradient_checkpointing=true");
    }
    TESSERA_ASSIGN_OR_RETURN(double world_loss, world_sum(*loss_sum));
    const double loss = world_loss / std::max(global_tokens, 1.0);
    if (!train) return metrics_proto(json{{"val/loss", loss}});
    TESSERA_ASSIGN_OR_RETURN(ppo::StepOutcome step, module_->clip_and_step(config_.grad_clip));
    module_->engine().lr_scheduler_step();
    // verl's SFT trainer logs lr_scheduler.get_last_lr() after stepping the schedule.
    return metrics_proto(json{{"train/loss", loss}, {"train/lr", module_->engine().current_lr()},
                              {"train/grad_norm", step.grad_norm}});
  }

  Status save_checkpoint(const SaveCheckpointArgs& args) {
    TESSERA_RETURN_IF_ERROR(require_init("save_checkpoint"));
    CheckpointFiles adapter;
    if (config_.lora.enabled()) {
      TESSERA_ASSIGN_OR_RETURN(adapter, lora_adapter_files(*module_, config_.lora, "model", config_.model_path, context().rank));
    }
    TESSERA_RETURN_IF_ERROR(save_worker_checkpoint(module_->engine(), args, config_.model_path, model_config_,
                                                   context().rank, rotation_, adapter));
    if (context().rank != 0) return Status();
    // A complete HF directory beside the shards: config.json and the tokenizer are already there;
    // LoRA adapters are merged into it, so the RL phase starts from the fine-tuned model.
    return fsdp::export_hf(args.local_path, (std::filesystem::path(args.local_path) / "huggingface").string());
  }

  json init_;
  SftWorkerConfig config_;
  std::shared_ptr<collective::Communicator> world_;
  std::shared_ptr<ppo::FsdpTrainableModule> module_;
  std::shared_ptr<ppo::UlyssesGroup> ulysses_;  // null without sequence parallelism
  models::ModelConfig model_config_;
  CheckpointRotation rotation_;
};

}  // namespace

Result<SftLossTerms> sft_loss_terms(const at::Tensor& logits, const at::Tensor& input_ids, const at::Tensor& loss_mask) {
  if (logits.dim() != 3 || input_ids.dim() != 2 || logits.size(0) != input_ids.size(0) ||
      logits.size(1) + 1 != input_ids.size(1)) {
    return make_error(ErrorCode::invalid_argument, "sft loss: logits {} do not fit input_ids {} (rows [0, T-1) expected)",
                      shape(logits), shape(input_ids));
  }
  if (!loss_mask.sizes().equals(input_ids.sizes())) {
    return make_error(ErrorCode::invalid_argument, "sft loss: loss_mask {} does not fit input_ids {}",
                      shape(loss_mask), shape(input_ids));
  }
  const int64_t T = input_ids.size(1);
  at::Tensor mask = loss_mask.narrow(1, 0, T - 1).to(torch::kFloat32);
  at::Tensor labels = input_ids.narrow(1, 1, T - 1);
  // Cross-entropy = -log p(label), in fp32 chunks (algos::token_log_probs): no fp32 copy of the logits.
  TESSERA_ASSIGN_OR_RETURN(auto lp, algos::token_log_probs(logits, labels, /*temperature=*/1.0, /*with_entropy=*/false));
  SftLossTerms out;
  out.loss_sum = -(lp.log_probs * mask).sum();
  out.tokens = mask.sum();
  return out;
}

Status register_sft_worker(runtime::WorkerTypeRegistry& registry) {
  return dispatch::register_worker_type(
      registry, "sft",
      [](const runtime::WorkerContext& ctx, const nlohmann::json& init) -> Result<std::unique_ptr<dispatch::WorkerBase>> {
        return std::unique_ptr<dispatch::WorkerBase>(std::make_unique<SftWorker>(ctx, init));
      });
}

}  // namespace tessera::workers
