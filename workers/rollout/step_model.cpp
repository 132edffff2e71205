// step_model.cpp: CausalLMStepModel, the single-rank model seam over models::CausalLM.
#include "workers/rollout/step_model.hpp"

#include <tuple>

#include <utility>

#include <torch/torch.h>

#include "workers/models/decoder.hpp"
#include "workers/models/fused_layers.hpp"
#include "workers/rollout/internal/decode_attention.hpp"
#include "workers/rollout/paged_kv.hpp"

namespace tessera::rollout {
namespace {

// How a decode step reads the paged cache (internal/decode_attention.hpp).
enum class PagedRead { cpu_kernel, cuda_kernel, gather };

// The decoder's attention (decoder.hpp) for one new token per row over the paged cache: project,
// norm (Qwen3) and rotate, write K/V to the rows' slots, attend over each row's context, project
// out (o_proj bias only with `output_bias`). x [B, 1, hidden]. `visible` [B, 1, 1, M * block_size]
// is the gathered path's mask.
at::Tensor paged_attention_block(const models::Attention& attn, const models::ModelConfig& c, const at::Tensor& x,
                                 const models::RotaryTables& rope, PagedKV& kv, int64_t layer,
                                 const PagedBatch& batch, PagedRead read, const at::Tensor& visible, bool output_bias) {
  const int64_t B = x.size(0), KV = c.num_key_value_heads, D = c.head_dim, H = c.num_attention_heads;
  const auto l = static_cast<size_t>(layer);
  std::pair<at::Tensor, at::Tensor> qk = attn.queries_and_keys(x, rope);
  kv.keys[l].view({-1, KV, D}).index_copy_(0, batch.slot_mapping, qk.second.reshape({B, KV, D}));
  kv.values[l].view({-1, KV, D}).index_copy_(0, batch.slot_mapping, attn.values(x).reshape({B, KV, D}));
  at::Tensor out;
  switch (read) {
    case PagedRead::cpu_kernel:
      out = internal::paged_decode_attention(qk.first.reshape({B, H, D}).contiguous(), kv.keys[l], kv.values[l],
                                             batch.block_tables, batch.context_lens, attn.window());
      break;
    case PagedRead::cuda_kernel:
      out = internal::paged_decode_attention_cuda(qk.first.reshape({B, H, D}), kv.keys[l], kv.values[l],
                                                  batch.block_tables, batch.context_lens, attn.window(),
                                                  attn.scaling(), attn.softcap().value_or(0.0), kv.tiled,
                                                  kv.split ? -1 : 1);
      break;
    case PagedRead::gather: {
      // Gather the rows' blocks into [B, KV, M * block_size, D] and attend with the mask.
      const int64_t columns = batch.block_tables.size(1) * kv.block_size;
      const at::Tensor blocks = batch.block_tables.reshape({-1});
      auto gather = [&](const at::Tensor& pool) {
        return pool.index_select(0, blocks).view({B, columns, KV, D}).transpose(1, 2);
      };
      out = attn.attend(qk.first, gather(kv.keys[l]), gather(kv.values[l]), visible);
      break;
    }
  }
  return attn.output(out.reshape({B, 1, H * D}), output_bias);
}

// [B, 1, 1, columns]: position s of row b is visible iff s < len_b and, with a window, s >= len_b - window.
at::Tensor paged_visibility(const PagedBatch& batch, int64_t columns, int64_t window) {
  const at::Tensor pos = at::arange(columns, batch.context_lens.options()).unsqueeze(0);
  const at::Tensor len = batch.context_lens.unsqueeze(1);
  at::Tensor visible = pos < len;
  if (window > 0) visible = visible.logical_and(pos >= len - window);
  return visible.view({len.size(0), 1, 1, columns});
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

// The decoder's layers with the TP reduction points (see Note [Tensor parallelism seam]);
// `attention(layer, index, x, output_bias)` is the attention block of each layer.
at::Tensor CausalLMStepModel::run_layers(at::Tensor h, const AttentionCall& attention) const {
  models::DecoderBackbone& backbone = model_->backbone();
  // Under tensor parallelism each rank's o_proj output is a partial sum: its bias (Llama/Qwen3 with
  // attention_bias) is added once, after the reduction (the bias is replicated, tensor_parallel.hpp).
  const bool bias_after_sum = static_cast<bool>(all_reduce_);
  const auto attention_sum = [&](const models::DecoderLayer& layer, size_t l, const at::Tensor& x) {
    at::Tensor attn = partial_sum(attention(layer, static_cast<int64_t>(l), x, !bias_after_sum));
    const at::Tensor& o_bias = layer.self_attn->o_proj->bias;
    return bias_after_sum && o_bias.defined() ? attn + o_bias : attn;
  };
  const size_t n = backbone.layers.size();
  if (n == 0 || backbone.layers.front()->pre_feedforward_layernorm) {
    // Gemma2's post-attention / post-feedforward norms act on the reduced sums.
    for (size_t l = 0; l < n; ++l) {
      const models::DecoderLayer& layer = *backbone.layers[l];
      h = layer.add_attention(h, attention_sum(layer, l, layer.input_layernorm->forward(h)));
      h = layer.add_mlp(h, partial_sum(layer.feed_forward(layer.mlp_input(h))));
    }
    return backbone.norm->forward(h);
  }
  // Each residual add with the norm after it, across the layer boundary too: one kernel on a GPU
  // (Note [Fused residual norm] in workers/models/fused_layers.cpp), the same ops elsewhere.
  auto [residual, x] = backbone.layers.front()->input_layernorm->add_forward(h, at::Tensor());
  for (size_t l = 0; l < n; ++l) {
    const models::DecoderLayer& layer = *backbone.layers[l];
    std::tie(residual, x) = layer.post_attention_layernorm->add_forward(residual, attention_sum(layer, l, x));
    const models::RMSNorm& next = l + 1 < n ? *backbone.layers[l + 1]->input_layernorm : *backbone.norm;
    std::tie(residual, x) = next.add_forward(residual, partial_sum(layer.feed_forward(x)));
  }
  return x;
}

// DecoderBackbone::forward_step (prefill), layer by layer.
at::Tensor CausalLMStepModel::forward_step(const at::Tensor& input_ids, const at::Tensor& position_ids,
                                           models::KVCache& cache, const at::Tensor& cache_mask) {
  check_step_inputs(input_ids, position_ids, cache, cache_mask);
  at::NoGradGuard no_grad;
  const models::ModelConfig& c = model_->config();
  const models::DecoderBackbone& backbone = model_->backbone();
  const int64_t T = input_ids.size(1), past = cache.length();
  at::Tensor h = backbone.embed(input_ids);
  models::RotaryTables rope = models::make_rotary_tables(position_ids, c, h.scalar_type());
  const at::Tensor visible = models::attention_visibility(cache_mask.narrow(1, 0, past + T), T, past);
  const at::Tensor visible_window = backbone.window_visibility(cache_mask.narrow(1, 0, past + T), T, past);
  at::Tensor out = run_layers(h, [&](const models::DecoderLayer& layer, int64_t li, const at::Tensor& x, bool bias) {
    models::LayerCacheView view{cache.key(li), cache.value(li), past};
    return layer.self_attn->forward(x, rope, layer.self_attn->window() > 0 ? visible_window : visible, &view, bias);
  });
  cache.advance(T);
  return out;
}

at::Tensor CausalLMStepModel::decode_step(const at::Tensor& input_ids, const at::Tensor& position_ids, PagedKV& kv,
                                          const PagedBatch& batch) {
  at::NoGradGuard no_grad;
  const models::ModelConfig& c = model_->config();
  const models::DecoderBackbone& backbone = model_->backbone();
  at::Tensor h = backbone.embed(input_ids);
  models::RotaryTables rope = models::make_rotary_tables(position_ids, c, h.scalar_type());
  // The CPU kernel computes plain scaled-dot-product scores (no Gemma2 scale or softcap); the
  // CUDA kernel takes the layer's scale and softcap.
  const at::Tensor& pool = kv.keys.front();
  PagedRead read = PagedRead::gather;
  if (kv.use_kernel && internal::paged_decode_attention_supported(pool) &&
      backbone.layers.front()->self_attn->plain_scores()) {
    read = PagedRead::cpu_kernel;
  } else if (kv.use_kernel && internal::paged_decode_attention_cuda_supported(pool)) {
    read = PagedRead::cuda_kernel;
  }
  at::Tensor visible, visible_window;
  if (read == PagedRead::gather) {
    const int64_t columns = batch.block_tables.size(1) * kv.block_size;
    visible = paged_visibility(batch, columns, 0);
    if (c.sliding_window) visible_window = paged_visibility(batch, columns, *c.sliding_window);
  }
  at::Tensor out = run_layers(h, [&](const models::DecoderLayer& layer, int64_t li, const at::Tensor& x, bool bias) {
    const bool slides = layer.self_attn->window() > 0;
    return paged_attention_block(*layer.self_attn, c, x, rope, kv, li, batch, read, slides ? visible_window : visible,
                                 bias);
  });
  return out.select(1, 0);
}

void CausalLMStepModel::set_fused_layers(bool on) { models::set_fused_layers(*model_, on); }

at::Tensor CausalLMStepModel::logits(const at::Tensor& hidden) {
  at::NoGradGuard no_grad;
  return model_->compute_dtype_logits(hidden);
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
