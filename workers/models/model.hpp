// model.hpp: the HF-compatible models Tessera trains and serves: CausalLM (HF *ForCausalLM) and
// ValueModel (HF *ForTokenClassification with num_labels=1, used as critic and reward model).
//
// Parameter names are HF's: named_parameters() yields "model.embed_tokens.weight",
// "model.layers.0.self_attn.q_proj.weight", ..., "lm_head.weight" (absent when tied) or
// "score.weight" / "score.bias". Autograd works through forward() (parameters require grad).
//
// Note [Swapping parameters]
// FSDP sets full parameters gathered from shards, and the rollout engine aliases them with zero
// copy. The contract is Tensor::set_data, as torch::nn::Module::to() and PyTorch FSDP use it:
//  - set_parameter(name, t) checks the name and shape, then makes the parameter share t's storage
//    (no copy). Writes through either tensor are visible in both. The parameter stays a leaf and
//    keeps its own .grad; gradients do not flow into `t`.
//  - named_parameters()[name].set_data(t) is allowed too (e.g. to free storage between uses with a
//    zero-size tensor), as long as every parameter has its HF shape whenever forward runs.
//  - All parameters must share one dtype and device when forward runs (the compute dtype).
//  - Tied embeddings: lm_head reads model.embed_tokens.weight each forward, so swapping the
//    embedding swaps the head; there is no lm_head parameter to swap.
// from_parameters() builds a model directly on given tensors under the same contract.
//
// Thread-safety: one thread at a time per model instance (like any torch::nn::Module).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "proto/status.hpp"
#include "workers/models/config.hpp"
#include "workers/models/decoder.hpp"
#include "workers/models/safetensors.hpp"

namespace tessera::models {

class KVCache;

/// How a new model's parameters are created.
struct ModelInit {
  c10::ScalarType dtype = c10::ScalarType::Float;  ///< Parameter (compute) dtype.
  std::optional<uint64_t> seed;  ///< Set: HF init (normal(0, initializer_range), norms 1, biases 0).
                                 ///< Unset: uninitialised memory, to be filled by a loader.
  bool score_bias = true;        ///< ValueModel only: HF's score Linear has a bias.
};

/// The sequence positions an output head runs on: [start, start + length), or every position
/// when length < 0. The PPO losses need the head only at the response positions, so the prompt's
/// logits (a [B, T_prompt, vocab] matmul and buffer) are never computed (HF's logits_to_keep).
struct HeadRows {
  int64_t start = 0;
  int64_t length = -1;
  static HeadRows all() { return {}; }
  bool is_all() const { return length < 0; }
};

/// A decoder backbone ("model.") plus an output head; base of CausalLM and ValueModel.
class PretrainedModel : public torch::nn::Module {
 public:
  const ModelConfig& config() const { return config_; }
  HeadKind head_kind() const { return head_; }
  DecoderBackbone& backbone() const { return *backbone_; }

  /// Every parameter by HF name; the tensors alias the model's parameters.
  TensorMap parameter_map() const;

  /// Makes parameter `name` share `tensor`'s storage (no copy). See Note [Swapping parameters].
  Status set_parameter(const std::string& name, const at::Tensor& tensor);

  /// set_parameter for each entry; with `require_all`, every parameter must be given exactly once.
  Status set_parameters(const TensorMap& tensors, bool require_all);

  /// Output of the head for a full batch: logits [B, T, V] or values [B, T], always fp32.
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& attention_mask, const at::Tensor& position_ids);

  /// Output of the head at `rows` only ([B, rows.length, V] or [B, rows.length]), in the compute
  /// dtype: bf16 logits stay bf16 (a full-vocabulary fp32 copy is what a chunked consumer avoids).
  /// REQUIRES: rows within [0, T).
  virtual at::Tensor forward_head(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                  const at::Tensor& position_ids, HeadRows rows) = 0;

  /// Output of the head at `rows` (int64 indices into the N tokens) of sequences packed without
  /// padding (DecoderBackbone::forward_packed: input_ids / position_ids [1, N]): [n, V] or [n], in
  /// the compute dtype.
  virtual at::Tensor forward_packed_head(const at::Tensor& input_ids, const at::Tensor& position_ids,
                                         std::shared_ptr<const PackedSegments> packed, const at::Tensor& rows) = 0;

