// kv_cache.hpp: the preallocated key/value cache used for incremental decoding.
//
// Layout: per layer, K and V tensors [B, kv_heads, capacity, head_dim] allocated once (zeros) in
// the model's compute dtype. All rows share one write cursor, length(): a forward_step with T new
// tokens writes every row's keys/values into columns [length, length + T) and then advances the
// cursor by T. Which columns a row actually attends to is decided by the caller's cache mask
// ([B, >= length + T], 1 = visible), never by the cursor, and RoPE uses the caller's position_ids,
// never the column index. So columns are just slots: a row may have holes.
//
// Contract for a rollout engine (left-padded batches, as verl's generate does):
//   prefill  forward_step(prompt_ids [B,P], prompt_positions, cache, prompt_mask [B,P])
//   decode   forward_step(next [B,1], pos [B,1], cache, mask [B,P+k]) where mask = cat(prev, 1/0)
// Continuous batching (slot reuse): when row r finishes, call reset_row(r) (zeroes its K/V), then
// feed the new sequence for row r in later steps at the current cursor, with mask 0 for all of
// row r's older columns and position_ids restarting at 0. Rows that feed fewer than T tokens in a
// step left-pad that chunk with mask 0. Because attention depends only on visible columns and on
// position differences, the result equals a fresh cache for that row. When the cursor nears
// capacity, the engine must start a new cache (or call reset() once every row is done).
//
// Thread-safety: a cache is owned by one engine thread; it is not synchronised.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "proto/status.hpp"
#include "workers/models/config.hpp"

namespace tessera::models {

/// Sizes and placement of a KV cache.
struct KVCacheOptions {
  int64_t batch_size = 1;
  int64_t capacity = 0;  ///< Maximum number of columns (prompt + generated tokens).
  c10::ScalarType dtype = c10::ScalarType::Float;  ///< Must equal the model's parameter dtype.
  c10::Device device = c10::Device(c10::DeviceType::CPU);
};

/// Per-layer K/V tensors plus the shared write cursor.
class KVCache {
 public:
  /// Allocates zeroed K/V for every layer of `config`.
  static Result<KVCache> create(const ModelConfig& config, const KVCacheOptions& options);

  int64_t num_layers() const { return static_cast<int64_t>(keys_.size()); }
  int64_t batch_size() const { return options_.batch_size; }
  int64_t capacity() const { return options_.capacity; }
  c10::ScalarType dtype() const { return options_.dtype; }
  /// Columns written so far (the next step writes at this column).
  int64_t length() const { return length_; }

  /// Layer `layer`'s keys / values [B, kv_heads, capacity, head_dim]. REQUIRES: 0 <= layer < num_layers().
  const at::Tensor& key(int64_t layer) const { return keys_.at(layer); }
  const at::Tensor& value(int64_t layer) const { return values_.at(layer); }

  /// Forgets every column (the cursor goes back to 0); the memory is kept.
  void reset() { length_ = 0; }
  /// Zeroes row `row`'s keys and values in every layer, for slot reuse (see the header comment).
  Status reset_row(int64_t row);
  /// Moves the cursor forward after all layers wrote `n` columns. Called by the decoder.
  /// REQUIRES: length() + n <= capacity().
  void advance(int64_t n) { length_ += n; }

 private:
  KVCacheOptions options_;
  std::vector<at::Tensor> keys_;
  std::vector<at::Tensor> values_;
  int64_t length_ = 0;
};

}  // namespace tessera::models
