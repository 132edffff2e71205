// ppo_batching.cpp: micro-batching, Karmarkar-Karp partitions, metrics lists and batch-size
// normalisation (see ppo_batching.hpp).
#include "workers/ppo/ppo_batching.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

#include <torch/torch.h>

#include "proto/host_transfer.hpp"

namespace tessera::ppo {

// ---- Metrics ------------------------------------------------------------------------------------

void append_to_dict(Metrics& metrics, const std::map<std::string, double>& values) {
  for (const auto& [name, value] : values) metrics[name].push_back(value);
}

nlohmann::json metrics_to_json(const Metrics& metrics) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, values] : metrics) {
    nlohmann::json list = nlohmann::json::array();
    for (double v : values) list.push_back(std::isfinite(v) ? nlohmann::json(v) : nlohmann::json());
    out[name] = std::move(list);
  }
  return out;
}

// ---- Karmarkar-Karp -----------------------------------------------------------------------------
//
// Note [Karmarkar-Karp as verl runs it]
// verl's karmarkar_karp keeps a heapq of States. A State holds k Sets sorted by decreasing
// (sum, item count, items); its "spread" is the largest minus the smallest sum. The heap pops the
// State with the largest spread first (ties: the one whose largest Set is larger). The two popped
// States merge by pairing the largest Set of one with the smallest of the other, then re-sorting.
// Tie-breaking depends on heapq's exact sift order, so the heap below is a transcription of
// CPython's heapq (heappush = append + _siftdown; heappop = pop last, move to root, _siftup)
// rather than std::push_heap, whose sift order differs.

namespace {

struct KKSet {
  int64_t sum = 0;
  std::vector<std::pair<int64_t, int64_t>> items;  // (idx, val), in insertion order

  void add(int64_t idx, int64_t val) {
    items.emplace_back(idx, val);
    sum += val;
  }
  void merge(const KKSet& other) {
    for (const auto& [idx, val] : other.items) add(idx, val);
  }
  // Python Set.__lt__: by sum, then item count, then the item lists lexicographically.
  bool operator<(const KKSet& o) const {
    if (sum != o.sum) return sum < o.sum;
    if (items.size() != o.items.size()) return items.size() < o.items.size();
    return items < o.items;
  }
};

struct KKState {
  std::vector<KKSet> sets;  // decreasing order

  void sort_sets() {
    std::stable_sort(sets.begin(), sets.end(), [](const KKSet& a, const KKSet& b) { return b < a; });
  }
  int64_t spread() const { return sets.front().sum - sets.back().sum; }
  void merge(const KKState& other) {
    const size_t k = sets.size();
    for (size_t i = 0; i < k; ++i) sets[i].merge(other.sets[k - 1 - i]);
    sort_sets();
  }
  // Python State.__lt__ (a min-heap pops the largest spread first).
  bool operator<(const KKState& o) const {
    if (spread() != o.spread()) return spread() > o.spread();
    return o.sets.front() < sets.front();
  }
};

// CPython heapq._siftdown(heap, startpos, pos).
void heap_siftdown(std::vector<KKState>& heap, size_t startpos, size_t pos) {
  KKState item = std::move(heap[pos]);
  while (pos > startpos) {
    size_t parent = (pos - 1) >> 1;
    if (item < heap[parent]) {
      heap[pos] = std::move(heap[parent]);
      pos = parent;
      continue;
    }
    break;
  }
  heap[pos] = std::move(item);
}

// CPython heapq._siftup(heap, pos).
void heap_siftup(std::vector<KKState>& heap, size_t pos) {
  const size_t endpos = heap.size(), startpos = pos;
  KKState item = std::move(heap[pos]);
  size_t child = 2 * pos + 1;
  while (child < endpos) {
    size_t right = child + 1;
    if (right < endpos && !(heap[child] < heap[right])) child = right;
    heap[pos] = std::move(heap[child]);
    pos = child;
    child = 2 * pos + 1;
  }
  heap[pos] = std::move(item);
  heap_siftdown(heap, startpos, pos);
}

void heap_push(std::vector<KKState>& heap, KKState state) {
  heap.push_back(std::move(state));
  heap_siftdown(heap, 0, heap.size() - 1);
}

KKState heap_pop(std::vector<KKState>& heap) {
  KKState last = std::move(heap.back());
  heap.pop_back();
  if (heap.empty()) return last;
  KKState top = std::move(heap.front());
  heap.front() = std::move(last);
  heap_siftup(heap, 0);
  return top;
}

KKState make_state(const std::vector<std::pair<int64_t, int64_t>>& items, int64_t k) {
  KKState s;
  s.sets.resize(static_cast<size_t>(k));
  for (size_t i = 0; i < items.size(); ++i) s.sets[i].add(items[i].first, items[i].second);
  s.sort_sets();
  return s;
}

std::vector<std::vector<int64_t>> karmarkar_karp(const std::vector<int64_t>& seqlens, int64_t k,
                                                 bool equal_size) {
  std::vector<std::pair<int64_t, int64_t>> sorted;  // (seqlen, idx), ascending
  for (size_t i = 0; i < seqlens.size(); ++i) sorted.emplace_back(seqlens[i], static_cast<int64_t>(i));
  std::sort(sorted.begin(), sorted.end());
  std::vector<KKState> heap;
  const size_t step = equal_size ? static_cast<size_t>(k) : 1;
  for (size_t off = 0; off < sorted.size(); off += step) {
    std::vector<std::pair<int64_t, int64_t>> items;
    for (size_t i = 0; i < step; ++i) items.emplace_back(sorted[off + i].second, sorted[off + i].first);
    heap_push(heap, make_state(items, k));
  }
  while (heap.size() > 1) {
    KKState s0 = heap_pop(heap);
    KKState s1 = heap_pop(heap);
    s0.merge(s1);
    heap_push(heap, std::move(s0));
  }
  std::vector<std::vector<int64_t>> partitions;
  for (const KKSet& set : heap.front().sets) {
    std::vector<int64_t> part;
    for (const auto& item : set.items) part.push_back(item.first);
    partitions.push_back(std::move(part));
  }
  return partitions;
}

}  // namespace