 protected:
  PretrainedModel(ModelConfig config, HeadKind head, const ModelInit& init);
  ModelConfig config_;
  HeadKind head_;
  std::shared_ptr<DecoderBackbone> backbone_;
};

/// HF LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM / MistralForCausalLM / Gemma2ForCausalLM /
/// Gemma3ForCausalLM (and the MoE families').
class CausalLM : public PretrainedModel {
 public:
  /// Validates `config` and builds the model. config.architecture is set to the *ForCausalLM name.
  static Result<std::shared_ptr<CausalLM>> create(ModelConfig config, const ModelInit& init = {});
  /// Builds a model whose parameters alias `tensors` (exactly the HF names, HF shapes, one dtype).
  static Result<std::shared_ptr<CausalLM>> from_parameters(ModelConfig config, const TensorMap& tensors);

  /// REQUIRES: a valid config (use create()).
  CausalLM(ModelConfig config, const ModelInit& init);

  /// Logits at `rows` of left-padded input_ids / attention_mask / position_ids [B, T], in the
  /// compute dtype (forward() gives all rows in fp32).
  at::Tensor forward_head(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                          const at::Tensor& position_ids, HeadRows rows) override;
  at::Tensor forward_packed_head(const at::Tensor& input_ids, const at::Tensor& position_ids,
                                 std::shared_ptr<const PackedSegments> packed, const at::Tensor& rows) override;

  /// Incremental decoding: appends T tokens to `cache`, returns their logits [B, T, vocab] (fp32).
  /// `cache_mask` [B, >= cache.length() + T] marks visible cache columns. See kv_cache.hpp.
  at::Tensor forward_step(const at::Tensor& input_ids, const at::Tensor& position_ids, KVCache& cache,
                          const at::Tensor& cache_mask);

  /// The output projection [vocab, hidden]: lm_head.weight, or the embedding when tied.
  const at::Tensor& lm_head_weight() const;

  /// Logits [..., vocab] (fp32) of final-norm hidden states: the projection, then the Gemmas'
  /// final_logit_softcapping (when set) in the compute dtype.
  at::Tensor logits(const at::Tensor& hidden) const;
  /// The same logits in the compute dtype (logits() is their fp32 copy).
  at::Tensor compute_dtype_logits(const at::Tensor& hidden) const;

 private:
  std::shared_ptr<Linear> lm_head_;  ///< Null when tie_word_embeddings.
};

/// HF Llama/Qwen2/Qwen3/Mistral/Gemma2ForTokenClassification with num_labels=1 (transformers has no
/// Gemma3 one: refused for gemma3_text): a scalar
/// `score` head ([1, hidden] weight, optional [1] bias) on every position. Dropout is 0.
class ValueModel : public PretrainedModel {
 public:
  /// Validates `config` and builds the model. config.architecture is set to the value-head name.
  static Result<std::shared_ptr<ValueModel>> create(ModelConfig config, const ModelInit& init = {});

  /// REQUIRES: a valid config (use create()).
  ValueModel(ModelConfig config, const ModelInit& init);

  /// Values at `rows` [B, rows.length], in the compute dtype (forward() gives [B, T] in fp32).
  at::Tensor forward_head(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                          const at::Tensor& position_ids, HeadRows rows) override;
  at::Tensor forward_packed_head(const at::Tensor& input_ids, const at::Tensor& position_ids,
                                 std::shared_ptr<const PackedSegments> packed, const at::Tensor& rows) override;

  Linear& score() const { return *score_; }

 private:
  std::shared_ptr<Linear> score_;
};

/// HF _init_weights for the named parameters of `model` (all when `names` is empty), seeded:
/// normal(0, initializer_range) for matrices and embeddings (pad_token_id row zeroed), 1 for norms
/// (0 for the Gemmas', which scale by 1 + weight),
/// 0 for biases. Deterministic for a given seed and parameter order.
Status initialize_weights(PretrainedModel& model, uint64_t seed, const std::vector<std::string>& names = {});

}  // namespace tessera::models
