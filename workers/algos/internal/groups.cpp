#include "workers/algos/internal/groups.hpp"

#include <unordered_map>

#include <torch/torch.h>

namespace tessera::algos::internal {

Groups group_rows(const std::vector<std::string>& index, const at::Tensor& like) {
  Groups g;
  std::unordered_map<std::string, int64_t> id_of;
  std::vector<int64_t> group_of(index.size());
  for (size_t i = 0; i < index.size(); ++i) {
    auto [it, inserted] = id_of.emplace(index[i], static_cast<int64_t>(g.uids.size()));
    if (inserted) {
      g.uids.push_back(index[i]);
      g.rows.emplace_back();
    }
    group_of[i] = it->second;
    g.rows[it->second].push_back(static_cast<int64_t>(i));
  }
  std::vector<double> counts;
  counts.reserve(g.rows.size());
  for (const auto& r : g.rows) counts.push_back(static_cast<double>(r.size()));
  const auto cpu_long = at::TensorOptions().dtype(at::kLong);
  g.group_of = at::tensor(group_of, cpu_long).to(like.device());
  g.counts = at::tensor(counts, at::TensorOptions().dtype(at::kDouble)).to(like.options());
  return g;
}

at::Tensor group_sum(const at::Tensor& x, const Groups& groups) {
  return at::zeros({static_cast<int64_t>(groups.rows.size())}, x.options()).index_add_(0, groups.group_of, x);
}

at::Tensor per_row(const at::Tensor& per_group, const Groups& groups) {
  return per_group.index_select(0, groups.group_of);
}

at::Tensor group_size(const Groups& groups) { return per_row(groups.counts, groups); }

at::Tensor group_mean(const at::Tensor& scores, const Groups& groups) {
  const at::Tensor mean = per_row(group_sum(scores, groups) / groups.counts, groups);
  return at::where(group_size(groups) > 1, mean, at::zeros({}, scores.options()));
}

at::Tensor group_std(const at::Tensor& scores, const Groups& groups) {
  const at::Tensor n = group_size(groups);
  const at::Tensor mean = per_row(group_sum(scores, groups) / groups.counts, groups);
  const at::Tensor centered = scores - mean;
  // Singletons divide by zero here; where() discards those lanes (no autograd in estimators).
  const at::Tensor var = per_row(group_sum(centered * centered, groups) / (groups.counts - 1), groups);
  return at::where(n > 1, var.sqrt(), at::ones({}, scores.options()));
}

}  // namespace tessera::algos::internal
