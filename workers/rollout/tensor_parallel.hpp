// tensor_parallel.hpp: rollout tensor parallelism (Megatron-style, as vLLM does it for verl):
// which slice of each HF parameter a TP rank holds, the per-rank model shape, how the slices are
// cut straight from FSDP shards, and verl's all-gather of the prompts within the TP group.
//
// Note [Rollout TP slicing]
// With T = tensor_model_parallel_size, TP rank t of a decoder layer holds
//   - q/k/v_proj weight and bias, gate/up_proj weight: rows [t*out/T, (t+1)*out/T) ("rows"): its
//     num_attention_heads/T query heads, num_key_value_heads/T KV heads (contiguous heads, so the
//     GQA grouping is preserved), intermediate_size/T MLP columns;
//   - o_proj and down_proj weight: the matching input columns [t*in/T, (t+1)*in/T) ("columns");
//   - a MoE layer's stacked experts (mlp.experts.gate_proj/up_proj [E, I, hidden], down_proj
//     [E, hidden, I]) the same per expert: rows of dim 1, columns of dim 2, moe_intermediate_size/T
//     columns of every expert; Qwen2-MoE's shared expert as the dense MLP; the router and
//     shared_expert_gate whole (every rank routes every token alike);
//   - everything else (embeddings, norms, lm_head, Qwen3's q_norm/k_norm, which act on head_dim
//     within each head, and the o_proj bias, added after the all-reduce): the whole tensor
//     ("replicated").
// The attention and MLP outputs are then partial sums that step_model.hpp all-reduces.
//
// A TP rank's slices of one FSDP unit are laid out in ONE buffer, parameter after parameter, each
// slice row-major: so the buffer holds the unit's needed flat elements in increasing flat order.
// Each FSDP shard covers a flat range [s0, s1), so the elements a rank needs from one shard land in
// one contiguous range of its buffer: a shard owner packs them into a single message and the
// receiver receives it in place. No rank ever holds more than its slices (verl's vLLM handoff
// gathers the full model on every rank first).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "proto/data_proto.hpp"
#include "proto/status.hpp"
#include "runtime/collective/communicator.hpp"
#include "workers/fsdp/flat_param.hpp"
#include "workers/models/config.hpp"

namespace tessera::rollout {

/// How a parameter is split across TP ranks. See Note [Rollout TP slicing].
enum class TpSplit : uint8_t { replicated, rows, columns };

/// The split of the HF parameter `name` (decoder names: "model.layers.N.self_attn.q_proj.weight").
TpSplit tp_split_of(const std::string& name);

/// The model shape one TP rank computes with: heads, KV heads and intermediate size divided by
/// `tp`, head_dim and hidden size kept. Errors name the key that `tp` does not divide.
Result<models::ModelConfig> tp_rank_config(const models::ModelConfig& config, int64_t tp);

/// Rank `tp_rank`'s slice of a full parameter tensor (a view). For tests and single-process use.
at::Tensor tp_slice(const at::Tensor& full, TpSplit split, int64_t tp, int64_t tp_rank);

/// Where one parameter's slice lives in a TP rank's unit buffer.
struct TpParamSlice {
  std::string name;
  std::vector<int64_t> shape;  ///< The slice's shape.
  int64_t offset = 0;          ///< First element in the unit buffer.
};

/// A set of flat positions of the unit: rows[i] covers [begin + i*stride, begin + i*stride + len).
struct TpBlock {
  int64_t begin = 0, rows = 1, len = 0, stride = 0;
};

/// What one TP rank needs of one FSDP unit. See Note [Rollout TP slicing].
class TpUnitPlan {
 public:
  /// The plan of TP rank `tp_rank` of `tp` for `layout`. Errors: a split dimension `tp` does not divide.
  static Result<TpUnitPlan> create(const fsdp::FlatLayout& layout, int64_t tp, int64_t tp_rank);

  /// Elements of the rank's unit buffer.
  int64_t numel() const { return numel_; }
  const std::vector<TpParamSlice>& params() const { return params_; }
  /// How many needed elements lie at flat positions < x (so a shard [s0, s1) fills buffer range
  /// [count_before(s0), count_before(s1))).
  int64_t count_before(int64_t x) const;
  /// The needed elements of `shard` (flat range [s0, s0 + shard.numel())), in buffer order, as one
  /// new contiguous tensor (empty when none).
  at::Tensor pack(const at::Tensor& shard, int64_t s0) const;

 private:
  std::vector<TpBlock> blocks_;  // increasing flat positions
  std::vector<TpParamSlice> params_;
  int64_t numel_ = 0;
};

/// verl's all_gather_data_proto over the rollout TP group: every peer ends with the rows of all
/// peers, in TP rank order, and meta_info of its own input, on the device of its input_ids (the
/// rows cross as host frames). Sets `offsets` to each peer's first row
/// (size() + 1 entries, the last is the total), for re-chunking the output. Collective.
Result<proto::DataProto> all_gather_data_proto(collective::Communicator& tp_group, const proto::DataProto& data,
                                               std::vector<int64_t>& offsets);

}  // namespace tessera::rollout