Result<std::vector<std::vector<int64_t>>> get_seqlen_balanced_partitions(
    const std::vector<int64_t>& seqlens, int64_t k_partitions, bool equal_size) {
  const auto n = static_cast<int64_t>(seqlens.size());
  if (k_partitions < 1) {
    return make_error(ErrorCode::invalid_argument,
                      "get_seqlen_balanced_partitions: k_partitions {} < 1", k_partitions);
  }
  if (n < k_partitions) {
    return make_error(ErrorCode::invalid_argument,
                      "get_seqlen_balanced_partitions: {} sequences < k_partitions {}", n, k_partitions);
  }
  if (equal_size && n % k_partitions != 0) {
    return make_error(ErrorCode::invalid_argument,
                      "get_seqlen_balanced_partitions: equal_size needs {} % {} == 0", n, k_partitions);
  }
  for (int64_t i = 0; i < n; ++i) {
    if (seqlens[i] < 0) {
      return make_error(ErrorCode::invalid_argument,
                        "get_seqlen_balanced_partitions: seqlen[{}] = {} is negative", i, seqlens[i]);
    }
  }
  auto partitions = karmarkar_karp(seqlens, k_partitions, equal_size);
  for (size_t i = 0; i < partitions.size(); ++i) {
    if (partitions[i].empty()) {  // verl asserts the same (possible when many lengths are 0)
      return make_error(ErrorCode::internal, "get_seqlen_balanced_partitions: partition {} is empty", i);
    }
    std::sort(partitions[i].begin(), partitions[i].end());
  }
  return partitions;
}

std::vector<int64_t> get_reverse_idx(const std::vector<int64_t>& idx_map) {
  std::vector<int64_t> reverse(idx_map.size());
  for (size_t i = 0; i < idx_map.size(); ++i) reverse[static_cast<size_t>(idx_map[i])] = static_cast<int64_t>(i);
  return reverse;
}

// ---- Micro-batching -----------------------------------------------------------------------------

Result<MicroBatches> split_micro_batches(const proto::DataProto& data, int64_t micro_batch_size,
                                         const std::string& key) {
  if (micro_batch_size < 1) {
    return make_error(ErrorCode::invalid_argument, "{} = {} must be >= 1", key, micro_batch_size);
  }
  MicroBatches out;
  TESSERA_ASSIGN_OR_RETURN(out.batches, data.split(micro_batch_size));
  return out;
}

namespace {

// Partitions rows into `count` balanced groups; raises `count` while a group exceeds the budget.
Result<std::vector<std::vector<int64_t>>> partition_under_budget(const std::vector<int64_t>& lens,
                                                                  int64_t count, int64_t max_token_len) {
  const auto n = static_cast<int64_t>(lens.size());
  for (;; ++count) {
    TESSERA_ASSIGN_OR_RETURN(auto parts, get_seqlen_balanced_partitions(lens, count, /*equal_size=*/false));
    bool fits = true;
    for (const auto& part : parts) {
      int64_t sum = 0;
      for (int64_t idx : part) sum += lens[static_cast<size_t>(idx)];
      fits = fits && sum <= max_token_len;
    }
    if (fits || count >= n) return parts;
  }
}

// Orders micro-batches by decreasing sum of squared lengths, ties by smallest row index.
void sort_by_workload(std::vector<std::vector<int64_t>>& parts, const std::vector<int64_t>& lens) {
  auto workload = [&](const std::vector<int64_t>& part) {
    int64_t w = 0;
    for (int64_t idx : part) w += lens[static_cast<size_t>(idx)] * lens[static_cast<size_t>(idx)];
    return w;
  };
  std::stable_sort(parts.begin(), parts.end(), [&](const auto& a, const auto& b) {
    int64_t wa = workload(a), wb = workload(b);
    if (wa != wb) return wa > wb;
    return a.front() > b.front();  // verl sorts (workload, min index) with reverse=True
  });
}

}  // namespace

