// model.cpp: CausalLM / ValueModel heads, parameter swapping and HF-style initialisation.
#include "workers/models/model.hpp"

#include <algorithm>

#include <set>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "workers/models/kv_cache.hpp"

namespace tessera::models {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Status check_dtype(const ModelInit& init) {
  auto name = torch_dtype_name(init.dtype);
  return name.ok() ? Status() : name.status();
}

template <class Model>
Result<std::shared_ptr<Model>> build(ModelConfig config, const ModelInit& init, HeadKind head) {
  TESSERA_RETURN_IF_ERROR(validate_model_config(config, "model config"));
  TESSERA_RETURN_IF_ERROR(check_dtype(init));
  TESSERA_ASSIGN_OR_RETURN(config.architecture, architecture_name(config.model_type, head));
  config.torch_dtype = *torch_dtype_name(init.dtype);
  try {
    auto model = std::make_shared<Model>(std::move(config), init);
    if (init.seed) TESSERA_RETURN_IF_ERROR(initialize_weights(*model, *init.seed));
    return model;
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, "cannot build model: {}", e.what());
  }
}

// HF _init_weights, one rule per parameter kind.
void init_one(const std::string& name, const at::Tensor& p, const ModelConfig& c, at::Generator& gen) {
  if (ends_with(name, "norm.weight")) {
    p.fill_(c.gemma_norms() ? 0.0 : 1.0);  // Gemma2 norms scale by (1 + weight)
  } else if (ends_with(name, ".bias")) {
    p.zero_();
  } else {
    p.normal_(0.0, c.initializer_range, gen);
    if (name == "model.embed_tokens.weight" && c.pad_token_id && *c.pad_token_id >= 0 &&
        *c.pad_token_id < p.size(0)) {
      p.select(0, *c.pad_token_id).zero_();
    }
  }
}

}  // namespace

PretrainedModel::PretrainedModel(ModelConfig config, HeadKind head, const ModelInit& init)
    : torch::nn::Module(head == HeadKind::causal_lm ? "CausalLM" : "ValueModel"),
      config_(std::move(config)),
      head_(head) {
  backbone_ = register_module("model", std::make_shared<DecoderBackbone>(config_, at::TensorOptions().dtype(init.dtype)));
}

TensorMap PretrainedModel::parameter_map() const {
  TensorMap out;
  for (const auto& item : named_parameters()) out.emplace(item.key(), item.value());
  return out;
}

Status PretrainedModel::set_parameter(const std::string& name, const at::Tensor& tensor) {
  auto params = named_parameters();
  at::Tensor* p = params.find(name);
  if (p == nullptr) {
    return make_error(ErrorCode::not_found, "{}: no parameter '{}'", config_.architecture, name);
  }
  if (!tensor.defined() || tensor.sizes() != p->sizes()) {
    return make_error(ErrorCode::invalid_argument, "{}: parameter '{}' has shape {}, got {}", config_.architecture,
                      name, fmt::to_string(fmt::join(p->sizes(), ",")),
                      tensor.defined() ? fmt::to_string(fmt::join(tensor.sizes(), ",")) : std::string("undefined"));
  }
  try {
    p->set_data(tensor);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::invalid_argument, "{}: cannot alias parameter '{}': {}", config_.architecture, name,
                      e.what());
  }
  return Status();
}

Status PretrainedModel::set_parameters(const TensorMap& tensors, bool require_all) {
  for (const auto& [name, t] : tensors) TESSERA_RETURN_IF_ERROR(set_parameter(name, t));
  if (!require_all) return Status();
  for (const auto& item : named_parameters()) {
    if (tensors.count(item.key()) == 0) {
      return make_error(ErrorCode::not_found, "{}: parameter '{}' not given", config_.architecture, item.key());
    }
  }
  return Status();
}

CausalLM::CausalLM(ModelConfig config, const ModelInit& init)
    : PretrainedModel(std::move(config), HeadKind::causal_lm, init) {
  if (!config_.tie_word_embeddings) {
    lm_head_ = register_module("lm_head", std::make_shared<Linear>(config_.hidden_size, config_.vocab_size, false,
                                                                   at::TensorOptions().dtype(init.dtype)));
  }
}

Result<std::shared_ptr<CausalLM>> CausalLM::create(ModelConfig config, const ModelInit& init) {
  return build<CausalLM>(std::move(config), init, HeadKind::causal_lm);
}

Result<std::shared_ptr<CausalLM>> CausalLM::from_parameters(ModelConfig config, const TensorMap& tensors) {
  auto embed = tensors.find("model.embed_tokens.weight");
  if (embed == tensors.end()) return make_error(ErrorCode::not_found, "from_parameters: no 'model.embed_tokens.weight'");
  ModelInit init;
  init.dtype = embed->second.scalar_type();
  TESSERA_ASSIGN_OR_RETURN(auto model, create(std::move(config), init));
  TESSERA_RETURN_IF_ERROR(model->set_parameters(tensors, /*require_all=*/true));
  return model;
}

