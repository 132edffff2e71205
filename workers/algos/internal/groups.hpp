// groups.hpp: rows grouped by uid (verl's id2score dicts), with vectorised per-group statistics.
// Groups are numbered in order of first appearance, so results do not depend on hashing.
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tessera::algos::internal {

struct Groups {
  std::vector<std::string> uids;           ///< Uid of each group.
  std::vector<std::vector<int64_t>> rows;  ///< Rows of each group, ascending.
  at::Tensor group_of;                     ///< (bs,) int64: the group of each row.
  at::Tensor counts;                       ///< (G,) group sizes, in the scores' dtype.
};

/// Groups the rows of `index`; tensors are created on `like`'s device with its dtype for counts.
Groups group_rows(const std::vector<std::string>& index, const at::Tensor& like);

/// Per-group sums of the (bs,) vector x: (G,).
at::Tensor group_sum(const at::Tensor& x, const Groups& groups);

/// Broadcasts a (G,) per-group vector back to rows: (bs,).
at::Tensor per_row(const at::Tensor& per_group, const Groups& groups);

/// Per-row group mean of scores; rows in a group of one get 0 (verl).
at::Tensor group_mean(const at::Tensor& scores, const Groups& groups);

/// Per-row unbiased group std of scores; rows in a group of one get 1 (verl).
at::Tensor group_std(const at::Tensor& scores, const Groups& groups);

/// Per-row group size, in the scores' dtype.
at::Tensor group_size(const Groups& groups);

}  // namespace tessera::algos::internal
