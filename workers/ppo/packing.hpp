// packing.hpp: padding-free micro-batches (verl's use_remove_padding). A left-padded micro-batch
// [B, T] becomes one row of its real tokens (Note [Packed sequences] in workers/models/decoder.cpp),
// the head runs only on the tokens that predict a response token, and its outputs go back to the
// [B, R] response grid. Positions the packed forward does not compute (padding after EOS) hold 0,
// as verl's pad_input leaves them; every loss masks them out.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>

#include "proto/status.hpp"
#include "workers/models/decoder.hpp"
#include "workers/ppo/ppo_inputs.hpp"

namespace tessera::ppo {

/// A micro-batch with its padding removed.
struct PackedBatch {
  at::Tensor input_ids;     ///< [1, N]: every row's real tokens (attention_mask != 0), row after row.
  at::Tensor position_ids;  ///< [1, N]: their position ids.
  std::shared_ptr<const models::PackedSegments> segments;  ///< One segment per row.
  at::Tensor head_index;      ///< [n] int64: packed tokens at response_rows positions.
  at::Tensor response_index;  ///< [n] int64: where each goes in the flattened [B, R] grid.
  int64_t rows = 0;
  int64_t response_length = 0;
};

/// Packs `seq`. Reads the attention mask on the host once (the segment offsets are host data).
Result<PackedBatch> pack_sequences(const SequenceBatch& seq);

/// `per_response` [B, R, ...] at the packed head positions: [n, ...].
at::Tensor select_responses(const at::Tensor& per_response, const PackedBatch& packed);

/// `values` [n, ...] (aligned with head_index) placed into a zero [B, R, ...] grid; differentiable.
at::Tensor unpack_responses(const at::Tensor& values, const PackedBatch& packed);

}  // namespace tessera::ppo
