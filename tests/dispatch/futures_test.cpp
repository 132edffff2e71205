// Tests of the future-chunk planner against a brute-force reference: materialise the whole
// producer output as global row ids, pad, chunk, and compare with what the plan fetches.
#include <gtest/gtest.h>

#include "dispatch/futures.hpp"
#include "tests/dispatch/test_util.hpp"

namespace tessera::dispatch {
namespace {

// Global row ids the plan assembles (producer r's local row k is global offset_r + k).
std::vector<int64_t> expand(const ChunkPlan& plan, const std::vector<int64_t>& producer_rows) {
  std::vector<int64_t> offset(producer_rows.size(), 0);
  for (size_t r = 1; r < producer_rows.size(); ++r) offset[r] = offset[r - 1] + producer_rows[r - 1];
  std::vector<int64_t> out;
  for (const auto& p : plan.pieces)
    for (int64_t rep = 0; rep < p.repeat; ++rep)
      for (int64_t k = p.begin; k < p.end; ++k) out.push_back(offset[p.producer_rank] + k);
  return out;
}

// The brute-force reference: verl's pad-with-last-row then chunk, on global ids.
std::vector<int64_t> reference(int64_t L, int32_t world, int32_t rank) {
  std::vector<int64_t> all;
  for (int64_t i = 0; i < L; ++i) all.push_back(i);
  while (all.size() % world) all.push_back(L - 1);
  const int64_t per = static_cast<int64_t>(all.size()) / world;
  return std::vector<int64_t>(all.begin() + per * rank, all.begin() + per * (rank + 1));
}

TEST(FuturePlan, MatchesBruteForceForManyShapes) {
  const std::vector<std::vector<int64_t>> producers = {{4, 4}, {3, 3, 3}, {5}, {2, 2, 2, 2}, {1, 4, 0, 2}};
  int checked = 0;
  for (const auto& rows : producers) {
    int64_t total = 0;
    for (auto r : rows) total += r;
    for (int64_t ppad = 0; ppad <= std::min<int64_t>(2, total - 1); ++ppad) {
      for (int32_t world = 1; world <= 5; ++world) {
        for (int32_t rank = 0; rank < world; ++rank) {
          auto plan = plan_future_chunk(rows, ppad, world, rank, /*auto_padding=*/true);
          ASSERT_TRUE(plan.ok()) << plan.status().to_string();
          const int64_t L = total - ppad;
          EXPECT_EQ(plan->logical_rows, L);
          EXPECT_EQ(expand(*plan, rows), reference(L, world, rank)) << "L=" << L << " world=" << world << " rank=" << rank;
          EXPECT_EQ(plan->rows, static_cast<int64_t>(reference(L, world, rank).size()));
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(FuturePlan, WithoutPaddingRequiresDivisibility) {
  auto bad = plan_future_chunk({3, 4}, 0, 2, 0, false);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("auto-padding is off"), std::string::npos);
  auto ok = plan_future_chunk({3, 3}, 0, 2, 1, false);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->pieces, (std::vector<RowSource>{{1, 0, 3, 1}}));
  EXPECT_FALSE(plan_future_chunk({3}, 4, 1, 0, false).ok());
  EXPECT_FALSE(plan_future_chunk({3}, 0, 2, 2, false).ok());
  EXPECT_FALSE(plan_future_chunk({-1}, 0, 1, 0, false).ok());
}

TEST(FuturePlan, AssembleJoinsFetchedPiecesAndAppliesRepeats) {
  // Producer ranks hold rows 0..3 and 4..6 (7 rows, one of them producer padding).
  proto::DataProto full = testing::rows(7);
  std::vector<int64_t> producer_rows{4, 3};
  auto plan = plan_future_chunk(producer_rows, 1, 4, 3, true);  // L = 6, pad 2, per = 2
  ASSERT_TRUE(plan.ok());
  std::vector<proto::DataProto> fetched;
  for (const auto& p : plan->pieces) {
    const int64_t off = p.producer_rank == 0 ? 0 : 4;
    fetched.push_back(*full.slice(off + p.begin, off + p.end));
  }
  auto chunk = assemble_chunk(*plan, fetched);
  ASSERT_TRUE(chunk.ok()) << chunk.status().to_string();
  EXPECT_EQ(testing::ids(*chunk), (std::vector<int64_t>{5, 5}));
  fetched.pop_back();
  EXPECT_FALSE(assemble_chunk(*plan, fetched).ok());
}

}  // namespace
}  // namespace tessera::dispatch
