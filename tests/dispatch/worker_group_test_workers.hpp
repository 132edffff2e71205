// worker_group_test_workers.hpp: a WorkerBase class with one method per dispatch mode.
//
//   tag        DP_COMPUTE_PROTO   y *= 2, adds int64 column "rank" (who processed each row)
//   tag_async  DP_COMPUTE_PROTO, non-blocking (same body)
//   info       ONE_TO_ALL         {"rank", "rows": rows of arg 0 or -1, "nargs"}
//   info_all   ALL_TO_ALL         {"rank", "arg": arg 0}
//   scale      DP_COMPUTE         arg * 10 + rank
//   with_func  DP_COMPUTE_PROTO_WITH_FUNC  args[0] "negate" | "double" applied to y
//   metric     DP_COMPUTE_METRIC  {"rank", "rows"}
//   leader     ONE_TO_ALL + RANK_ZERO  {"rank"}
//   nd_tag     nd:tp              like tag; rank r registers dp_rank r / 2, collect iff r even
#pragma once

#include "runtime/worker.hpp"

namespace tessera::dispatch::testing {

/// Registers "dp_worker".
void register_dp_workers(runtime::WorkerTypeRegistry& registry);
/// A registry holding "dp_worker".
const runtime::WorkerTypeRegistry& dp_registry();

}  // namespace tessera::dispatch::testing
