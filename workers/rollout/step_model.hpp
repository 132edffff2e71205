// step_model.hpp: what the generation loop needs from a model, and nothing more: a batched
// incremental forward over a KV cache, the vocabulary head, and weights that can be swapped by
// reference.
//
// Note [Tensor parallelism seam]
// The loop (internal/generation_loop) never sees heads, layers or parameter shapes; it sizes the
// KV cache from cache_config() and calls forward_step()/logits(). Rollout TP therefore lands as a
// second StepModel, without touching the loop or the sampler:
//  - cache_config() reports the per-rank shapes (num_attention_heads / tp, num_key_value_heads /
//    tp, intermediate_size / tp), so each rank's KVCache holds only its heads;
//  - forward_step() runs q/k/v and gate/up column-split (the rank's heads / MLP columns) and o_proj /
//    down_proj row-split, then calls an all-reduce hook (collective::Communicator::all_reduce over
//    the rollout TP group) on each partial sum before the residual add;
//  - logits() computes the rank's vocabulary slice and all-gathers it, so every TP peer samples
//    from identical logits; with the same per-rank seed (verl: dp_rank + 1000) they then draw the
//    same tokens.
// load_weights_by_reference() then receives only the rank's slices (the sharding manager cuts them
// from FSDP shards), keeping the colocated reshard copy-free.
//
// Thread-safety: one thread at a time (like the model it wraps).
#pragma once

#include <memory>

#include <ATen/core/Tensor.h>

#include "proto/status.hpp"
#include "workers/models/config.hpp"
#include "workers/models/kv_cache.hpp"
#include "workers/models/model.hpp"
#include "workers/models/safetensors.hpp"

namespace tessera::rollout {

/// A model as the generation loop sees it. See Note [Tensor parallelism seam].
class StepModel {
 public:
  virtual ~StepModel() = default;
  /// The shapes a KV cache for this model (this rank) needs.
  virtual const models::ModelConfig& cache_config() const = 0;
  /// The compute dtype: parameters and KV cache.
  virtual c10::ScalarType dtype() const = 0;
  /// Appends T tokens per row to `cache` (kv_cache.hpp contract) and returns their final hidden
  /// states [B, T, hidden]. Runs without autograd.
  virtual at::Tensor forward_step(const at::Tensor& input_ids, const at::Tensor& position_ids,
                                  models::KVCache& cache, const at::Tensor& cache_mask) = 0;
  /// fp32 logits [N, vocab] for final hidden states [N, hidden].
  virtual at::Tensor logits(const at::Tensor& hidden) = 0;
  /// Makes every parameter alias the tensor of the same HF name (no copy). All names, shapes,
  /// dtypes and devices are checked before anything is swapped: on error nothing changed.
  virtual Status load_weights_by_reference(const models::TensorMap& tensors) = 0;
};

/// The single-rank StepModel over a models::CausalLM (shared, not copied).
class CausalLMStepModel final : public StepModel {
 public:
  /// REQUIRES: model != nullptr.
  explicit CausalLMStepModel(std::shared_ptr<models::CausalLM> model);

  const models::ModelConfig& cache_config() const override { return model_->config(); }
  c10::ScalarType dtype() const override;
  at::Tensor forward_step(const at::Tensor& input_ids, const at::Tensor& position_ids, models::KVCache& cache,
                          const at::Tensor& cache_mask) override;
  at::Tensor logits(const at::Tensor& hidden) override;
  Status load_weights_by_reference(const models::TensorMap& tensors) override;

  /// The wrapped model (its parameters are what the engine computes with).
  models::CausalLM& model() const { return *model_; }

 private:
  std::shared_ptr<models::CausalLM> model_;
};

}  // namespace tessera::rollout
