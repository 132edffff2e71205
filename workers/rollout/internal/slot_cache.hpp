// slot_cache.hpp (internal): a models::KVCache whose rows are slots that sequences come and go
// from, plus the visibility mask that says which cache columns each slot's sequence owns.
//
// Note [Slot cache layout]
// models::KVCache has one write cursor for all rows (kv_cache.hpp). A sequence admitted while
// others are decoding is prefilled in a cache of its own and its K/V are copied into its slot at
// columns [cursor - W, cursor) (W = the prefill width; the cursor is first advanced to >= W with
// columns nobody sees). Each decode step then opens column `cursor` for the live slots. So a
// slot's visible columns are its current sequence's prompt plus generated tokens, and everything
// else in that row (a previous occupant's columns, idle steps) is masked out. Masked columns get
// exactly zero attention weight and hold finite values, so stale K/V need no zeroing.
// Holes cost attention work, and the cursor only grows; repack() gathers each kept slot's visible
// columns, right-aligned, into a fresh cache of the kept slots only. It both shrinks the batch
// (dropping finished slots) and defragments (when the cursor reaches the capacity).
//
// Thread-safety: one thread.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "proto/status.hpp"
#include "workers/models/config.hpp"
#include "workers/models/kv_cache.hpp"

namespace tessera::rollout::internal {

/// A slot-addressed KV cache. See Note [Slot cache layout].
class SlotCache {
 public:
  /// A cache of `slots` rows and `capacity` columns in `dtype` on `device` (keys, values and the
  /// visibility mask), all columns hidden.
  static Result<SlotCache> create(const models::ModelConfig& config, c10::ScalarType dtype, int64_t slots,
                                  int64_t capacity, c10::Device device = c10::Device(c10::DeviceType::CPU));

  int64_t slots() const { return kv_.batch_size(); }
  int64_t length() const { return kv_.length(); }
  int64_t capacity() const { return kv_.capacity(); }
  models::KVCache& kv() { return kv_; }
  /// Visibility [slots, capacity] (bool); columns >= length() are always hidden.
  const at::Tensor& mask() const { return mask_; }
  /// Number of visible columns of `slot` (reads the mask on the host: tests and diagnostics only).
  int64_t visible(int64_t slot) const;

  /// Copies row sources[i] of `prefilled` (capacity W, fully written) into slot_ids[i], at columns
  /// [length() - W, length()), with that row of `prefill_mask` [rows, W] as its visibility; those
  /// slots' other columns are hidden. A row may go to several slots (shared prompt prefill).
  /// REQUIRES: W <= capacity(); slot ids distinct and in range; sources in [0, rows), one per slot.
  void insert(const models::KVCache& prefilled, const at::Tensor& prefill_mask, const std::vector<int64_t>& slot_ids,
              const std::vector<int64_t>& sources);
  /// Makes column length() visible for slots where `live` [slots] (bool) is true, ahead of a
  /// decode step that writes it. REQUIRES: length() < capacity().
  void open_column(const at::Tensor& live);
  /// Hides every column of `slot` (its sequence finished).
  void clear(int64_t slot);
  /// A new cache whose slot i holds old slot keep[i], with its visible columns packed to the
  /// right of [0, L), L = the largest visible count; same capacity.
  Result<SlotCache> repack(const std::vector<int64_t>& keep) const;

 private:
  SlotCache(models::ModelConfig config, models::KVCache kv, at::Tensor mask);

  models::ModelConfig config_;
  models::KVCache kv_;
  at::Tensor mask_;
};

}  // namespace tessera::rollout::internal
