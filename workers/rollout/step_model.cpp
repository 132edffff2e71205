// step_model.cpp: CausalLMStepModel, the single-rank model seam over models::CausalLM.
#include "workers/rollout/step_model.hpp"

#include <utility>

#include <torch/torch.h>

#include "workers/models/decoder.hpp"
#include "workers/rollout/internal/decode_attention.hpp"

namespace tessera::rollout {
namespace {

// The decoder's attention (decoder.hpp) for one new token per row: project, norm (Qwen3) and
// rotate, append K/V to the cache at column `past`, attend over the visible columns with the
// cache-reading kernel, project out (o_proj bias only with `output_bias`). x [B, 1, hidden];
// visible [B, >= past + 1] bool with unit column stride.
at::Tensor decode_attention_block(const models::Attention& attn, const models::ModelConfig& c, const at::Tensor& x,
                                  const models::RotaryTables& rope, models::KVCache& cache, int64_t layer,
                                  const at::Tensor& visible, bool output_bias) {
  const int64_t B = x.size(0), past = cache.length();
  std::pair<at::Tensor, at::Tensor> qk = attn.queries_and_keys(x, rope);
  at::Tensor v = attn.values(x);
  cache.key(layer).narrow(2, past, 1).copy_(qk.second);
  cache.value(layer).narrow(2, past, 1).copy_(v);
  at::Tensor out = internal::decode_attention(qk.first.reshape({B, c.num_attention_heads, c.head_dim}).contiguous(),
                                              cache.key(layer), cache.value(layer), visible, past + 1);
  return attn.output(out.view({B, 1, c.num_attention_heads * c.head_dim}), output_bias);
}

void check_step_inputs(const at::Tensor& ids, const at::Tensor& pos, const models::KVCache& cache,
                       const at::Tensor& mask) {
  const int64_t B = ids.size(0), T = ids.size(1), past = cache.length();
  TORCH_CHECK(ids.dim() == 2 && pos.sizes() == ids.sizes(), "forward_step: input_ids and position_ids must be [B, T]");
  TORCH_CHECK(B == cache.batch_size(), "forward_step: batch ", B, " != cache batch ", cache.batch_size());
  TORCH_CHECK(past + T <= cache.capacity(), "forward_step: cache full (", past, " + ", T, " > ", cache.capacity(), ")");
  TORCH_CHECK(mask.dim() == 2 && mask.size(0) == B && mask.size(1) >= past + T, "forward_step: cache_mask must be [",
              B, ", >= ", past + T, "], got ", mask.sizes());
}

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

CausalLMStepModel::CausalLMStepModel(std::shared_ptr<models::CausalLM> model, PartialSumHook all_reduce,
                                     int64_t tp_size)
    : model_(std::move(model)), all_reduce_(std::move(all_reduce)), tp_size_(tp_size) {}

c10::ScalarType CausalLMStepModel::dtype() const { return model_->lm_head_weight().scalar_type(); }

c10::Device CausalLMStepModel::device() const { return model_->lm_head_weight().device(); }

at::Tensor CausalLMStepModel::partial_sum(at::Tensor t) const {
  if (all_reduce_) all_reduce_(t);
  return t;
}

// DecoderBackbone::forward_step, layer by layer, with the TP reduction points and the decode
// kernel (see Note [Tensor parallelism seam]).
at::Tensor CausalLMStepModel::forward_step(const at::Tensor& input_ids, const at::Tensor& position_ids,
                                           models::KVCache& cache, const at::Tensor& cache_mask) {
  check_step_inputs(input_ids, position_ids, cache, cache_mask);
  at::NoGradGuard no_grad;
  const models::ModelConfig& c = model_->config();
  models::DecoderBackbone& backbone = model_->backbone();
  const int64_t T = input_ids.size(1), past = cache.length();
  at::Tensor h = backbone.embed(input_ids);
  models::RotaryTables rope = models::make_rotary_tables(position_ids, c, h.scalar_type());
  // Under tensor parallelism each rank's o_proj output is a partial sum: its bias (Llama/Qwen3 with
  // attention_bias) is added once, after the reduction (the bias is replicated, tensor_parallel.hpp).
  const bool bias_after_sum = static_cast<bool>(all_reduce_);
  // The decode kernel computes plain scaled-dot-product scores (no Gemma2 scale or softcap).
  const bool decode = T == 1 && internal::decode_attention_supported(cache.key(0)) &&
                      backbone.layers.front()->self_attn->plain_scores();
  at::Tensor visible, visible_window;
  if (decode) {
    visible = cache_mask.scalar_type() == at::kBool && cache_mask.stride(1) == 1 ? cache_mask
                                                                                  : cache_mask.to(at::kBool).contiguous();
    if (c.sliding_window) visible_window = models::last_query_window(cache_mask, past + 1, *c.sliding_window);
  } else {
    visible = models::attention_visibility(cache_mask.narrow(1, 0, past + T), T, past);
    visible_window = backbone.window_visibility(cache_mask.narrow(1, 0, past + T), T, past);
  }
  for (size_t l = 0; l < backbone.layers.size(); ++l) {
    const models::DecoderLayer& layer = *backbone.layers[l];
    const int64_t li = static_cast<int64_t>(l);
    const at::Tensor& mask = layer.self_attn->window() > 0 ? visible_window : visible;
    at::Tensor x = layer.input_layernorm->forward(h);
    at::Tensor attn;
    if (decode) {
      attn = decode_attention_block(*layer.self_attn, c, x, rope, cache, li, mask, !bias_after_sum);
    } else {
      models::LayerCacheView view{cache.key(li), cache.value(li), past};
      attn = layer.self_attn->forward(x, rope, mask, &view, !bias_after_sum);
    }
    attn = partial_sum(attn);
    const at::Tensor& o_bias = layer.self_attn->o_proj->bias;
    if (bias_after_sum && o_bias.defined()) attn = attn + o_bias;
    // Gemma2's post-attention / post-feedforward norms act on the reduced sums.
    h = layer.add_attention(h, attn);
    h = layer.add_mlp(h, partial_sum(layer.mlp->forward(layer.mlp_input(h))));
  }
  cache.advance(T);
  return backbone.norm->forward(h);
}

at::Tensor CausalLMStepModel::logits(const at::Tensor& hidden) {
  at::NoGradGuard no_grad;
  return model_->logits(hidden);
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
