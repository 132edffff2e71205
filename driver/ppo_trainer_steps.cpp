// ppo_trainer_steps.cpp: the driver-side computations of verl's fit() (see ppo_trainer.hpp):
// balance_batch, apply_kl_penalty, compute_advantage, compute_response_mask.
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "driver/ppo_trainer.hpp"
#include "workers/algos/advantage.hpp"
#include "workers/algos/kl.hpp"

namespace tessera::driver {
namespace {

// One partition of a Karmarkar-Karp state (verl's Set): items (index, seqlen) and their sum.
struct KkSet {
  int64_t sum = 0;
  std::vector<std::pair<int64_t, int64_t>> items;
  bool operator<(const KkSet& o) const {
    if (sum != o.sum) return sum < o.sum;
    if (items.size() != o.items.size()) return items.size() < o.items.size();
    return items < o.items;
  }
};

// verl's State: k sets kept sorted by decreasing sum.
struct KkState {
  std::vector<KkSet> sets;
  int64_t spread() const { return sets.front().sum - sets.back().sum; }
  void sort_sets() { std::sort(sets.begin(), sets.end(), [](const KkSet& a, const KkSet& b) { return b < a; }); }
  void merge(const KkState& other) {
    const size_t k = sets.size();
    for (size_t i = 0; i < k; ++i) {
      const KkSet& o = other.sets[k - 1 - i];
      sets[i].sum += o.sum;
      sets[i].items.insert(sets[i].items.end(), o.items.begin(), o.items.end());
    }
    sort_sets();
  }
};

// heapq order: the state with the LARGEST spread is popped first (verl's State.__lt__).
bool heap_after(const KkState& a, const KkState& b) {
  if (a.spread() != b.spread()) return a.spread() < b.spread();
  return a.sets.front() < b.sets.front();
}

std::string shape_of(const at::Tensor& t) {
  std::string out = "[";
  for (int64_t d = 0; d < t.dim(); ++d) out += (d ? ", " : "") + std::to_string(t.size(d));
  return out + "]";
}

Result<at::Tensor> need(const proto::DataProto& batch, const std::string& key, const char* step) {
  auto t = batch.tensor(key);
  if (!t.ok()) return make_error(ErrorCode::not_found, "{}: batch has no '{}'", step, key);
  return *t;
}

}  // namespace

Result<std::vector<std::vector<int64_t>>> balanced_equal_partitions(const std::vector<int64_t>& seqlens, int64_t k) {
  const auto n = static_cast<int64_t>(seqlens.size());
  if (k < 1 || n % k != 0) {
    return make_error(ErrorCode::invalid_argument, "balance_batch: {} rows cannot be split into {} equal partitions", n, k);
  }
  std::vector<std::pair<int64_t, int64_t>> sorted;  // (seqlen, index), ascending
  for (int64_t i = 0; i < n; ++i) sorted.emplace_back(seqlens[static_cast<size_t>(i)], i);
  std::sort(sorted.begin(), sorted.end());
  std::vector<KkState> heap;
  for (int64_t offset = 0; offset < n; offset += k) {
    KkState s;
    for (int64_t i = 0; i < k; ++i) {
      const auto& [len, idx] = sorted[static_cast<size_t>(offset + i)];
      s.sets.push_back(KkSet{len, {{idx, len}}});
    }
    s.sort_sets();
    heap.push_back(std::move(s));
    std::push_heap(heap.begin(), heap.end(), heap_after);
  }
  while (heap.size() > 1) {
    std::pop_heap(heap.begin(), heap.end(), heap_after);
    KkState s0 = std::move(heap.back());
    heap.pop_back();
    std::pop_heap(heap.begin(), heap.end(), heap_after);
    KkState s1 = std::move(heap.back());
    heap.pop_back();
    s0.merge(s1);
    heap.push_back(std::move(s0));
    std::push_heap(heap.begin(), heap.end(), heap_after);
  }
  std::vector<std::vector<int64_t>> out;
  if (heap.empty()) return out;
  for (const auto& set : heap.front().sets) {
    std::vector<int64_t> part;
    for (const auto& item : set.items) part.push_back(item.first);
    std::sort(part.begin(), part.end());
    if (static_cast<int64_t>(part.size()) != n / k) {
      return make_error(ErrorCode::internal, "balance_batch: partition of {} rows, expected {}", part.size(), n / k);
    }
    out.push_back(std::move(part));
  }
  return out;
}

Status balance_batch(proto::DataProto& batch, int64_t world_size, Metrics& metrics) {
  TESSERA_ASSIGN_OR_RETURN(at::Tensor mask, need(batch, "attention_mask", "balance_batch"));
  at::Tensor lens = mask.sum(-1).to(torch::kInt64).contiguous();
  std::vector<int64_t> seqlens(lens.data_ptr<int64_t>(), lens.data_ptr<int64_t>() + lens.numel());
  TESSERA_ASSIGN_OR_RETURN(auto partitions, balanced_equal_partitions(seqlens, world_size));
  std::vector<int64_t> order;
  for (const auto& p : partitions) order.insert(order.end(), p.begin(), p.end());
  TESSERA_RETURN_IF_ERROR(batch.reorder(torch::tensor(order, torch::kInt64)));
  // verl's log_seqlen_unbalance: contiguous chunks before balancing vs the partitions.
  const int64_t per = static_cast<int64_t>(seqlens.size()) / world_size;
  int64_t mn = INT64_MAX, mx = INT64_MIN, total = 0, bmn = INT64_MAX, bmx = INT64_MIN;
  for (int64_t off = 0; off < static_cast<int64_t>(seqlens.size()); off += per) {
    const int64_t s = std::accumulate(seqlens.begin() + off, seqlens.begin() + off + per, int64_t{0});
    mn = std::min(mn, s), mx = std::max(mx, s), total += s;
  }
  for (const auto& p : partitions) {
    int64_t s = 0;
    for (int64_t i : p) s += seqlens[static_cast<size_t>(i)];
    bmn = std::min(bmn, s), bmx = std::max(bmx, s);
  }
  metrics["global_seqlen/min"] = static_cast<double>(mn);
  metrics["global_seqlen/max"] = static_cast<double>(mx);
  metrics["global_seqlen/minmax_diff"] = static_cast<double>(mx - mn);
  metrics["global_seqlen/balanced_min"] = static_cast<double>(bmn);
  metrics["global_seqlen/balanced_max"] = static_cast<double>(bmx);
  metrics["global_seqlen/mean"] = static_cast<double>(total) / static_cast<double>(partitions.size());
  return Status();
}

Result<at::Tensor> compute_response_mask(const proto::DataProto& batch) {
  TESSERA_ASSIGN_OR_RETURN(at::Tensor responses, need(batch, "responses", "compute_response_mask"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor mask, need(batch, "attention_mask", "compute_response_mask"));
  const int64_t R = responses.size(1);
  if (mask.dim() != 2 || mask.size(1) < R) {
    return make_error(ErrorCode::invalid_argument, "compute_response_mask: attention_mask {} shorter than responses {}",
                      shape_of(mask), shape_of(responses));
  }
  return mask.narrow(1, mask.size(1) - R, R);
}

Result<double> apply_kl_penalty(proto::DataProto& batch, double beta, const std::string& kl_penalty) {
  TESSERA_ASSIGN_OR_RETURN(at::Tensor mask, need(batch, "response_mask", "apply_kl_penalty"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor scores, need(batch, "token_level_scores", "apply_kl_penalty"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor old_lp, need(batch, "old_log_probs", "apply_kl_penalty"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor ref_lp, need(batch, "ref_log_prob", "apply_kl_penalty"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor kld, algos::kl_penalty(old_lp, ref_lp, kl_penalty));
  const at::Tensor m = mask.to(kld.scalar_type());
  kld = kld * m;
  TESSERA_RETURN_IF_ERROR(batch.set_tensor("token_level_rewards", scores - beta * kld));
  // verl: masked_mean over each row, then the batch mean.
  const at::Tensor per_row = (kld * m).sum(-1) / m.sum(-1).clamp_min(1e-8);
  return per_row.mean().item<double>();
}

Status compute_advantage(proto::DataProto& batch, const std::string& adv_estimator, double gamma, double lam,
                         bool norm_adv_by_std_in_grpo) {
  algos::AdvantageInputs in;
  TESSERA_ASSIGN_OR_RETURN(in.token_level_rewards, need(batch, "token_level_rewards", "compute_advantage"));
  if (!batch.tensor("response_mask").ok()) {
    TESSERA_ASSIGN_OR_RETURN(at::Tensor rm, compute_response_mask(batch));
    TESSERA_RETURN_IF_ERROR(batch.set_tensor("response_mask", rm));
  }
  TESSERA_ASSIGN_OR_RETURN(in.response_mask, need(batch, "response_mask", "compute_advantage"));
  in.response_mask = in.response_mask.to(in.token_level_rewards.scalar_type());
  if (auto v = batch.tensor("values"); v.ok()) in.values = *v;
  if (auto b = batch.tensor("reward_baselines"); b.ok()) in.reward_baselines = *b;
  if (auto uid = batch.column("uid"); uid.ok()) {
    for (int64_t i = 0; i < batch.size(); ++i) {
      const nlohmann::json v = uid->row_json(i);
      in.index.push_back(v.is_string() ? v.get<std::string>() : v.dump());
    }
  }
  in.config.gamma = gamma;
  in.config.lam = lam;
  in.config.norm_adv_by_std_in_grpo = norm_adv_by_std_in_grpo;
  TESSERA_ASSIGN_OR_RETURN(algos::AdvantageEstimatorFn fn, algos::get_adv_estimator_fn(adv_estimator));
  TESSERA_ASSIGN_OR_RETURN(algos::AdvantageReturn out, fn(in));
  TESSERA_RETURN_IF_ERROR(batch.set_tensor("advantages", out.advantages));
  return batch.set_tensor("returns", out.returns);
}

Status pf_ppo_reweight(proto::DataProto& batch, const std::string& reweight_method, double weight_pow) {
  TESSERA_ASSIGN_OR_RETURN(at::Tensor token_scores, need(batch, "token_level_scores", "pf_ppo"));
  const at::Tensor scores = token_scores.sum(-1);
  at::Tensor weights;
  if (reweight_method == "pow") {
    weights = scores.abs().pow(weight_pow);
  } else if (reweight_method == "max_min") {
    weights = at::where((scores == scores.max()) | (scores == scores.min()), 1.0, 0.0).to(scores.scalar_type());
  } else if (reweight_method == "max_random") {
    weights = at::where(scores == scores.max(), 0.4, 0.1).to(scores.scalar_type());
  } else {
    return make_error(ErrorCode::invalid_argument,
                      "algorithm.pf_ppo.reweight_method = '{}' is not one of: pow, max_min, max_random", reweight_method);
  }
  weights = (weights + 1e-8).clamp_min(1e-8);
  const int64_t b = batch.size();
  // The driver's batch is on the host (as verl's is); the indices also resample host-side meta_info.
  const at::Tensor idx = at::multinomial(weights.to(torch::kCPU, torch::kFloat64), b, /*replacement=*/true);
  TESSERA_RETURN_IF_ERROR(batch.reorder(idx));
  const at::Tensor picked = idx.to(torch::kInt64).contiguous();
  for (auto& [key, value] : batch.meta_info().items()) {
    if (!value.is_array() || static_cast<int64_t>(value.size()) != b) continue;
    nlohmann::json resampled = nlohmann::json::array();
    for (int64_t i = 0; i < b; ++i) resampled.push_back(value[static_cast<size_t>(picked.data_ptr<int64_t>()[i])]);
    value = std::move(resampled);
  }
  return Status();
}

}  // namespace tessera::driver
