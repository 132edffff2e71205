// block_cache.cpp: see block_cache.hpp and Note [Paged KV cache] in paged_kv.hpp.
#include "workers/rollout/internal/block_cache.hpp"

#include <algorithm>
#include <map>

#include <torch/torch.h>

#include "proto/host_transfer.hpp"

namespace tessera::rollout::internal {

BlockCache::BlockCache(PagedKV kv, int64_t slots)
    : kv_(std::move(kv)), tables_(static_cast<size_t>(slots)), lengths_(static_cast<size_t>(slots), 0),
      refs_(static_cast<size_t>(kv_.num_blocks()), 0) {
  refs_[0] = 1;  // the scratch block is never handed out
  for (int64_t b = kv_.num_blocks() - 1; b >= 1; --b) free_.push_back(b);
}

Result<BlockCache> BlockCache::create(const models::ModelConfig& config, c10::ScalarType dtype, int64_t slots,
                                      int64_t max_length, int64_t block_size, c10::Device device, int64_t max_blocks,
                                      const std::string& cap_key) {
  const int64_t per_sequence = (max_length + block_size - 1) / block_size;
  int64_t blocks = slots * per_sequence;
  if (max_blocks > 0 && max_blocks < blocks) {
    if (max_blocks < per_sequence) {
      return make_error(ErrorCode::resource_exhausted,
                        "{}: the KV cache gets {} blocks of {} tokens, but one sequence of {} tokens (prompt + "
                        "response) needs {}",
                        cap_key, max_blocks, block_size, max_length, per_sequence);
    }
    blocks = max_blocks;
  }
  TESSERA_ASSIGN_OR_RETURN(PagedKV kv, PagedKV::create(config, dtype, blocks + 1, block_size, device));
  return BlockCache(std::move(kv), slots);
}

int64_t BlockCache::blocks_to_append(const std::vector<int64_t>& slots) const {
  int64_t n = 0;
  for (int64_t slot : slots) {
    const auto s = static_cast<size_t>(slot);
    n += lengths_[s] == static_cast<int64_t>(tables_[s].size()) * block_size() ? 1 : 0;
  }
  return n;
}

int64_t BlockCache::allocate() {
  // Callers admit within free_blocks() and preempt before appends would run dry.
  if (free_.empty() && evictable_ > 0) evict_one();
  TORCH_CHECK(!free_.empty(), "BlockCache: out of blocks (", kv_.num_blocks(), ")");
  const int64_t b = free_.back();
  free_.pop_back();
  refs_[static_cast<size_t>(b)] = 1;
  return b;
}

void BlockCache::ref(int64_t block) {
  int64_t& r = refs_[static_cast<size_t>(block)];
  if (r == 1 && nodes_.count(block) != 0) --evictable_;
  ++r;
}

void BlockCache::unref(int64_t block) {
  int64_t& r = refs_[static_cast<size_t>(block)];
  --r;
  if (r == 0) {
    free_.push_back(block);
  } else if (r == 1 && nodes_.count(block) != 0) {
    ++evictable_;
  }
}

// Takes node `block` and everything under it out of the trie: blocks that only the trie held go
// back to the free list, the others stay with the sequences that hold them.
void BlockCache::forget(int64_t block) {
  Node& node = nodes_.at(block);
  if (node.parent < 0) {
    roots_.erase(node.tokens);
  } else {
    Node& parent = nodes_.at(node.parent);
    parent.children.erase(node.tokens);
    if (parent.children.empty()) leaves_.emplace(parent.used, node.parent);
  }
  std::vector<int64_t> stack = {block};
  while (!stack.empty()) {
    const int64_t b = stack.back();
    stack.pop_back();
    Node& n = nodes_.at(b);
    for (const auto& [tokens, child] : n.children) stack.push_back(child);
    if (n.children.empty()) leaves_.erase({n.used, b});
    nodes_.erase(b);
    int64_t& r = refs_[static_cast<size_t>(b)];
    if (r == 1) {  // only the trie held it
      --evictable_;
      r = 0;
      free_.push_back(b);
    } else {
      --r;  // the trie's reference; its sequences keep theirs
    }
  }
}

// Frees the least recently used remembered block that only the trie holds: a leaf when there is
// one. A block with no sequence may still have children that sequences hold (remember() hangs a
// sequence's blocks under an equal block of another's): then that block and its subtree leave
// the trie, so every block counted in evictable_ can be freed.
void BlockCache::evict_one() {
  for (const auto& [used, b] : leaves_) {
    if (refs_[static_cast<size_t>(b)] == 1) {
      forget(b);
      return;
    }
  }
  int64_t oldest = -1;
  for (const auto& [b, node] : nodes_) {
    if (refs_[static_cast<size_t>(b)] == 1 && (oldest < 0 || node.used < nodes_.at(oldest).used)) oldest = b;
  }
  TORCH_CHECK(oldest >= 0, "BlockCache: ", evictable_, " evictable blocks but none only the trie holds");
  forget(oldest);
}

std::vector<int64_t> BlockCache::take_prefix(const std::vector<int64_t>& tokens, int64_t max_blocks) {
  const int64_t bs = block_size();
  std::vector<int64_t> blocks;
  const std::map<std::vector<int64_t>, int64_t>* siblings = &roots_;
  for (int64_t b = 0; b < max_blocks && (b + 1) * bs <= static_cast<int64_t>(tokens.size()); ++b) {
    const std::vector<int64_t> key(tokens.begin() + b * bs, tokens.begin() + (b + 1) * bs);
    auto it = siblings->find(key);
    if (it == siblings->end()) break;
    const int64_t block = it->second;
    Node& node = nodes_.at(block);
    if (node.children.empty()) {  // a leaf: its place in the eviction order moves up
      leaves_.erase({node.used, block});
      leaves_.emplace(++clock_, block);
    }
    node.used = clock_;
    ref(block);
    blocks.push_back(block);
    siblings = &node.children;
  }
  return blocks;
}

void BlockCache::remember(int64_t slot, const std::vector<int64_t>& tokens) {
  const int64_t bs = block_size();
  const auto& table = tables_.at(static_cast<size_t>(slot));
  const int64_t full = std::min<int64_t>(lengths_.at(static_cast<size_t>(slot)), static_cast<int64_t>(tokens.size())) / bs;
  int64_t parent = -1;
  for (int64_t b = 0; b < full; ++b) {
    std::vector<int64_t> key(tokens.begin() + b * bs, tokens.begin() + (b + 1) * bs);
    auto& siblings = parent < 0 ? roots_ : nodes_.at(parent).children;
    if (auto it = siblings.find(key); it != siblings.end()) {  // remembered already (this block or an equal one)
      parent = it->second;
      continue;
    }
    const int64_t block = table[static_cast<size_t>(b)];
    if (nodes_.count(block) != 0) break;  // remembered under other tokens: cannot be (kept defensive)
    if (parent >= 0 && siblings.empty()) leaves_.erase({nodes_.at(parent).used, parent});
    siblings.emplace(key, block);
    Node node;
    node.parent = parent;
    node.tokens = std::move(key);
    node.used = ++clock_;
    nodes_.emplace(block, std::move(node));
    leaves_.emplace(clock_, block);
    refs_[static_cast<size_t>(block)] += 1;  // the trie's reference; the slot's keeps it unevictable until released
    parent = block;
  }
}

void BlockCache::gather(models::KVCache& dst, const std::vector<int64_t>& lengths,
                        const std::vector<std::vector<int64_t>>& prefixes) const {
  const int64_t W = dst.capacity(), bs = block_size();
  std::vector<int64_t> rows, cols, src;
  for (size_t r = 0; r < prefixes.size(); ++r) {
    const int64_t first = W - lengths[r];
    for (size_t b = 0; b < prefixes[r].size(); ++b) {
      for (int64_t j = 0; j < bs; ++j) {
        rows.push_back(static_cast<int64_t>(r));
        cols.push_back(first + static_cast<int64_t>(b) * bs + j);
        src.push_back(prefixes[r][b] * bs + j);
      }
    }
  }
  if (src.empty()) return;
  const c10::Device device = kv_.keys.front().device();
  const at::Tensor row_index = proto::upload(rows, device), col_index = proto::upload(cols, device);
  const at::Tensor slots = proto::upload(src, device);
  at::NoGradGuard no_grad;
  for (size_t l = 0; l < kv_.keys.size(); ++l) {
    // The inverse of admit's copy: pool slots [N, kv_heads, D] into (row, column) pairs of [rows, W, kv_heads, D].
    const int64_t KV = kv_.keys[l].size(2), D = kv_.keys[l].size(3);
    const auto li = static_cast<int64_t>(l);
    dst.key(li).permute({0, 2, 1, 3}).index_put_({row_index, col_index}, kv_.keys[l].view({-1, KV, D}).index_select(0, slots));
    dst.value(li).permute({0, 2, 1, 3}).index_put_({row_index, col_index},
                                                   kv_.values[l].view({-1, KV, D}).index_select(0, slots));
  }
}

void BlockCache::reset_slots(int64_t slots) {
  for (const auto& table : tables_) TORCH_CHECK(table.empty(), "BlockCache::reset_slots: a slot holds blocks");
  tables_.assign(static_cast<size_t>(slots), {});
  lengths_.assign(static_cast<size_t>(slots), 0);
}

int64_t BlockCache::admit(const models::KVCache& prefilled, const std::vector<int64_t>& lengths,
                          const std::vector<int64_t>& slot_ids, const std::vector<int64_t>& sources,
                          const std::vector<std::vector<int64_t>>& prefixes) {
  const int64_t W = prefilled.capacity(), bs = block_size();
  std::vector<int64_t> src_rows, src_cols, dst;  // prefill (row, column) -> flat pool slot
  auto copy_tokens = [&](int64_t row, int64_t from, int64_t to, const std::vector<int64_t>& table) {
    const int64_t len = lengths[static_cast<size_t>(row)];
    for (int64_t j = from; j < to; ++j) {
      src_rows.push_back(row);
      src_cols.push_back(W - len + j);
      dst.push_back(table[static_cast<size_t>(j / bs)] * bs + j % bs);
    }
  };
  std::map<int64_t, int64_t> owner;  // source row -> the slot that holds its blocks
  int64_t saved = 0;
  for (size_t i = 0; i < slot_ids.size(); ++i) {
    const int64_t slot = slot_ids[i], row = sources[i], len = lengths[static_cast<size_t>(row)];
    std::vector<int64_t>& table = tables_[static_cast<size_t>(slot)];
    TORCH_CHECK(table.empty() && len >= 1 && len <= W, "BlockCache::admit: slot ", slot, " busy or bad length ", len);
    const int64_t full = len / bs;
    auto it = owner.find(row);
    if (it == owner.end()) {
      owner.emplace(row, slot);
      // Remembered blocks first (Note [Prefix cache]: taken with a reference for this slot).
      if (static_cast<size_t>(row) < prefixes.size()) table = prefixes[static_cast<size_t>(row)];
      const auto cached = static_cast<int64_t>(table.size());
      for (int64_t b = cached; b < (len + bs - 1) / bs; ++b) table.push_back(allocate());
      copy_tokens(row, cached * bs, len, table);
    } else {
      // Another sample of the same prompt: share the full blocks, copy the partial one.
      for (int64_t b = 0; b < full; ++b) {
        const int64_t block = tables_[static_cast<size_t>(it->second)][static_cast<size_t>(b)];
        table.push_back(block);
        ref(block);
      }
      saved += full;
      if (len % bs != 0) {
        table.push_back(allocate());
        copy_tokens(row, full * bs, len, table);
      }
    }
    lengths_[static_cast<size_t>(slot)] = len;
  }
  if (dst.empty()) return saved;
  const c10::Device device = kv_.keys.front().device();
  const at::Tensor rows = proto::upload(src_rows, device), cols = proto::upload(src_cols, device);
  const at::Tensor slots = proto::upload(dst, device);
  at::NoGradGuard no_grad;
  for (size_t l = 0; l < kv_.keys.size(); ++l) {
    // [rows, kv_heads, W, D] viewed as [rows, W, kv_heads, D]: (row, column) pairs pick [N, kv_heads, D].
    const int64_t KV = kv_.keys[l].size(2), D = kv_.keys[l].size(3);
    const auto li = static_cast<int64_t>(l);
    kv_.keys[l].view({-1, KV, D}).index_copy_(0, slots, prefilled.key(li).permute({0, 2, 1, 3}).index({rows, cols}));
    kv_.values[l].view({-1, KV, D}).index_copy_(0, slots, prefilled.value(li).permute({0, 2, 1, 3}).index({rows, cols}));
  }
  return saved;
}

std::pair<at::Tensor, int64_t> BlockCache::append(const std::vector<int64_t>& slots, int64_t rows,
                                                  int64_t table_width) {
  const int64_t bs = block_size();
  int64_t width = std::max<int64_t>(table_width, 1), longest = 1;
  for (int64_t slot : slots) {
    auto& table = tables_[static_cast<size_t>(slot)];
    int64_t& len = lengths_[static_cast<size_t>(slot)];
    if (len == static_cast<int64_t>(table.size()) * bs) table.push_back(allocate());
    // Only a sequence's own last block is written: shared prompt blocks are full (Note [Paged KV cache]).
    TORCH_CHECK(refs_[static_cast<size_t>(table[static_cast<size_t>(len / bs)])] == 1,
                "BlockCache: slot ", slot, " would write a shared block");
    len += 1;
    longest = std::max(longest, len);
    if (table_width == 0) width = std::max(width, static_cast<int64_t>(table.size()));
  }
  TORCH_CHECK(width * bs >= longest, "BlockCache::append: table width ", width, " < ", longest, " tokens");
  // Pinned on a GPU: the upload then leaves the host free (Note [Host transfers]).
  const c10::Device device = kv_.keys.front().device();
  at::Tensor host = proto::staging_tensor({rows, width + kStepColumns}, at::kLong, device).zero_();
  auto h = host.accessor<int64_t, 2>();
  for (int64_t r = 0; r < rows; ++r) {
    if (r >= static_cast<int64_t>(slots.size())) {  // padding: one token in the scratch block
      h[r][width + kContextLen] = 1;
      continue;
    }
    const auto s = static_cast<size_t>(slots[static_cast<size_t>(r)]);
    const auto& table = tables_[s];
    for (size_t b = 0; b < table.size(); ++b) h[r][static_cast<int64_t>(b)] = table[b];
    const int64_t last = lengths_[s] - 1;
    h[r][width + kContextLen] = lengths_[s];
    h[r][width + kSlot] = table[static_cast<size_t>(last / bs)] * bs + last % bs;
  }
  return {host, width};
}

void BlockCache::release(int64_t slot) {
  auto& table = tables_[static_cast<size_t>(slot)];
  for (int64_t b : table) unref(b);
  table.clear();
  lengths_[static_cast<size_t>(slot)] = 0;
}

}  // namespace tessera::rollout::internal
