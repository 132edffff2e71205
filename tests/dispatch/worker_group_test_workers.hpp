// worker_group_test_workers.hpp: a WorkerBase class with one method per dispatch mode.
//
//   tag        DP_COMPUTE_PROTO   y *= 2, adds int64 column "rank" (who processed each row)
//   tag_async  DP_COMPUTE_PROTO, non-blocking (same body)
//   tag_but_rank_1  DP_COMPUTE_PROTO  like tag, but rank 1 returns JSON {"rank": 1}
//   info       ONE_TO_ALL         {"rank", "rows": rows of arg 0 or -1, "nargs"}
//   info_all   ALL_TO_ALL         {"rank", "arg": arg 0}
//   scale      DP_COMPUTE         arg * 10 + rank
//   with_func  DP_COMPUTE_PROTO_WITH_FUNC  args[0] "negate" | "double" applied to y
//   metric     DP_COMPUTE_METRIC  {"rank", "rows"}
//   leader     ONE_TO_ALL + RANK_ZERO  {"rank"}
//   nd_tag     nd:tp              like tag; rank r registers dp_rank r / 2, collect iff r even
#pragma once

#include <memory>

#include <gtest/gtest.h>

#include "dispatch/worker_group.hpp"
#include "proto/status.hpp"
#include "runtime/runtime.hpp"
#include "runtime/worker.hpp"

namespace tessera::dispatch::testing {

/// Registers "dp_worker".
void register_dp_workers(runtime::WorkerTypeRegistry& registry);
/// A registry holding "dp_worker".
const runtime::WorkerTypeRegistry& dp_registry();

/// A runtime and its "dp" group: one dp_worker per device of the whole pool.
struct DpGroup {
  std::unique_ptr<runtime::Runtime> runtime;
  std::shared_ptr<WorkerGroup> group;  ///< Destroyed before the runtime.
};

/// Starts a runtime from `config` with dp_registry() and spawns the "dp" group on it.
Result<DpGroup> start_dp_group(const runtime::RuntimeConfig& config);

/// A gtest fixture owning one runtime and its "dp" group for the whole suite (one pair per
/// `Suite`, CRTP). The suite's SetUpTestSuite calls start_suite, its TearDownTestSuite stop_suite.
template <class Suite>
class DpGroupSuite : public ::testing::Test {
 protected:
  static void start_suite(const runtime::RuntimeConfig& config) {
    auto dp = start_dp_group(config);
    ASSERT_TRUE(dp.ok()) << dp.status().to_string();
    rt_ = dp->runtime.release();
    wg_ = new std::shared_ptr<WorkerGroup>(std::move(dp->group));
  }
  static void stop_suite() {
    delete wg_;
    wg_ = nullptr;
    delete rt_;
    rt_ = nullptr;
  }
  WorkerGroup& wg() { return **wg_; }

  inline static runtime::Runtime* rt_ = nullptr;
  inline static std::shared_ptr<WorkerGroup>* wg_ = nullptr;
};

}  // namespace tessera::dispatch::testing
