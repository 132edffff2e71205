// packing.hpp: padding-free micro-batches (verl's use_remove_padding). A padded micro-batch [B, T]
// becomes one row of its real tokens (Note [Packed sequences] in workers/models/decoder.cpp), the
// head runs only on the real tokens inside a window of head rows (the PPO losses: the positions
// that predict response tokens; SFT: every position but the last), and its outputs go back to the
// [B, L] grid of that window. Positions the packed forward does not compute (padding) hold 0, as
// verl's pad_input leaves them; every loss masks them out.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "proto/status.hpp"
#include "workers/models/decoder.hpp"
#include "workers/models/model.hpp"
#include "workers/ppo/ppo_batching.hpp"
#include "workers/ppo/ppo_inputs.hpp"

namespace tessera::ppo {

class UlyssesGroup;

/// A micro-batch with its padding removed.
struct PackedBatch {
  at::Tensor input_ids;     ///< [1, N]: every row's real tokens (attention_mask != 0), row after row.
  at::Tensor position_ids;  ///< [1, N]: their position ids.
  std::shared_ptr<const models::PackedSegments> segments;  ///< One segment per row.
  at::Tensor head_index;      ///< [n] int64: packed tokens inside the head window.
  at::Tensor response_index;  ///< [n] int64: where each goes in the flattened [B, L] window grid.
  int64_t rows = 0;
  int64_t response_length = 0;  ///< L, the window's length.

  /// With Ulysses sequence parallelism (Note [Ulysses sequence parallelism]): the row is padded to
  /// N' = a multiple of the group size (the padding is one more segment), input_ids and
  /// position_ids are this rank's slice [1, N' / size] of it, and head_index holds the head
  /// positions inside that slice: entries [head_begin, head_begin + head_index.numel()) of the
  /// row's n head positions, which are `row_head_index` (positions in the whole row) and match
  /// response_index. Null without.
  std::shared_ptr<const UlyssesGroup> sequence_parallel;
  at::Tensor row_head_index;  ///< [n] int64, with sequence_parallel only.
  int64_t head_begin = 0;
};

/// Packs input_ids / attention_mask / position_ids [B, T] with the head window `head`
/// (REQUIRES: within [0, T)). The segment offsets are host data: they come from `host_mask` (the
/// same mask, already on the host) when given, else from one device-to-host read of the mask.
/// With `sequence_parallel`, this rank's slice of the packed row (PackedBatch).
Result<PackedBatch> pack_rows(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                              const at::Tensor& position_ids, models::HeadRows head,
                              const at::Tensor& host_mask = at::Tensor(),
                              std::shared_ptr<const UlyssesGroup> sequence_parallel = nullptr);

/// The positions whose head output predicts the response tokens: [T-R-1, T-1) of [B, T].
models::HeadRows response_rows(const SequenceBatch& seq);

/// pack_rows with the PPO window (response_rows).
Result<PackedBatch> pack_sequences(const SequenceBatch& seq, const at::Tensor& host_mask = at::Tensor(),
                                   std::shared_ptr<const UlyssesGroup> sequence_parallel = nullptr);

/// With `remove_padding`, each micro-batch's attention mask on the host, cut from ONE host copy
/// of `data`'s mask (micro.indices[i] for dynamic micro-batches, else consecutive rows), so the
/// host waits for the device once per call rather than once per micro-batch; else one undefined
/// tensor per micro-batch.
Result<std::vector<at::Tensor>> micro_batch_host_masks(const proto::DataProto& data, const MicroBatches& micro,
                                                       bool remove_padding);

/// `per_response` [B, L, ...] (the window grid) at the packed head positions: [n, ...] (with
/// sequence parallelism, this rank's head positions only).
at::Tensor select_responses(const at::Tensor& per_response, const PackedBatch& packed);

/// `values` [n, ...] (aligned with head_index) placed into a zero [B, L, ...] grid; differentiable.
/// With sequence parallelism the group's values are gathered first (collective over the group),
/// so every rank gets the whole grid.
at::Tensor unpack_responses(const at::Tensor& values, const PackedBatch& packed);

}  // namespace tessera::ppo
