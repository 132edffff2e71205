#include <gtest/gtest.h>

#include "runtime/resource_pool.hpp"

namespace tessera::runtime {
namespace {

TEST(ResourcePool, RanksAreSortedByHostThenDevice) {
  std::vector<NodeDevices> nodes = {
      {"node-b", "10.0.0.2:7700", {"cuda:10", "cuda:2", "cuda:0"}},
      {"node-a", "10.0.0.1:7700", {"cuda:1", "cuda:0"}},
  };
  auto pool = ResourcePool::make(nodes);
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  ASSERT_EQ(pool->world_size(), 5);
  std::vector<std::string> got;
  for (const auto& p : pool->placements()) {
    got.push_back(pool->nodes()[p.node].host + "/" + p.device + "/" + std::to_string(p.local_rank));
  }
  EXPECT_EQ(got, (std::vector<std::string>{"node-a/cuda:0/0", "node-a/cuda:1/1", "node-b/cuda:0/0",
                                           "node-b/cuda:2/1", "node-b/cuda:10/2"}));
  // The same cluster listed in another order gives the same ranks (stable across restarts).
  std::reverse(nodes.begin(), nodes.end());
  auto again = ResourcePool::make(nodes);
  for (int r = 0; r < 5; ++r) {
    EXPECT_EQ(again->placements()[r].device, pool->placements()[r].device);
    EXPECT_EQ(again->nodes()[again->placements()[r].node].host,
              pool->nodes()[pool->placements()[r].node].host);
  }
}

TEST(ResourcePool, ProcessOnNodesTakesTheFirstDevices) {
  auto pool = ResourcePool::make({{"a", "a:1", {"cpu:0", "cpu:1", "cpu:2"}}, {"b", "b:1", {"cpu:0"}}},
                                 {2, 1});
  ASSERT_TRUE(pool.ok());
  ASSERT_EQ(pool->world_size(), 3);
  EXPECT_EQ(pool->placements()[1].device, "cpu:1");
  EXPECT_EQ(pool->placements()[1].local_world_size, 2);
  EXPECT_EQ(pool->placements()[2].rank, 2);
  EXPECT_FALSE(ResourcePool::make({{"a", "a:1", {"cpu:0"}}}, {2}).ok());
  EXPECT_FALSE(ResourcePool::make({{"a", "a:1", {"cpu:0"}}}, {1, 1}).ok());
  EXPECT_FALSE(ResourcePool::make({{"a", "a:1", {"cpu:0", "cpu:0"}}}).ok());
  EXPECT_FALSE(ResourcePool::make({}).ok());
}

}  // namespace
}  // namespace tessera::runtime
