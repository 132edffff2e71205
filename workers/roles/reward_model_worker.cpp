// reward_model_worker.cpp: RewardModelWorker (see reward_model_worker.hpp).
#include "workers/roles/reward_model_worker.hpp"

#include <filesystem>
#include <utility>

#include <torch/torch.h>

#include "workers/models/model_io.hpp"
#include "workers/ppo/ppo_batching.hpp"
#include "workers/ppo/ppo_inputs.hpp"

namespace tessera::workers {

using json = nlohmann::json;
using dispatch::Args;
namespace Dispatch = dispatch::Dispatch;
using dispatch::Value;

namespace {

bool same_directory(const std::string& a, const std::string& b) {
  std::error_code ea, eb;
  auto ca = std::filesystem::weakly_canonical(a, ea);
  auto cb = std::filesystem::weakly_canonical(b, eb);
  return (!ea && !eb) ? ca == cb : a == b;
}

}  // namespace

Result<RewardModelConfig> parse_reward_model_config(const json& j, int64_t world_size) {
  RewardModelConfig c;
  ppo::ConfigReader r(j, "reward_model");
  for (const char* k : {"_target_", "enable", "strategy", "max_length", "reward_manager", "launch_reward_fn_async",
                        "sandbox_fusion", "profiler", "reward_kwargs"}) {
    r.skip(k);
  }
  const json& model = r.nested("model");
  r.field("micro_batch_size", c.micro_batch_size);
  r.field("micro_batch_size_per_gpu", c.micro_batch_size_per_gpu);
  r.field("use_dynamic_bsz", c.use_dynamic_bsz);
  r.field("forward_max_token_len_per_gpu", c.forward_max_token_len_per_gpu);
  int64_t sp = 1;
  r.field("ulysses_sequence_parallel_size", sp);
  if (sp != 1) {
    r.fail(make_error(ErrorCode::unimplemented, "reward_model.ulysses_sequence_parallel_size = {}: only 1 is implemented", sp));
  }
  TESSERA_RETURN_IF_ERROR(r.finish());
  TESSERA_ASSIGN_OR_RETURN(c.model, parse_model_section(model, "reward_model.model"));
  if (c.model.lora.enabled()) {
    return make_error(ErrorCode::unimplemented, "reward_model.model.lora_rank = {}: a reward model is never trained, "
                      "LoRA has nothing to adapt", c.model.lora.rank);
  }
  if (c.model.input_tokenizer && !same_directory(*c.model.input_tokenizer, c.model.path)) {
    return make_error(ErrorCode::unimplemented,
                      "reward_model.model.input_tokenizer = '{}' differs from reward_model.model.path = '{}': "
                      "re-templating inputs for the reward model's tokenizer is not implemented",
                      *c.model.input_tokenizer, c.model.path);
  }
  if (c.micro_batch_size) {
    TESSERA_ASSIGN_OR_RETURN(int64_t per_gpu, ppo::normalize_global_micro_batch_size(*c.micro_batch_size, world_size,
                                                                                "reward_model.micro_batch_size"));
    c.micro_batch_size_per_gpu = per_gpu;
    c.micro_batch_size.reset();
  }
  if (!c.use_dynamic_bsz && (!c.micro_batch_size_per_gpu || *c.micro_batch_size_per_gpu < 1)) {
    return make_error(ErrorCode::invalid_argument,
                      "reward_model.micro_batch_size_per_gpu (or reward_model.micro_batch_size) must be set to >= 1 when "
                      "reward_model.use_dynamic_bsz is false");
  }
  if (c.forward_max_token_len_per_gpu < 1) {
    return make_error(ErrorCode::invalid_argument, "reward_model.forward_max_token_len_per_gpu = {} must be >= 1",
                      c.forward_max_token_len_per_gpu);
  }
  return c;
}

at::Tensor expand_to_token_level(const at::Tensor& scores, const at::Tensor& attention_mask,
                                 const at::Tensor& position_ids, int64_t response_length) {
  at::Tensor eos_idx = (position_ids * attention_mask).argmax(-1);
  at::Tensor token_level = at::zeros(attention_mask.sizes(), scores.options());
  at::Tensor rows = at::arange(scores.size(0), at::TensorOptions(at::kLong).device(scores.device()));
  token_level.index_put_({rows, eos_idx}, scores);
  return token_level.narrow(1, token_level.size(1) - response_length, response_length);
}

RewardModelWorker::RewardModelWorker(runtime::WorkerContext context, json init_config)
    : WorkerBase(std::move(context)), init_config_(std::move(init_config)) {}

Result<std::unique_ptr<RewardModelWorker>> RewardModelWorker::create(const runtime::WorkerContext& context,
                                                                     const json& init_config) {
  if (!init_config.is_object() || !init_config.contains("config")) {
    return make_error(ErrorCode::invalid_argument, "reward_model init config: 'config' (the reward_model subtree) is required");
  }
  std::unique_ptr<RewardModelWorker> w(new RewardModelWorker(context, init_config));
  (void)w->methods().add("init_model", Dispatch::ONE_TO_ALL, [p = w.get()](const Args&) -> Result<Value> {
    TESSERA_RETURN_IF_ERROR(p->init_model());
    return Value(json());
  });
  (void)w->methods().add("compute_rm_score", Dispatch::DP_COMPUTE_PROTO, [p = w.get()](const Args& args) -> Result<Value> {
    return run_on_device(p->device(), args, "compute_rm_score",
                         [p](const proto::DataProto& data) { return p->compute_rm_score(data); });
  });
  return w;
}

Status RewardModelWorker::init_model() {
  if (module_) return make_error(ErrorCode::invalid_argument, "reward_model init_model: already initialised");
  TESSERA_ASSIGN_OR_RETURN(config_, parse_reward_model_config(init_config_["config"], context().world_size));
  const std::string backend = init_config_.value("comm_backend", default_comm_backend(context()));
  TESSERA_ASSIGN_OR_RETURN(world_, world_communicator(context(), backend));
  const std::string fsdp_path = "reward_model.model.fsdp_config";
  config_.model.fsdp_config = frozen_model_fsdp_config(config_.model.fsdp_config);  // verl: the reward model in bf16
  TESSERA_ASSIGN_OR_RETURN(c10::ScalarType dtype, fsdp_model_dtype(config_.model.fsdp_config, fsdp_path));
  models::LoadOptions load;
  load.config_override = config_.model.override_config;
  load.config_override_key = config_.model.override_config_key;
  load.dtype = dtype;
  load.device = device();
  TESSERA_ASSIGN_OR_RETURN(auto model, models::load_value_model(config_.model.path, load));
  FsdpBuildOptions b;
  b.fsdp_config = config_.model.fsdp_config;
  b.fsdp_config_path = fsdp_path;
  b.force_param_offload = true;
  b.fused_layers = config_.model.use_liger;
  TESSERA_ASSIGN_OR_RETURN(module_, build_fsdp_module(model, world_, b));
  return check_on_device(module_->engine(), device(), context().rank);
}

Result<at::Tensor> RewardModelWorker::sequence_scores(const proto::DataProto& data) {
  static const std::vector<std::string> keys = {"input_ids", "attention_mask", "position_ids", "responses"};
  TESSERA_ASSIGN_OR_RETURN(auto selected, data.select(keys, std::vector<std::string>{}));
  ppo::MicroBatches micro;
  if (config_.use_dynamic_bsz) {
    TESSERA_ASSIGN_OR_RETURN(micro, ppo::rearrange_micro_batches(selected, config_.forward_max_token_len_per_gpu,
                                                            "reward_model.forward_max_token_len_per_gpu",
                                                            ppo::make_dp_count_sync(world_)));
  } else {
    TESSERA_ASSIGN_OR_RETURN(micro, ppo::split_micro_batches(selected, *config_.micro_batch_size_per_gpu,
                                                        "reward_model.micro_batch_size_per_gpu"));
  }
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> scores;
  for (const auto& mb : micro.batches) {
    TESSERA_ASSIGN_OR_RETURN(auto seq, ppo::read_sequence_batch(mb));
    TESSERA_ASSIGN_OR_RETURN(at::Tensor values, module_->forward(seq.input_ids, seq.attention_mask, seq.position_ids,
                                                                 ppo::ForwardMode::eval));
    at::Tensor eos_idx = (seq.position_ids * seq.attention_mask).argmax(-1);
    at::Tensor rows = at::arange(values.size(0), at::TensorOptions(at::kLong).device(values.device()));
    scores.push_back(values.index({rows, eos_idx}).to(at::kFloat));
  }
  at::Tensor all = at::cat(scores, 0);
  if (config_.use_dynamic_bsz) return ppo::restore_dynamic_batch(all, micro.indices);
  return all;
}

Result<proto::DataProto> RewardModelWorker::compute_rm_score(const proto::DataProto& data) {
  if (!module_) {
    return make_error(ErrorCode::invalid_argument, "compute_rm_score: init_model has not run on reward_model rank {}",
                      context().rank);
  }
  TESSERA_RETURN_IF_ERROR(ppo::check_text_only(data));
  TESSERA_ASSIGN_OR_RETURN(auto seq, ppo::read_sequence_batch(data));
  if (data.size() == 0) {
    proto::TensorDict t;
    t.insert_or_assign("rm_scores", at::zeros({0, seq.response_length}, at::TensorOptions(at::kFloat)));
    return proto::DataProto::from_dict(std::move(t));
  }
  Stopwatch timer;
  TESSERA_ASSIGN_OR_RETURN(auto scope, OffloadScope::enter(module_->engine(), true));
  Result<at::Tensor> scores = [&]() -> Result<at::Tensor> {
    try {
      return sequence_scores(data);
    } catch (...) {
      return ppo::status_from_current_exception("compute_rm_score");
    }
  }();
  TESSERA_RETURN_IF_ERROR(scope->exit());
  if (!scores.ok()) {
    return name_memory_keys(scores.status(), config_.use_dynamic_bsz ? "reward_model.forward_max_token_len_per_gpu"
                                                                     : "reward_model.micro_batch_size_per_gpu");
  }
  proto::TensorDict t;
  t.insert_or_assign("rm_scores", expand_to_token_level(*scores, seq.attention_mask, seq.position_ids,
                                                        seq.response_length));
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto out, proto::DataProto::from_dict(std::move(t)));
  record_call_metrics(out, "compute_rm_score", timer.seconds());
  return out;
}

}  // namespace tessera::workers