Result<MicroBatches> rearrange_micro_batches(const proto::DataProto& data, int64_t max_token_len,
                                             const std::string& key, const MicroBatchCountSync& sync) {
  TESSERA_ASSIGN_OR_RETURN(at::Tensor mask, data.tensor("attention_mask"));
  if (mask.dim() != 2) {
    return make_error(ErrorCode::invalid_argument, "rearrange_micro_batches: attention_mask must be 2-D, got {}-D",
                      mask.dim());
  }
  const int64_t rows = mask.size(0), width = mask.size(1);
  if (rows == 0) return make_error(ErrorCode::invalid_argument, "rearrange_micro_batches: empty batch");
  if (max_token_len < width) {
    return make_error(ErrorCode::invalid_argument,
                      "{} = {} must be >= the padded sequence length {}", key, max_token_len, width);
  }
  // Host boundary, deliberate: the partitioning (Karmarkar-Karp) runs on the host; one read of the
  // row lengths per call, wherever the mask lives.
  at::Tensor lens_t = mask.ne(0).sum(1).to(at::kLong).to(at::kCPU).contiguous();
  std::vector<int64_t> lens(lens_t.data_ptr<int64_t>(), lens_t.data_ptr<int64_t>() + rows);
  const int64_t total = std::accumulate(lens.begin(), lens.end(), int64_t{0});
  const int64_t initial = std::max<int64_t>(1, (total + max_token_len - 1) / max_token_len);
  TESSERA_ASSIGN_OR_RETURN(auto parts, partition_under_budget(lens, initial, max_token_len));
  if (sync) {
    const auto local = static_cast<int64_t>(parts.size());
    TESSERA_ASSIGN_OR_RETURN(int64_t agreed, sync(local));
    if (agreed < local || agreed > rows) {
      return make_error(ErrorCode::invalid_argument,
                        "rearrange_micro_batches: {} micro-batches agreed across dp, but this rank needs {} "
                        "and has {} rows", agreed, local, rows);
    }
    if (agreed != local) {  // the agreed count is what every rank runs, even if a group overshoots
      TESSERA_ASSIGN_OR_RETURN(parts, get_seqlen_balanced_partitions(lens, agreed, /*equal_size=*/false));
    }
  }
  sort_by_workload(parts, lens);
  MicroBatches out;
  for (const auto& part : parts) {
    TESSERA_ASSIGN_OR_RETURN(auto mb, data.select_idxs(part));
    out.batches.push_back(std::move(mb));
  }
  out.indices = std::move(parts);
  return out;
}

Result<at::Tensor> restore_dynamic_batch(const at::Tensor& stacked,
                                         const std::vector<std::vector<int64_t>>& indices) {
  std::vector<int64_t> flat;
  for (const auto& part : indices) flat.insert(flat.end(), part.begin(), part.end());
  const auto n = static_cast<int64_t>(flat.size());
  if (!stacked.defined() || stacked.dim() < 1 || stacked.size(0) != n) {
    return make_error(ErrorCode::invalid_argument, "restore_dynamic_batch: {} rows for {} indices",
                      stacked.defined() && stacked.dim() >= 1 ? stacked.size(0) : -1, n);
  }
  std::vector<bool> seen(static_cast<size_t>(n), false);
  for (int64_t idx : flat) {
    if (idx < 0 || idx >= n || seen[static_cast<size_t>(idx)]) {
      return make_error(ErrorCode::invalid_argument,
                        "restore_dynamic_batch: indices are not a permutation of [0, {}) (bad index {})", n, idx);
    }
    seen[static_cast<size_t>(idx)] = true;
  }
  std::vector<int64_t> reverse = get_reverse_idx(flat);
  at::Tensor order = proto::upload(reverse, stacked.device());
  return stacked.index_select(0, order);
}

// ---- Batch-size normalisation -------------------------------------------------------------------

