// block_cache.hpp (internal): the block allocator over a PagedKV (Note [Paged KV cache] in
// paged_kv.hpp): which blocks each sequence slot holds, reference counts for prompt blocks
// shared between samples, and the per-step PagedBatch.
//
// Sequences are addressed by slot (0 .. slots-1), as the generation loop schedules them. The
// allocator's bookkeeping is on the host; the only device work is copying prefilled keys/values
// into blocks (admit) and uploading each step's three small index tensors (batch).
//
// Note [Prefix cache]
// Within a rollout session (the engine calls of one multi-turn or agent-loop rollout: each turn's
// prompt is the last turn's sequence and more) the cache also remembers finished sequences' full
// blocks, in a trie keyed by each block's tokens (a block's keys and values depend on it and the
// blocks before it, as vLLM's automatic prefix caching hashes them). A later prompt that starts
// with remembered blocks takes them (shared, reference-counted, never written again) and only the
// rest of it is prefilled. The trie holds one reference on each of its blocks; a block that only
// the trie holds is evictable when a new block is needed: least recently used leaves first, else
// the least recently used such block with its subtree (whose blocks that sequences still hold
// stay theirs).
//
// Thread-safety: one thread.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "proto/status.hpp"
#include "workers/models/config.hpp"
#include "workers/models/kv_cache.hpp"
#include "workers/rollout/paged_kv.hpp"

namespace tessera::rollout::internal {

/// Blocks handed to sequence slots. See the header comment.
class BlockCache {
 public:
  /// Pools for `slots` sequences of up to `max_length` tokens each: enough for every slot at that
  /// length at once, or `max_blocks` (> 0) when that is fewer, plus the scratch block 0. With a
  /// cap, the caller admits within free_blocks() and preempts when appends would run out
  /// (Note [Preemption] in generation_loop.cpp). An error names `cap_key` when the cap cannot
  /// hold even one sequence at max_length.
  static Result<BlockCache> create(const models::ModelConfig& config, c10::ScalarType dtype, int64_t slots,
                                   int64_t max_length, int64_t block_size, c10::Device device,
                                   int64_t max_blocks = 0, const std::string& cap_key = "");

  PagedKV& kv() { return kv_; }
  int64_t slots() const { return static_cast<int64_t>(tables_.size()); }
  int64_t block_size() const { return kv_.block_size; }
  /// Blocks that no sequence holds (block 0 excluded), the evictable remembered ones included.
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()) + evictable_; }
  /// Blocks a sequence of `tokens` tokens occupies.
  int64_t blocks_for(int64_t tokens) const { return (tokens + block_size() - 1) / block_size(); }
  /// New blocks that appending one token to each of `slots` takes (those whose last block is full).
  int64_t blocks_to_append(const std::vector<int64_t>& slots) const;
  /// Tokens stored for `slot`.
  int64_t length(int64_t slot) const { return lengths_.at(static_cast<size_t>(slot)); }
  /// The blocks of `slot`, in token order.
  const std::vector<int64_t>& blocks(int64_t slot) const { return tables_.at(static_cast<size_t>(slot)); }
  /// Holders of block `block` (0 when free).
  int64_t references(int64_t block) const { return refs_.at(static_cast<size_t>(block)); }

  /// Stores prefilled prompts: row sources[i] of `prefilled` (left-padded, width W = its
  /// capacity; that row's prompt is its last lengths[sources[i]] columns) becomes the contents of
  /// empty slot slot_ids[i]. Slots with the same source share its full blocks; each gets its own
  /// copy of the last partial block. prefixes[row] (optional) are remembered blocks holding that
  /// row's first tokens (take_prefix, one reference each, passed to the row's first slot): they
  /// start its table and only the tokens after them are copied. Returns the blocks that sharing saved.
  /// REQUIRES: slot_ids distinct and empty; lengths in [1, W]; sources in [0, rows).
  int64_t admit(const models::KVCache& prefilled, const std::vector<int64_t>& lengths,
                const std::vector<int64_t>& slot_ids, const std::vector<int64_t>& sources,
                const std::vector<std::vector<int64_t>>& prefixes = {});
  /// The step table (paged_kv.hpp's StepColumn layout) for `slots` (rows in that order) each
  /// appending one token: reserves the token's place (a new block when its last one is full) and
  /// fills block tables, context lengths and slots for `rows` >= slots.size() rows; rows past
  /// slots.size() are padding that read and write the scratch block. Token id and position
  /// columns are left 0 for the caller. `table_width` > 0 fixes M (a graph's static shape); 0
  /// sizes it to the longest row. Returns the host table and M.
  std::pair<at::Tensor, int64_t> append(const std::vector<int64_t>& slots, int64_t rows, int64_t table_width = 0);
  /// Frees the blocks `slot` holds (shared ones when their last holder goes).
  void release(int64_t slot);

  // ---- Note [Prefix cache] ----
  /// The remembered blocks that hold `tokens`' first whole blocks, at most `max_blocks` of them,
  /// each taken with a reference for the caller (admit's `prefixes` hands them to a slot; give
  /// back unused ones with unref()).
  std::vector<int64_t> take_prefix(const std::vector<int64_t>& tokens, int64_t max_blocks);
  /// Remembers the full blocks of `slot`, whose first tokens are `tokens` (blocks past the known
  /// tokens are not remembered). Call before release(slot).
  void remember(int64_t slot, const std::vector<int64_t>& tokens);
  /// Drops a reference taken by take_prefix.
  void unref(int64_t block);
  /// Writes the keys and values of prefixes[row]'s blocks into row `row` of `dst`, at the columns
  /// that row's first tokens take in a left-padded prefill of width W = dst.capacity():
  /// [W - lengths[row], W - lengths[row] + blocks x block_size).
  void gather(models::KVCache& dst, const std::vector<int64_t>& lengths,
              const std::vector<std::vector<int64_t>>& prefixes) const;
  /// Blocks the trie holds.
  int64_t remembered_blocks() const { return static_cast<int64_t>(nodes_.size()); }
  /// Makes the cache serve `slots` sequence slots. REQUIRES: no slot holds blocks.
  void reset_slots(int64_t slots);

 private:
  BlockCache(PagedKV kv, int64_t slots);
  int64_t allocate();
  void ref(int64_t block);
  void evict_one();
  void forget(int64_t block);

  PagedKV kv_;
  std::vector<std::vector<int64_t>> tables_;  ///< Per slot: its blocks.
  std::vector<int64_t> lengths_;              ///< Per slot: tokens stored.
  std::vector<int64_t> refs_;                 ///< Per block: holders.
  std::vector<int64_t> free_;                 ///< Free block ids (a stack).

  // The trie of remembered blocks (Note [Prefix cache]): a node per block, children by tokens.
  struct Node {
    int64_t parent = -1;  ///< -1: a first block.
    std::vector<int64_t> tokens;
    std::map<std::vector<int64_t>, int64_t> children;
    uint64_t used = 0;
  };
  std::map<int64_t, Node> nodes_;                     ///< By block id.
  std::map<std::vector<int64_t>, int64_t> roots_;     ///< First blocks by tokens.
  std::set<std::pair<uint64_t, int64_t>> leaves_;     ///< (last use, block) of childless nodes.
  int64_t evictable_ = 0;                             ///< Remembered blocks only the trie holds.
  uint64_t clock_ = 0;
};

}  // namespace tessera::rollout::internal
