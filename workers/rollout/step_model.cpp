// step_model.cpp: CausalLMStepModel, the single-rank model seam over models::CausalLM.
#include "workers/rollout/step_model.hpp"

#include <torch/torch.h>

namespace tessera::rollout {
namespace {

std::string shape_string(const at::Tensor& t) { return fmt::format("[{}]", fmt::join(t.sizes(), ",")); }

// Checks one incoming tensor against the parameter it will replace.
Status check_alias(const std::string& name, const at::Tensor& param, const at::Tensor& given) {
  if (!given.defined()) return make_error(ErrorCode::invalid_argument, "load_weights_by_reference: '{}' is undefined", name);
  if (given.sizes() != param.sizes()) {
    return make_error(ErrorCode::invalid_argument, "load_weights_by_reference: '{}' has shape {}, the model needs {}", name,
                      shape_string(given), shape_string(param));
  }
  if (given.scalar_type() != param.scalar_type()) {
    return make_error(ErrorCode::invalid_argument,
                      "load_weights_by_reference: '{}' is {}, the engine computes in {} (aliasing cannot cast)", name,
                      c10::toString(given.scalar_type()), c10::toString(param.scalar_type()));
  }
  if (given.device() != param.device()) {
    return make_error(ErrorCode::invalid_argument, "load_weights_by_reference: '{}' is on {}, the engine runs on {}", name,
                      given.device().str(), param.device().str());
  }
  return Status();
}

}  // namespace

CausalLMStepModel::CausalLMStepModel(std::shared_ptr<models::CausalLM> model) : model_(std::move(model)) {}

c10::ScalarType CausalLMStepModel::dtype() const { return model_->lm_head_weight().scalar_type(); }

at::Tensor CausalLMStepModel::forward_step(const at::Tensor& input_ids, const at::Tensor& position_ids,
                                           models::KVCache& cache, const at::Tensor& cache_mask) {
  return model_->backbone().forward_step(input_ids, position_ids, cache, cache_mask);
}

at::Tensor CausalLMStepModel::logits(const at::Tensor& hidden) {
  at::NoGradGuard no_grad;
  return at::linear(hidden, model_->lm_head_weight()).to(at::kFloat);
}

Status CausalLMStepModel::load_weights_by_reference(const models::TensorMap& tensors) {
  models::TensorMap params = model_->parameter_map();
  for (const auto& [name, given] : tensors) {
    auto it = params.find(name);
    if (it == params.end()) {
      return make_error(ErrorCode::not_found, "load_weights_by_reference: the model has no parameter '{}'", name);
    }
    TESSERA_RETURN_IF_ERROR(check_alias(name, it->second, given));
  }
  for (const auto& [name, param] : params) {
    if (tensors.count(name) == 0) {
      return make_error(ErrorCode::not_found, "load_weights_by_reference: parameter '{}' was not given", name);
    }
  }
  return model_->set_parameters(tensors, /*require_all=*/true);
}

}  // namespace tessera::rollout
