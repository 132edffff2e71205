// slot_cache.cpp: see Note [Slot cache layout] in slot_cache.hpp.
#include "workers/rollout/internal/slot_cache.hpp"

#include <algorithm>

#include <torch/torch.h>

namespace tessera::rollout::internal {

SlotCache::SlotCache(models::ModelConfig config, models::KVCache kv, at::Tensor mask)
    : config_(std::move(config)), kv_(std::move(kv)), mask_(std::move(mask)) {}

Result<SlotCache> SlotCache::create(const models::ModelConfig& config, c10::ScalarType dtype, int64_t slots,
                                    int64_t capacity, c10::Device device) {
  TESSERA_ASSIGN_OR_RETURN(models::KVCache kv, models::KVCache::create(config, {slots, capacity, dtype, device}));
  return SlotCache(config, std::move(kv), at::zeros({slots, capacity}, at::TensorOptions(at::kBool).device(device)));
}

int64_t SlotCache::visible(int64_t slot) const { return mask_[slot].sum().item<int64_t>(); }

void SlotCache::insert(const models::KVCache& prefilled, const at::Tensor& prefill_mask,
                       const std::vector<int64_t>& slot_ids, const std::vector<int64_t>& sources) {
  const int64_t width = prefilled.capacity();
  if (kv_.length() < width) kv_.advance(width - kv_.length());  // new columns stay hidden for all
  const int64_t start = kv_.length() - width;
  const c10::Device device = mask_.device();
  at::Tensor slots = at::tensor(slot_ids, at::kLong).to(device);
  // Row i of the prefill goes to slot i unless some rows feed several slots.
  bool identity = static_cast<int64_t>(sources.size()) == prefilled.batch_size();
  for (size_t i = 0; identity && i < sources.size(); ++i) identity = sources[i] == static_cast<int64_t>(i);
  const at::Tensor rows = identity ? at::Tensor() : at::tensor(sources, at::kLong).to(device);
  auto pick = [&](const at::Tensor& t) { return identity ? t : t.index_select(0, rows); };
  at::NoGradGuard no_grad;
  for (int64_t l = 0; l < kv_.num_layers(); ++l) {
    kv_.key(l).narrow(2, start, width).index_copy_(0, slots, pick(prefilled.key(l)));
    kv_.value(l).narrow(2, start, width).index_copy_(0, slots, pick(prefilled.value(l)));
  }
  mask_.index_fill_(0, slots, false);
  mask_.narrow(1, start, width).index_copy_(0, slots, pick(prefill_mask.ne(0)));
}

void SlotCache::open_column(const at::Tensor& live) { mask_.select(1, kv_.length()).copy_(live); }

void SlotCache::clear(int64_t slot) { mask_[slot].fill_(false); }

Result<SlotCache> SlotCache::repack(const std::vector<int64_t>& keep) const {
  const int64_t K = static_cast<int64_t>(keep.size()), len = kv_.length();
  const c10::Device device = mask_.device();
  at::Tensor rows = at::tensor(keep, at::kLong).to(device);
  // The column plan is made on the host: one copy of the kept rows' mask (a repack is rare).
  at::Tensor old_mask = mask_.narrow(1, 0, len).index_select(0, rows).to(at::kCPU).contiguous();
  auto m = old_mask.accessor<bool, 2>();
  std::vector<std::vector<int64_t>> columns(static_cast<size_t>(K));
  int64_t width = 1;
  for (int64_t i = 0; i < K; ++i) {
    for (int64_t c = 0; c < len; ++c) {
      if (m[i][c]) columns[static_cast<size_t>(i)].push_back(c);
    }
    width = std::max<int64_t>(width, static_cast<int64_t>(columns[static_cast<size_t>(i)].size()));
  }
  TESSERA_ASSIGN_OR_RETURN(SlotCache out, create(config_, kv_.dtype(), K, kv_.capacity(), device));
  at::Tensor gather = at::zeros({K, width}, at::kLong);  // hidden padding reads column 0
  at::Tensor new_mask = at::zeros({K, out.capacity()}, at::kBool);
  auto g = gather.accessor<int64_t, 2>();
  auto nm = new_mask.accessor<bool, 2>();
  for (int64_t i = 0; i < K; ++i) {
    const auto& cols = columns[static_cast<size_t>(i)];
    const int64_t offset = width - static_cast<int64_t>(cols.size());
    for (size_t j = 0; j < cols.size(); ++j) {
      g[i][offset + static_cast<int64_t>(j)] = cols[j];
      nm[i][offset + static_cast<int64_t>(j)] = true;
    }
  }
  out.mask_.copy_(new_mask);
  gather = gather.to(device);
  at::NoGradGuard no_grad;
  at::Tensor row_index = rows.unsqueeze(1);  // [K, 1] broadcasts against gather [K, width]
  for (int64_t l = 0; l < kv_.num_layers(); ++l) {
    // [S, kv_heads, cap, D] viewed as [S, cap, kv_heads, D]: (row, column) pairs pick [K, width, kv_heads, D].
    at::Tensor k = kv_.key(l).permute({0, 2, 1, 3}).index({row_index, gather});
    at::Tensor v = kv_.value(l).permute({0, 2, 1, 3}).index({row_index, gather});
    out.kv_.key(l).narrow(2, 0, width).copy_(k.permute({0, 2, 1, 3}));
    out.kv_.value(l).narrow(2, 0, width).copy_(v.permute({0, 2, 1, 3}));
  }
  out.kv_.advance(width);
  return out;
}

}  // namespace tessera::rollout::internal
