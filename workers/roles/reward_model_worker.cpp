// reward_model_worker.cpp: RewardModelWorker (see reward_model_worker.hpp).
#include "workers/roles/reward_model_worker.hpp"

#include <utility>

#include <torch/torch.h>

#include "workers/models/model_io.hpp"
#include "workers/ppo/packing.hpp"
#include "workers/ppo/ppo_batching.hpp"
#include "workers/ppo/ppo_inputs.hpp"
#include "workers/tokenizer/chat_template.hpp"
#include "workers/tokenizer/tokenizer.hpp"

namespace tessera::workers {

using json = nlohmann::json;
using dispatch::Args;
namespace Dispatch = dispatch::Dispatch;
using dispatch::Value;

namespace {

// reward_model.truncation: verl's postprocess_data sides.
Status check_truncation(const std::string& truncation) {
  if (truncation == "left" || truncation == "right" || truncation == "middle" || truncation == "error") return Status();
  return make_error(ErrorCode::invalid_argument, "reward_model.truncation = '{}': expected left, right, middle or error",
                    truncation);
}

}  // namespace

Result<proto::DataProto> switch_chat_template(const proto::DataProto& data, const ChatTemplateSwitch& s) {
  const std::string key = "reward_model.model.input_tokenizer";
  auto raw = data.column("raw_prompt");
  if (!raw.ok() || raw->type() != proto::ColumnType::json || raw->width() != 1) {
    return make_error(ErrorCode::invalid_argument,
                      "{}: re-templating for the reward model needs the prompts' chat messages (a JSON non-tensor column "
                      "raw_prompt), which this batch {}; set {}=null to score the policy's tokens as given",
                      key, raw.ok() ? "holds in another form" : "lacks", key);
  }
  TESSERA_RETURN_IF_ERROR(check_truncation(s.truncation));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor responses, data.tensor("responses"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor mask, data.tensor("attention_mask"));
  const int64_t rows = data.size(), width = mask.size(1), response_length = responses.size(1);
  const int64_t max_length = s.max_length.value_or(width);
  if (max_length < 1) return make_error(ErrorCode::invalid_argument, "reward_model.max_length = {}: must be >= 1", max_length);
  std::optional<int32_t> pad = s.target.pad_token_id();
  if (!pad) pad = s.target.eos_token_id();  // verl's hf_tokenizer sets pad to eos when missing
  const std::string eos = s.input.config().eos_token.value_or("");
  // Host boundary, deliberate (both reads): the responses are decoded and re-tokenized as text on
  // the host, once per call; the result goes back to the responses' device.
  const at::Tensor ids_cpu = responses.to(at::kCPU).to(at::kLong).contiguous();
  const at::Tensor valid = mask.narrow(1, width - response_length, response_length).sum(1).to(at::kCPU).to(at::kLong);
  const auto valid_a = valid.accessor<int64_t, 1>();
  std::vector<std::vector<int32_t>> kept(static_cast<size_t>(rows));
  tokenizer::DecodeOptions decode;
  decode.lossy_utf8 = true;  // as HF's decode
  for (int64_t i = 0; i < rows; ++i) {
    const auto row_error = [&](const Status& st) { return st.with_context(fmt::format("{}: row {}", key, i)); };
    const json& prompt = raw->json_value(i);
    if (!prompt.is_array()) {
      return make_error(ErrorCode::invalid_argument, "{}: row {}'s raw_prompt is not a list of chat messages: {}", key,
                        i, prompt.dump().substr(0, 80));
    }
    const int64_t* r = ids_cpu[i].data_ptr<int64_t>();
    auto response = s.input.decode(std::vector<int32_t>(r, r + valid_a[i]), decode);
    if (!response.ok()) return row_error(response.status());
    if (!eos.empty()) {  // verl: response.replace(src_tokenizer.eos_token, "")
      for (size_t at = response->find(eos); at != std::string::npos; at = response->find(eos, at)) response->erase(at, eos.size());
    }
    json chat = prompt;
    chat.push_back(json{{"role", "assistant"}, {"content", *response}});
    auto text = s.chat.render_json(chat, /*add_generation_prompt=*/false);
    if (!text.ok()) return row_error(text.status());
    auto tokens = s.target.encode(*text);
    if (!tokens.ok()) return row_error(tokens.status());
    std::vector<int32_t>& out = kept[static_cast<size_t>(i)];
    const auto length = static_cast<int64_t>(tokens->size());
    if (length <= max_length) {
      out = std::move(*tokens);
    } else if (s.truncation == "left") {
      out.assign(tokens->end() - max_length, tokens->end());
    } else if (s.truncation == "right") {
      out.assign(tokens->begin(), tokens->begin() + max_length);
    } else if (s.truncation == "middle") {
      const int64_t left = max_length / 2, right = max_length - left;
      out.assign(tokens->begin(), tokens->begin() + left);
      out.insert(out.end(), tokens->end() - right, tokens->end());
    } else {
      return make_error(ErrorCode::invalid_argument,
                        "{}: row {} is {} tokens for the reward model, more than reward_model.max_length = {} "
                        "(reward_model.truncation=error)", key, i, length, max_length);
    }
    if (static_cast<int64_t>(out.size()) < max_length && !pad) {
      return make_error(ErrorCode::invalid_argument, "reward_model.model.path: the reward model's tokenizer ({}) has no "
                        "pad or eos token to pad row {} with", s.target.source(), i);
    }
  }
  at::Tensor out_ids = at::full({rows, max_length}, static_cast<int64_t>(pad.value_or(0)), at::kLong);
  at::Tensor out_mask = at::zeros({rows, max_length}, at::kLong);
  auto ids_a = out_ids.accessor<int64_t, 2>();
  auto mask_a = out_mask.accessor<int64_t, 2>();
  for (int64_t i = 0; i < rows; ++i) {  // right padding
    const auto& row = kept[static_cast<size_t>(i)];
    for (size_t j = 0; j < row.size(); ++j) ids_a[i][static_cast<int64_t>(j)] = row[j], mask_a[i][static_cast<int64_t>(j)] = 1;
  }
  proto::TensorDict t;
  t.insert_or_assign("input_ids", out_ids.to(responses.device()));
  t.insert_or_assign("attention_mask", out_mask.to(responses.device()));
  t.insert_or_assign("position_ids", (out_mask.cumsum(1) - 1).clamp_min(0).to(responses.device()));
  return proto::DataProto::from_dict(std::move(t));
}

Result<RewardModelConfig> parse_reward_model_config(const json& j, int64_t world_size) {
  RewardModelConfig c;
  ppo::ConfigReader r(j, "reward_model");
  // The driver's keys (the reward manager's, and where the reward function runs).
  for (const char* k : {"_target_", "enable", "strategy", "reward_manager", "launch_reward_fn_async",
                        "sandbox_fusion", "profiler", "reward_kwargs", "overlong_buffer"}) {
    r.skip(k);
  }
  r.field("max_length", c.max_length);
  r.field("truncation", c.truncation);
  const json& model = r.nested("model");
  r.field("micro_batch_size", c.micro_batch_size);
  r.field("micro_batch_size_per_gpu", c.micro_batch_size_per_gpu);
  r.field("use_dynamic_bsz", c.use_dynamic_bsz);
  r.field("forward_max_token_len_per_gpu", c.forward_max_token_len_per_gpu);
  r.field("ulysses_sequence_parallel_size", c.ulysses_sequence_parallel_size);
  TESSERA_RETURN_IF_ERROR(r.finish());
  TESSERA_ASSIGN_OR_RETURN(c.model, parse_model_section(model, "reward_model.model"));
  if (c.model.lora.enabled()) {
    return make_error(ErrorCode::unimplemented, "reward_model.model.lora_rank = {}: a reward model is never trained, "
                      "LoRA has nothing to adapt", c.model.lora.rank);
  }
  TESSERA_RETURN_IF_ERROR(check_truncation(c.truncation));
  if (c.max_length && *c.max_length < 1) {
    return make_error(ErrorCode::invalid_argument, "reward_model.max_length = {}: must be >= 1", *c.max_length);
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
  TESSERA_RETURN_IF_ERROR(ppo::check_positive("reward_model.ulysses_sequence_parallel_size",
                                              c.ulysses_sequence_parallel_size));
  if (c.ulysses_sequence_parallel_size > 1 && !c.model.use_remove_padding) {
    return make_error(ErrorCode::invalid_argument, "reward_model.ulysses_sequence_parallel_size = {} > 1 requires "
                      "reward_model.model.use_remove_padding = true", c.ulysses_sequence_parallel_size);
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
  // Re-templating first: its errors come before the weights are loaded, and a failed init leaves
  // nothing half-built.
  if (config_.model.input_tokenizer) {  // verl's _do_switch_chat_template
    const std::string key = "reward_model.model.input_tokenizer";
    auto input = tokenizer::Tokenizer::from_dir_as_verl(*config_.model.input_tokenizer);  // verl's hf_tokenizer
    if (!input.ok()) return input.status().with_context(key);
    auto target = tokenizer::Tokenizer::from_dir_as_verl(config_.model.path);
    if (!target.ok()) {
      return target.status().with_context(fmt::format("reward_model.model.path (the reward model's tokenizer, for "
                                                      "re-templating; or set {}=null)", key));
    }
    auto chat = tokenizer::ChatTemplate::from_name("auto", target->config());
    if (!chat.ok()) {
      return make_error(ErrorCode::invalid_argument, "{}: re-templating needs the reward model's chat template, and {} has "
                        "none; set {}=null to score the policy's tokens as given", key, target->source(), key);
    }
    input_tokenizer_ = std::make_shared<const tokenizer::Tokenizer>(std::move(*input));
    rm_tokenizer_ = std::make_shared<const tokenizer::Tokenizer>(std::move(*target));
    rm_template_ = std::make_shared<const tokenizer::ChatTemplate>(std::move(*chat));
  }
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
  TESSERA_ASSIGN_OR_RETURN(ulysses_, ulysses_group(world_, config_.ulysses_sequence_parallel_size, model->config(),
                                                   "reward_model.ulysses_sequence_parallel_size",
                                                   config_.model.use_remove_padding, "reward_model.model.use_remove_padding"));
  return check_on_device(module_->engine(), device(), context().rank);
}

Result<at::Tensor> RewardModelWorker::sequence_scores(const proto::DataProto& data) {
  static const std::vector<std::string> keys = {"input_ids", "attention_mask", "position_ids"};
  TESSERA_ASSIGN_OR_RETURN(auto selected, data.select(keys, std::vector<std::string>{}));
  // Note [Ulysses sequence parallelism]: the group's rows, and a token budget for all of them.
  if (ulysses_) {
    TESSERA_ASSIGN_OR_RETURN(selected, ulysses_->gather_rows(selected));
  }
  const bool packed = config_.model.use_remove_padding;
  ppo::MicroBatches micro;
  if (config_.use_dynamic_bsz) {
    TESSERA_ASSIGN_OR_RETURN(micro, ppo::rearrange_micro_batches(
                                        selected, config_.forward_max_token_len_per_gpu * config_.ulysses_sequence_parallel_size,
                                        "reward_model.forward_max_token_len_per_gpu", ppo::make_dp_count_sync(world_)));
  } else {
    TESSERA_ASSIGN_OR_RETURN(micro, ppo::split_micro_batches(selected, *config_.micro_batch_size_per_gpu,
                                                        "reward_model.micro_batch_size_per_gpu"));
  }
  TESSERA_ASSIGN_OR_RETURN(auto host_masks, ppo::micro_batch_host_masks(selected, micro, packed));
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> scores;
  for (size_t i = 0; i < micro.batches.size(); ++i) {  // checked by compute_rm_score (or made by switch_chat_template)
    const proto::DataProto& mb = micro.batches[i];
    TESSERA_ASSIGN_OR_RETURN(at::Tensor input_ids, mb.tensor("input_ids"));
    TESSERA_ASSIGN_OR_RETURN(at::Tensor attention_mask, mb.tensor("attention_mask"));
    TESSERA_ASSIGN_OR_RETURN(at::Tensor position_ids, mb.tensor("position_ids"));
    at::Tensor values;
    if (packed) {  // padding-free (verl's use_remove_padding): the score head on every real token
      TESSERA_ASSIGN_OR_RETURN(ppo::PackedBatch p, ppo::pack_rows(input_ids, attention_mask, position_ids,
                                                                  models::HeadRows{0, input_ids.size(1)}, host_masks[i],
                                                                  ulysses_));
      TESSERA_ASSIGN_OR_RETURN(at::Tensor head, module_->forward_packed(p, ppo::ForwardMode::eval));
      values = ppo::unpack_responses(head.to(at::kFloat), p);  // [B, T], the group's values with Ulysses
    } else {
      TESSERA_ASSIGN_OR_RETURN(values, module_->forward(input_ids, attention_mask, position_ids, ppo::ForwardMode::eval));
    }
    at::Tensor eos_idx = (position_ids * attention_mask).argmax(-1);
    at::Tensor rows = at::arange(values.size(0), at::TensorOptions(at::kLong).device(values.device()));
    scores.push_back(values.index({rows, eos_idx}).to(at::kFloat));
  }
  at::Tensor all = at::cat(scores, 0);
  if (config_.use_dynamic_bsz) {
    TESSERA_ASSIGN_OR_RETURN(all, ppo::restore_dynamic_batch(all, micro.indices));
  }
  return ulysses_ ? ulysses_->local_rows(all) : all;  // this rank's rows
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
  proto::DataProto rm_data = data;
  if (rm_template_) {  // verl: the reward model reads its own template of the chat
    TESSERA_ASSIGN_OR_RETURN(rm_data, switch_chat_template(data, ChatTemplateSwitch{*input_tokenizer_, *rm_tokenizer_,
                                                                                   *rm_template_, config_.max_length,
                                                                                   config_.truncation}));
  }
  TESSERA_ASSIGN_OR_RETURN(auto scope, OffloadScope::enter(module_->engine(), true));
  Result<at::Tensor> scores = [&]() -> Result<at::Tensor> {
    try {
      return sequence_scores(rm_data);
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