const at::Tensor& CausalLM::lm_head_weight() const {
  return lm_head_ ? lm_head_->weight : backbone_->embed_tokens->weight;
}

namespace {

at::Tensor head_rows(const at::Tensor& hidden, HeadRows rows) {
  return rows.is_all() ? hidden : hidden.narrow(1, rows.start, rows.length);
}

}  // namespace

at::Tensor PretrainedModel::forward(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                    const at::Tensor& position_ids) {
  return forward_head(input_ids, attention_mask, position_ids, HeadRows::all()).to(at::kFloat);
}

at::Tensor CausalLM::compute_dtype_logits(const at::Tensor& hidden) const {
  at::Tensor out = at::linear(hidden, lm_head_weight());
  if (const auto& cap = config_.final_logit_softcapping) out = at::tanh(out / *cap) * *cap;  // in the compute dtype, as HF
  return out;
}

at::Tensor CausalLM::logits(const at::Tensor& hidden) const { return compute_dtype_logits(hidden).to(at::kFloat); }

at::Tensor CausalLM::forward_head(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                  const at::Tensor& position_ids, HeadRows rows) {
  return compute_dtype_logits(head_rows(backbone_->forward(input_ids, attention_mask, position_ids), rows));
}

at::Tensor CausalLM::forward_step(const at::Tensor& input_ids, const at::Tensor& position_ids, KVCache& cache,
                                  const at::Tensor& cache_mask) {
  at::NoGradGuard no_grad;
  return logits(backbone_->forward_step(input_ids, position_ids, cache, cache_mask));
}

at::Tensor CausalLM::forward_packed_head(const at::Tensor& input_ids, const at::Tensor& position_ids,
                                         std::shared_ptr<const PackedSegments> packed, const at::Tensor& rows) {
  at::Tensor hidden = backbone_->forward_packed(input_ids, position_ids, std::move(packed)).squeeze(0);
  return compute_dtype_logits(hidden.index_select(0, rows));
}

ValueModel::ValueModel(ModelConfig config, const ModelInit& init)
    : PretrainedModel(std::move(config), HeadKind::value, init) {
  score_ = register_module("score", std::make_shared<Linear>(config_.hidden_size, 1, init.score_bias,
                                                             at::TensorOptions().dtype(init.dtype)));
}

Result<std::shared_ptr<ValueModel>> ValueModel::create(ModelConfig config, const ModelInit& init) {
  config.extra["id2label"] = {{"0", "LABEL_0"}};
  config.extra["label2id"] = {{"LABEL_0", 0}};
  return build<ValueModel>(std::move(config), init, HeadKind::value);
}

at::Tensor ValueModel::forward_head(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                    const at::Tensor& position_ids, HeadRows rows) {
  at::Tensor hidden = head_rows(backbone_->forward(input_ids, attention_mask, position_ids), rows);
  return score_->forward(hidden).squeeze(-1);
}

at::Tensor ValueModel::forward_packed_head(const at::Tensor& input_ids, const at::Tensor& position_ids,
                                           std::shared_ptr<const PackedSegments> packed, const at::Tensor& rows) {
  at::Tensor hidden = backbone_->forward_packed(input_ids, position_ids, std::move(packed)).squeeze(0);
  return score_->forward(hidden.index_select(0, rows)).squeeze(-1);
}

Status initialize_weights(PretrainedModel& model, uint64_t seed, const std::vector<std::string>& names) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  auto params = model.named_parameters();
  std::set<std::string> wanted(names.begin(), names.end());
  for (const std::string& n : wanted) {
    if (params.find(n) == nullptr) return make_error(ErrorCode::not_found, "initialize_weights: no parameter '{}'", n);
  }
  at::NoGradGuard no_grad;
  // Drawn in fp32 on the CPU whatever the parameter's dtype/device, so a bf16 model is exactly the
  // rounded fp32 one for the same seed; into one scratch buffer of the largest size, so that a
  // large model's init faults in one temporary instead of one per parameter (at 7B, half the
  // init-model time on a VM went to page faults).
  int64_t largest = 0;
  for (const auto& item : params) {
    if (wanted.empty() || wanted.count(item.key()) != 0) largest = std::max(largest, item.value().numel());
  }
  const at::Tensor scratch = at::empty({largest}, at::TensorOptions().dtype(at::kFloat));
  for (const auto& item : params) {
    if (!wanted.empty() && wanted.count(item.key()) == 0) continue;
    at::Tensor value = scratch.narrow(0, 0, item.value().numel()).view(item.value().sizes());
    init_one(item.key(), value, model.config(), gen);
    item.value().copy_(value);
  }
  return Status();
}

}  // namespace tessera::models
