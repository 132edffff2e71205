// paged_kv.hpp: the rollout engine's key/value cache in fixed-size blocks, and the per-step
// tensors that say which blocks each sequence of a decode batch reads and where its new token's
// keys and values go.
//
// Note [Paged KV cache]
// Every layer has one pool of blocks per K and V, [num_blocks, block_size, kv_heads, head_dim]
// in the model's dtype on its device. A sequence's token j lives in row j % block_size of block
// table[j / block_size]: a sequence is its block table plus its length, so sequences come and go
// without moving anyone else's keys, finished sequences cost no attention work, and no column
// cursor has to be compacted. Blocks are reference-counted: the n samples of one prompt share
// its full prompt blocks, and each has a private copy of the prompt's last, partial block, which
// its first generated token writes into (copy-on-write at the first divergent block; with a
// prompt that fills whole blocks nothing is copied). Full blocks are never written again, so a
// shared block never needs copying later. Block 0 is never handed out: it is the scratch block
// that the padding rows of a fixed-size (graph-captured) batch write to and read from.
//
// A decode step gives, per batch row, its block table (padded with block 0), its context length
// (the new token included) and the flat slot (block * block_size + row) that its new token's
// keys/values are written to. Rows attend to positions [max(0, length - window), length).
//
// Thread-safety: plain values; the engine thread owns them.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "proto/status.hpp"
#include "workers/models/config.hpp"

namespace tessera::rollout {

/// The block pools of every layer. See Note [Paged KV cache].
struct PagedKV {
  std::vector<at::Tensor> keys;    ///< Per layer [num_blocks, block_size, kv_heads, head_dim].
  std::vector<at::Tensor> values;  ///< Same shape as keys.
  int64_t block_size = 16;
  /// Decode attention reads the pools with the paged kernel where there is one (fp32 on the CPU;
  /// CUDA); false: the step model gathers each row's blocks and runs the models' attention
  /// (engine_kwargs.tessera.decode_attention=gather).
  bool use_kernel = true;
  /// On a CUDA device, the tiled kernel rather than the heads kernel
  /// (engine_kwargs.tessera.decode_attention=tiled, or =kernel where the tiled kernel runs and a
  /// KV group has more than 4 query heads;
  /// cuda/paged_attention.hpp).
  bool tiled = false;
  /// On a CUDA device, few rows with long contexts are cut into parts (Note [Split decode
  /// attention]; engine_kwargs.tessera.split_decode_attention).
  bool split = true;

  /// Zeroed pools of `num_blocks` blocks for every layer of `config`. An allocation failure (a
  /// CUDA OOM) is an error naming the bytes asked for.
  static Result<PagedKV> create(const models::ModelConfig& config, c10::ScalarType dtype, int64_t num_blocks,
                                int64_t block_size, c10::Device device);
  int64_t num_blocks() const { return keys.empty() ? 0 : keys.front().size(0); }
  /// Bytes of all pools.
  int64_t bytes() const;
};

/// One decode step's view of the cache, for rows 0..B-1 (tensors on the model's device).
struct PagedBatch {
  at::Tensor block_tables;  ///< [B, M] int64: block ids; entries past a row's length are 0.
  at::Tensor context_lens;  ///< [B] int64: tokens each row attends to, its new token included.
  at::Tensor slot_mapping;  ///< [B] int64: block * block_size + row of each new token.
};

/// A decode step's inputs travel as one int64 table [B, M + kStepColumns], built on the host and
/// copied to the device in one transfer (or into a CUDA graph's input buffer): the block table
/// (M columns), then these columns.
enum StepColumn : int64_t { kContextLen = 0, kSlot = 1, kTokenId = 2, kPosition = 3, kStepColumns = 4 };

/// The inputs of StepModel::decode_step, as views of a step table.
struct StepInputs {
  at::Tensor input_ids;     ///< [B, 1]
  at::Tensor position_ids;  ///< [B, 1]
  PagedBatch batch;
};

/// Views of `table` [B, width + kStepColumns] (see StepColumn).
StepInputs step_inputs(const at::Tensor& table, int64_t width);

}  // namespace tessera::rollout
