// step_model.hpp: what the generation loop needs from a model, and nothing more: a batched
// incremental forward over a KV cache, the vocabulary head, and weights that can be swapped by
// reference.
//
// Note [Tensor parallelism seam]
// The loop (internal/generation_loop) never sees heads, layers or parameter shapes; it sizes the
// KV cache from cache_config() and calls forward_step()/logits(). CausalLMStepModel runs the
// decoder layer by layer itself (reusing the models' modules: norms, projections, RoPE, MLP), and
// marks the two places where Megatron-style tensor parallelism needs a sum across ranks: the
// attention output (after o_proj) and the MLP output (after down_proj), each passed to the
// PartialSumHook before the residual add. A rollout TP rank is then:
//  - a CausalLM built from a per-rank config (num_attention_heads / tp, num_key_value_heads / tp,
//    intermediate_size / tp, head_dim kept), so q/k/v/gate/up hold the rank's output columns and
//    o_proj/down_proj the matching input columns, and its KVCache holds only the rank's heads;
//  - a hook that all-reduces over the rollout TP group (collective::Communicator::all_reduce);
//  - load_weights_by_reference() fed with the rank's slices, cut by the sharding manager straight
//    from the FSDP shards (embeddings, norms, Qwen3's per-head q_norm/k_norm, the o_proj bias and
//    lm_head are replicated; Gemma2's post-attention/post-feedforward norms act on the reduced sums). With a hook installed, the o_proj bias is added once after the
//    attention all-reduce, not by every rank before it.
// Every TP peer then computes identical logits and, with the same per-rank seed (verl: dp_rank +
// 1000), samples the same tokens, so the generation loop and the sampler stay unchanged.
//
// Thread-safety: one thread at a time (like the model it wraps).
#pragma once

#include <functional>
#include <memory>

#include <ATen/core/Tensor.h>

#include "proto/status.hpp"
#include "workers/models/config.hpp"
#include "workers/models/kv_cache.hpp"
#include "workers/models/model.hpp"
#include "workers/models/safetensors.hpp"
#include "workers/rollout/paged_kv.hpp"

namespace tessera::models {
class DecoderLayer;
}  // namespace tessera::models

namespace tessera::rollout {

/// A model as the generation loop sees it. See Note [Tensor parallelism seam].
class StepModel {
 public:
  virtual ~StepModel() = default;
  /// The shapes a KV cache for this model (this rank) needs.
  virtual const models::ModelConfig& cache_config() const = 0;
  /// The compute dtype: parameters and KV cache.
  virtual c10::ScalarType dtype() const = 0;
  /// The device of the weights: the KV cache, the step inputs and sampling live there.
  virtual c10::Device device() const = 0;
  /// Appends T tokens per row to `cache` (kv_cache.hpp contract) and returns their final hidden
  /// states [B, T, hidden]. Runs without autograd.
  virtual at::Tensor forward_step(const at::Tensor& input_ids, const at::Tensor& position_ids,
                                  models::KVCache& cache, const at::Tensor& cache_mask) = 0;
  /// One decode step over the paged cache (paged_kv.hpp): row b's token input_ids[b, 0] at
  /// position_ids[b, 0] has its keys/values written to slot batch.slot_mapping[b] and attends to
  /// its row's context. Returns the final hidden states [B, hidden]. Runs without autograd, with
  /// no host synchronisation, on tensors of fixed shape, so it can be captured in a CUDA graph.
  virtual at::Tensor decode_step(const at::Tensor& input_ids, const at::Tensor& position_ids, PagedKV& kv,
                                 const PagedBatch& batch) = 0;
  /// Logits [N, vocab] in the compute dtype for final hidden states [N, hidden] (sample_tokens
  /// reads them as fp32 values; Note [Fused sampling] draws without an fp32 copy).
  virtual at::Tensor logits(const at::Tensor& hidden) = 0;
  /// Makes every parameter alias the tensor of the same HF name (no copy). All names, shapes,
  /// dtypes and devices are checked before anything is swapped: on error nothing changed.
  virtual Status load_weights_by_reference(const models::TensorMap& tensors) = 0;
  /// Number of tensor-parallel ranks this model is one of (1: the whole model).
  virtual int64_t tensor_parallel_size() const { return 1; }
  /// Turns the fused layer ops on or off (engine_kwargs.tessera.fused_layers; models without
  /// them ignore it).
  virtual void set_fused_layers(bool on) { (void)on; }
};

/// Receives a partial sum that tensor parallelism must all-reduce, and leaves the sum in its
/// argument (in place, or by assigning a new tensor). See the Note.
using PartialSumHook = std::function<void(at::Tensor& partial_sum)>;

/// The StepModel over a models::CausalLM (shared, not copied). Same maths as
/// CausalLM::forward_step. Decode steps of fp32 models on the CPU read the paged cache with a
/// dedicated kernel (internal/decode_attention.hpp); elsewhere they gather the rows' blocks and
/// use the models' attention module.
class CausalLMStepModel final : public StepModel {
 public:
  /// `all_reduce`: empty for a single rank; otherwise `model` is one of `tp_size` TP ranks'
  /// models (tensor_parallel.hpp's tp_rank_config). REQUIRES: model != nullptr.
  explicit CausalLMStepModel(std::shared_ptr<models::CausalLM> model, PartialSumHook all_reduce = {},
                             int64_t tp_size = 1);

  const models::ModelConfig& cache_config() const override { return model_->config(); }
  c10::ScalarType dtype() const override;
  c10::Device device() const override;
  at::Tensor forward_step(const at::Tensor& input_ids, const at::Tensor& position_ids, models::KVCache& cache,
                          const at::Tensor& cache_mask) override;
  at::Tensor decode_step(const at::Tensor& input_ids, const at::Tensor& position_ids, PagedKV& kv,
                         const PagedBatch& batch) override;
  at::Tensor logits(const at::Tensor& hidden) override;
  Status load_weights_by_reference(const models::TensorMap& tensors) override;
  int64_t tensor_parallel_size() const override { return tp_size_; }
  void set_fused_layers(bool on) override;

  /// The wrapped model (its parameters are what the engine computes with).
  models::CausalLM& model() const { return *model_; }

 private:
  using AttentionCall =
      std::function<at::Tensor(const models::DecoderLayer& layer, int64_t index, const at::Tensor& x, bool output_bias)>;
  at::Tensor partial_sum(at::Tensor t) const;
  at::Tensor run_layers(at::Tensor h, const AttentionCall& attention) const;

  std::shared_ptr<models::CausalLM> model_;
  PartialSumHook all_reduce_;
  int64_t tp_size_;
};

}  // namespace tessera::rollout