Result<int64_t> data_parallel_size(const DataParallelShape& shape) {
  if (shape.world_size < 1 || shape.ulysses_sequence_parallel_size < 1) {
    return make_error(ErrorCode::invalid_argument,
                      "world_size {} and ulysses_sequence_parallel_size {} must be >= 1", shape.world_size,
                      shape.ulysses_sequence_parallel_size);
  }
  if (shape.world_size % shape.ulysses_sequence_parallel_size != 0) {
    return make_error(ErrorCode::invalid_argument,
                      "world_size {} is not divisible by ulysses_sequence_parallel_size {}", shape.world_size,
                      shape.ulysses_sequence_parallel_size);
  }
  return shape.world_size / shape.ulysses_sequence_parallel_size;
}

Result<int64_t> normalize_mini_batch_size(int64_t mini_batch_size, int64_t rollout_n, int64_t dp_size,
                                          const std::string& key) {
  if (mini_batch_size < 1) return make_error(ErrorCode::invalid_argument, "{} = {} must be >= 1", key, mini_batch_size);
  if (rollout_n < 1) return make_error(ErrorCode::invalid_argument, "rollout.n = {} must be >= 1 (normalising {})", rollout_n, key);
  if (dp_size < 1) return make_error(ErrorCode::invalid_argument, "dp size {} must be >= 1 (normalising {})", dp_size, key);
  const int64_t samples = mini_batch_size * rollout_n;
  if (samples % dp_size != 0) {
    return make_error(ErrorCode::invalid_argument,
                      "{} = {} x rollout.n {} = {} samples is not divisible by the dp size {}", key,
                      mini_batch_size, rollout_n, samples, dp_size);
  }
  return samples / dp_size;
}

Result<int64_t> normalize_global_micro_batch_size(int64_t micro_batch_size, int64_t dp_size,
                                                  const std::string& key) {
  if (micro_batch_size < 1) return make_error(ErrorCode::invalid_argument, "{} = {} must be >= 1", key, micro_batch_size);
  if (dp_size < 1) return make_error(ErrorCode::invalid_argument, "dp size {} must be >= 1 (normalising {})", dp_size, key);
  if (micro_batch_size % dp_size != 0) {
    return make_error(ErrorCode::invalid_argument, "{} = {} is not divisible by the dp size {}", key,
                      micro_batch_size, dp_size);
  }
  return micro_batch_size / dp_size;
}

Status check_micro_divides_mini(int64_t mini_batch_size, const std::string& mini_key,
                                int64_t micro_batch_size_per_gpu, const std::string& micro_key) {
  if (micro_batch_size_per_gpu < 1) {
    return make_error(ErrorCode::invalid_argument, "{} = {} must be >= 1", micro_key, micro_batch_size_per_gpu);
  }
  if (mini_batch_size % micro_batch_size_per_gpu != 0) {
    return make_error(ErrorCode::invalid_argument,
                      "normalised {} = {} is not divisible by {} = {}", mini_key, mini_batch_size, micro_key,
                      micro_batch_size_per_gpu);
  }
  return Status();
}

Status fold_global_micro_batch_size(std::optional<int64_t>& global, std::optional<int64_t>& per_gpu, int64_t dp_size,
                                    const std::string& key) {
  if (!global) return Status();
  TESSERA_ASSIGN_OR_RETURN(per_gpu, normalize_global_micro_batch_size(*global, dp_size, key));
  global.reset();
  return Status();
}

Status check_normalized_micro_batch(const std::string& role, int64_t ppo_mini_batch_size,
                                    const std::optional<int64_t>& ppo_micro_batch_size_per_gpu, bool use_dynamic_bsz) {
  if (ppo_micro_batch_size_per_gpu) {
    return check_micro_divides_mini(ppo_mini_batch_size, role + ".ppo_mini_batch_size", *ppo_micro_batch_size_per_gpu,
                                    role + ".ppo_micro_batch_size_per_gpu");
  }
  if (use_dynamic_bsz) return Status();
  return make_error(ErrorCode::invalid_argument,
                    "{0}.ppo_micro_batch_size_per_gpu (or ppo_micro_batch_size) must be set when "
                    "{0}.use_dynamic_bsz is false",
                    role);
}

Status check_fixed_micro_batch(const std::string& role, int64_t ppo_mini_batch_size,
                               const std::optional<int64_t>& ppo_micro_batch_size_per_gpu, bool use_dynamic_bsz) {
  if (use_dynamic_bsz) return Status();
  if (!ppo_micro_batch_size_per_gpu) {
    return make_error(ErrorCode::invalid_argument, "{0}.ppo_micro_batch_size_per_gpu must be set when "
                      "{0}.use_dynamic_bsz is false", role);
  }
  return check_micro_divides_mini(ppo_mini_batch_size, role + ".ppo_mini_batch_size", *ppo_micro_batch_size_per_gpu,
                                  role + ".ppo_micro_batch_size_per_gpu");
}

}  // namespace tessera::ppo
