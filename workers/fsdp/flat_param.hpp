// flat_param.hpp: the bookkeeping of FlatParameters, as plain values (no tensors, no comms).
//
// Note [Flat layout]
// A unit's parameters, in the order given, are laid end to end in one flat 1-D buffer: parameter
// i occupies [offset_i, offset_i + numel_i). The buffer is padded with zeros to `padded_numel`,
// the next multiple of the shard count K, so shard k is exactly [k*S, (k+1)*S) with
// S = padded_numel / K. Padding elements have zero value and zero gradient forever, so they never
// change a norm, an AdamW update or a loss. A checkpoint records the unpadded layout (names,
// shapes, offsets) plus K; loading with another K' re-cuts [k'*S', (k'+1)*S') from the old
// shards, because only the unpadded prefix [0, numel) carries data.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "proto/status.hpp"

namespace tessera::fsdp {

/// One original parameter inside a flat buffer.
struct FlatParamEntry {
  std::string name;            ///< The module's parameter name (HF name for the decoder).
  std::vector<int64_t> shape;  ///< Its shape.
  int64_t offset = 0;          ///< First element in the flat buffer.
  int64_t numel = 0;           ///< Product of `shape`.
};

/// The flat layout of one unit for a given shard count. Immutable value.
struct FlatLayout {
  std::string unit;                    ///< Unit name ("model.layers.0", "root", ...).
  std::vector<FlatParamEntry> params;  ///< In flat order.
  int64_t numel = 0;                   ///< Sum of the parameters' numels.
  int64_t padded_numel = 0;            ///< numel rounded up to a multiple of shard_count.
  int shard_count = 1;                 ///< K: number of shards the buffer is cut into.

  /// Elements per shard (padded_numel / shard_count).
  int64_t shard_numel() const { return padded_numel / shard_count; }
  /// [begin, end) of shard k in flat coordinates. REQUIRES: 0 <= k < shard_count.
  std::pair<int64_t, int64_t> shard_range(int k) const {
    return {k * shard_numel(), (k + 1) * shard_numel()};
  }
  /// The same parameters re-laid for another shard count.
  FlatLayout with_shard_count(int shards) const;
};

/// Lays out `params` ((name, shape) pairs, in order) for `shard_count` shards.
/// Errors: empty unit, duplicate names, negative dimensions, shard_count < 1.
Result<FlatLayout> make_flat_layout(const std::string& unit,
                                    const std::vector<std::pair<std::string, std::vector<int64_t>>>& params,
                                    int shard_count);

/// JSON form used by the checkpoint manifest.
nlohmann::json flat_layout_to_json(const FlatLayout& layout);

/// Parses and validates a layout from a manifest (offsets contiguous, sums consistent);
/// `source` names the file in errors.
Result<FlatLayout> flat_layout_from_json(const nlohmann::json& json, const std::string& source);

/// Pieces of old shards covering [begin, end) of the flat buffer, clipped to the unpadded data.
struct ShardPiece {
  int shard = 0;            ///< Old shard index.
  int64_t shard_offset = 0; ///< Start inside that shard.
  int64_t dest_offset = 0;  ///< Start inside the destination range.
  int64_t length = 0;       ///< Elements.
};

/// Which parts of `old_layout`'s shards fill [begin, end). Elements at or past old_layout.numel
/// are padding and are not listed (the destination keeps zeros there).
std::vector<ShardPiece> pieces_for_range(const FlatLayout& old_layout, int64_t begin, int64_t end);

}  // namespace tessera::fsdp
