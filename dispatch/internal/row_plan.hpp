// row_plan.hpp: when a DP split is an equal run of rows per rank, and which rows (dispatch only).
//
// Note [Chunks cut by the receiver] (runtime/wire.hpp): for in-process workers the WorkerGroup
// skips the split and hands each rank the shared argument and its row range. That is only the
// same call when the mode's split is a built-in DP one (DP_COMPUTE_PROTO, DP_COMPUTE_METRIC; not
// one replaced by update_mode), every argument is a DataProto, and every argument's rank r piece
// is rows [r*k, (r+1)*k) of it or of its padded copy: what DataProto::chunk(world) returns for a
// length the world divides. Anything else (futures, unequal padded lengths, a length that does
// not divide, tensors that require grad) keeps the split, errors included. And it is only done
// where WorkerGroupOptions::cut_rows_on_receivers asks for it (by default: on hosts with more
// hardware threads than the group has ranks; on fewer, the ranks' extra work shares the cores
// and measured no gain).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "dispatch/modes.hpp"
#include "proto/data_proto.hpp"

namespace tessera::dispatch::internal {

/// Rank r's piece of argument i is rows [r * rows_per_rank[i], (r + 1) * rows_per_rank[i]) of
/// *sources[i] (the argument, or its padded copy).
struct RowPlan {
  std::vector<std::shared_ptr<const proto::DataProto>> sources;
  std::vector<int64_t> rows_per_rank;
  int64_t pad = 0;  ///< As SplitResult::pad: rows to strip from the collected output.
};

/// Whether `mode`'s split is a built-in DP split (DP_COMPUTE_PROTO's or DP_COMPUTE_METRIC's).
bool splits_rows_per_rank(const DispatchMode& mode);

/// The plan for `args` under such a split, or nullopt where the split itself must run.
std::optional<RowPlan> plan_rows_per_rank(const Args& args, const SplitContext& ctx);

}  // namespace tessera::dispatch::internal
