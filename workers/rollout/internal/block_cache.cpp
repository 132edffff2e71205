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
  TORCH_CHECK(!free_.empty(), "BlockCache: out of blocks (", kv_.num_blocks(), ")");
  const int64_t b = free_.back();
  free_.pop_back();
  refs_[static_cast<size_t>(b)] = 1;
  return b;
}

int64_t BlockCache::admit(const models::KVCache& prefilled, const std::vector<int64_t>& lengths,
                          const std::vector<int64_t>& slot_ids, const std::vector<int64_t>& sources) {
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
      for (int64_t b = 0; b < (len + bs - 1) / bs; ++b) table.push_back(allocate());
      copy_tokens(row, 0, len, table);
    } else {
      // Another sample of the same prompt: share the full blocks, copy the partial one.
      for (int64_t b = 0; b < full; ++b) {
        const int64_t block = tables_[static_cast<size_t>(it->second)][static_cast<size_t>(b)];
        table.push_back(block);
        refs_[static_cast<size_t>(block)] += 1;
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
  for (int64_t b : table) {
    if (--refs_[static_cast<size_t>(b)] == 0) free_.push_back(b);
  }
  table.clear();
  lengths_[static_cast<size_t>(slot)] = 0;
}

}  // namespace tessera::rollout::internal
