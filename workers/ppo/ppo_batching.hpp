// ppo_batching.hpp: the batching machinery shared by DataParallelPPOActor and
// DataParallelPPOCritic (verl/utils/seqlen_balancing.py, verl/utils/py_functional.py and the
// batch-size normalisation of verl/workers/fsdp_workers.py, v0.5.0).
//
//  * Micro-batches: fixed (`DataProto.split(micro_batch_size)`) or dynamic: rows are partitioned
//    by effective token count (attention_mask row sums) into balanced groups under a token budget
//    (verl's rearrange_micro_batches over get_seqlen_balanced_partitions, Karmarkar-Karp), and
//    per-row outputs are put back into the original order with restore_dynamic_batch.
//  * Metrics: verl's append_to_dict (name -> list of per-micro/mini-batch values; the caller
//    reduces, normally by mean).
//  * Batch-size normalisation (reference/verl-fsdp.md §3.4): global prompt counts become per-dp-
//    rank sample counts, as pure functions whose errors name the keys and values.
//
// Everything here is a pure function of its arguments (thread-safe, no shared state); tensors are
// only sliced or gathered, never written.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "proto/data_proto.hpp"
#include "proto/status.hpp"

namespace tessera::ppo {

// ---- Metrics ------------------------------------------------------------------------------------

/// verl's metrics dict as returned by update_policy / update_critic: name -> list of values.
using Metrics = std::map<std::string, std::vector<double>>;

/// verl's append_to_dict: appends each value of `values` to the list under its name.
void append_to_dict(Metrics& metrics, const std::map<std::string, double>& values);

/// The metrics as a JSON object {name: [values...]} (the form verl puts in meta_info["metrics"]).
/// Non-finite values become null (JSON has no NaN).
nlohmann::json metrics_to_json(const Metrics& metrics);

// ---- Sequence-length balancing ------------------------------------------------------------------

/// verl's get_seqlen_balanced_partitions: splits indices [0, n) into k partitions whose sums of
/// `seqlens` are balanced, by Karmarkar-Karp (largest differencing). With `equal_size` every
/// partition has n / k indices. Each partition is sorted ascending. Ties are broken exactly as
/// verl's heapq-based implementation does, so the partitions are the same as verl's.
/// Errors: k < 1, n < k, equal_size with n % k != 0, a negative length.
Result<std::vector<std::vector<int64_t>>> get_seqlen_balanced_partitions(
    const std::vector<int64_t>& seqlens, int64_t k_partitions, bool equal_size);

/// verl's get_reverse_idx: the inverse permutation of `idx_map` (out[idx_map[i]] = i).
/// REQUIRES: idx_map is a permutation of [0, n).
std::vector<int64_t> get_reverse_idx(const std::vector<int64_t>& idx_map);

// ---- Micro-batching -----------------------------------------------------------------------------

/// Micro-batches of a DataProto and, for dynamic batching, which original rows each one holds.
struct MicroBatches {
  std::vector<proto::DataProto> batches;
  /// Dynamic only: batches[i] holds rows indices[i] of the input, in that order. Empty for fixed
  /// micro-batches (which hold consecutive rows in order).
  std::vector<std::vector<int64_t>> indices;
};

/// Agrees on a micro-batch count across data-parallel ranks (verl all-reduces MAX over the dp
/// group so every rank runs the same number of forward/backward passes). Receives the local
/// count and returns the agreed one. An empty function means a single rank.
using MicroBatchCountSync = std::function<Result<int64_t>(int64_t local_count)>;

/// Fixed micro-batches: data.split(micro_batch_size) (views; the last may be shorter).
/// Errors: micro_batch_size < 1 (naming `key`, the config key it came from).
Result<MicroBatches> split_micro_batches(const proto::DataProto& data, int64_t micro_batch_size,
                                         const std::string& key);

/// Dynamic micro-batches (verl's rearrange_micro_batches): effective lengths are the row sums of
/// `attention_mask`; rows are partitioned by get_seqlen_balanced_partitions(equal_size=false) into
/// ceil(total / max_token_len) groups. Unlike verl, when a balanced group still exceeds
/// max_token_len the count is raised until none does (verl lets a micro-batch overshoot the
/// budget). With `sync` the count is then agreed across dp (the largest wins) and the rows are
/// re-partitioned into that many groups. Micro-batches are ordered by decreasing sum of squared
/// lengths (attention cost); ties put the group with the larger smallest row index first (verl
/// sorts (workload, min index) in reverse). Rows are gathered (copied).
/// Errors: missing or non-2-D attention_mask, max_token_len < the padded width (verl's assert,
/// naming `key` and both values), an empty batch, a failing `sync`, an agreed count below the local
/// one or above the row count.
Result<MicroBatches> rearrange_micro_batches(const proto::DataProto& data, int64_t max_token_len,
                                             const std::string& key,
                                             const MicroBatchCountSync& sync = {});

/// verl's restore_dynamic_batch: `stacked` is the concatenation (dim 0) of per-micro-batch outputs
/// in micro-batch order; returns the rows in the original order.
/// Errors: stacked.size(0) != the number of indices, indices not a permutation.
Result<at::Tensor> restore_dynamic_batch(const at::Tensor& stacked,
                                         const std::vector<std::vector<int64_t>>& indices);

// ---- Batch-size normalisation (verl-fsdp.md §3.4) -----------------------------------------------

/// How a worker's world is laid out for batch-size normalisation.
struct DataParallelShape {
  int64_t world_size = 1;                      ///< Ranks in the worker group.
  int64_t ulysses_sequence_parallel_size = 1;  ///< Ranks sharing one sample (SP); dp = world / sp.
};

/// dp size = world_size / ulysses_sequence_parallel_size. Errors: non-positive sizes, world_size
/// not divisible by the SP size.
Result<int64_t> data_parallel_size(const DataParallelShape& shape);

/// verl's `mini *= rollout_n; mini //= dp`: the per-rank sample count of a mini-batch given in
/// prompts. Unlike verl (which floors), mini * rollout_n must be divisible by dp; the error names
/// `key` and the values. Errors also for mini < 1, rollout_n < 1, a zero result.
Result<int64_t> normalize_mini_batch_size(int64_t mini_batch_size, int64_t rollout_n, int64_t dp_size,
                                          const std::string& key);

/// The deprecated global micro-batch size (e.g. `ppo_micro_batch_size`) divided over dp into its
/// *_per_gpu form. Errors (naming `key`): < 1, not divisible by dp.
Result<int64_t> normalize_global_micro_batch_size(int64_t micro_batch_size, int64_t dp_size,
                                                  const std::string& key);

/// verl's assert that a per-GPU micro-batch divides the normalised mini-batch. Errors name both
/// keys and values.
Status check_micro_divides_mini(int64_t mini_batch_size, const std::string& mini_key,
                                int64_t micro_batch_size_per_gpu, const std::string& micro_key);

/// A deprecated global micro-batch size, when set, becomes its *_per_gpu form (global / dp,
/// replacing `per_gpu`) and is cleared. Errors as normalize_global_micro_batch_size, naming `key`.
Status fold_global_micro_batch_size(std::optional<int64_t>& global, std::optional<int64_t>& per_gpu, int64_t dp_size,
                                    const std::string& key);

/// The last check of verl's actor / critic normalisation for `role` ("actor", "critic"): a set
/// <role>.ppo_micro_batch_size_per_gpu must divide the normalised <role>.ppo_mini_batch_size; an
/// unset one needs <role>.use_dynamic_bsz. Errors name the keys and values.
Status check_normalized_micro_batch(const std::string& role, int64_t ppo_mini_batch_size,
                                    const std::optional<int64_t>& ppo_micro_batch_size_per_gpu, bool use_dynamic_bsz);

/// What DataParallelPPOActor / DataParallelPPOCritic require of a normalised `role` config:
/// without use_dynamic_bsz, <role>.ppo_micro_batch_size_per_gpu is set and divides
/// <role>.ppo_mini_batch_size. Errors name the keys and values.
Status check_fixed_micro_batch(const std::string& role, int64_t ppo_mini_batch_size,
                               const std::optional<int64_t>& ppo_micro_batch_size_per_gpu, bool use_dynamic_bsz);

}  // namespace tessera::ppo
