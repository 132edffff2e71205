// Note [Mapped-memory caps]: the landing pool and the peer-mapping cache never hold more than
// their configured bytes (checked through their own counters, not through timing).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <unistd.h>

#include <cstring>

#include "runtime/data_plane.hpp"
#include "runtime/internal/shm_pool.hpp"

namespace tessera::runtime {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

using internal::Landing;
using internal::MappingCache;
using internal::ShmPool;

TEST(ShmCaps, DefaultsHoldA256MiBFrameAndStayBounded) {
  DataPlaneConfig d;
  // A 256 MiB payload's frame lands in a segment of 258 MiB (2 MiB granules + header).
  EXPECT_GE(d.landing_idle_bytes, 258 * kMiB);
  EXPECT_GE(d.peer_mapping_bytes, 258 * kMiB);
  EXPECT_LE(d.landing_idle_bytes + d.peer_mapping_bytes, uint64_t{1} << 30);
}

TEST(ShmCaps, IdleLandingSegmentsBeyondTheCapAreDestroyed) {
  ShmPool pool(4 * kMiB);  // room for two idle 2 MiB segments
  std::vector<Landing> leased;
  for (int i = 0; i < 3; ++i) {
    auto l = pool.acquire(kMiB);
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    leased.push_back(std::move(l).value());
  }
  EXPECT_EQ(pool.stats().created, 3u);
  EXPECT_EQ(pool.stats().idle_segments, 0u);
  leased.clear();  // all three come back: the third does not fit
  internal::ShmPoolStats s = pool.stats();
  EXPECT_EQ(s.idle_segments, 2u);
  EXPECT_EQ(s.idle_bytes, 4 * kMiB);
  EXPECT_EQ(s.destroyed, 1u);
  auto again = pool.acquire(kMiB);  // served from the idle ones
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(pool.stats().created, 3u);
  EXPECT_EQ(pool.stats().idle_segments, 1u);
}

TEST(ShmCaps, APoolWithNoIdleBudgetKeepsNothing) {
  ShmPool pool(0);
  {
    auto l = pool.acquire(kMiB);
    ASSERT_TRUE(l.ok());
  }
  internal::ShmPoolStats s = pool.stats();
  EXPECT_EQ(s.idle_bytes, 0u);
  EXPECT_EQ(s.created, 1u);
  EXPECT_EQ(s.destroyed, 1u);
}

// A sealed memfd of `bytes` (from a pool with no idle budget); `keep` holds it alive.
int sealed_fd(ShmPool& pool, uint64_t bytes, std::vector<Landing>& keep) {
  auto l = pool.acquire(bytes);
  EXPECT_TRUE(l.ok());
  keep.push_back(std::move(l).value());
  return ::dup(keep.back().fd);  // MappingCache::map closes what it is given
}

TEST(ShmCaps, PeerMappingsBeyondTheCapAreEvictedLeastRecentFirst) {
  ShmPool source(0);
  std::vector<Landing> keep;
  MappingCache cache(4 * kMiB);
  std::vector<std::shared_ptr<MappingCache::Mapping>> held;
  for (int i = 0; i < 3; ++i) {
    auto m = cache.map(sealed_fd(source, 2 * kMiB, keep), 2 * kMiB);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    held.push_back(std::move(m).value());
  }
  internal::MappingCacheStats s = cache.stats();
  EXPECT_EQ(s.mapped_bytes, 4 * kMiB);
  EXPECT_EQ(s.mappings, 2u);
  EXPECT_EQ(s.evicted, 1u);
  std::memset(held[0]->addr, 7, 2 * kMiB);  // evicted, but mapped while its holder lives
  EXPECT_EQ(keep[0].buffer->data()[2 * kMiB - 1], 7);
  // The most recent (third) one is still cached: mapping it again adds nothing.
  auto again = cache.map(::dup(keep[2].fd), 2 * kMiB);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->get(), held[2].get());
  EXPECT_EQ(cache.stats().evicted, 1u);
}

TEST(ShmCaps, ASegmentBiggerThanTheWholeCapIsNotCached) {
  ShmPool source(0);
  std::vector<Landing> keep;
  MappingCache cache(kMiB);
  auto m = cache.map(sealed_fd(source, 2 * kMiB, keep), 2 * kMiB);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(cache.stats().mapped_bytes, 0u);
  EXPECT_EQ(cache.stats().mappings, 0u);
  std::memset((*m)->addr, 3, 2 * kMiB);  // still usable for the transfer at hand
  EXPECT_EQ(keep[0].buffer->data()[0], 3);
}

std::unique_ptr<DataPlane> start_capped(uint64_t cap) {
  DataPlaneConfig c;
  c.landing_idle_bytes = cap;
  c.peer_mapping_bytes = cap;
  auto dp = DataPlane::start(c);
  EXPECT_TRUE(dp.ok()) << dp.status().to_string();
  return std::move(dp).value();
}

TEST(ShmCaps, SameHostFetchesHonourTheConfiguredCaps) {
  auto owner = start_capped(3 * kMiB);   // one 2 MiB segment fits, two do not
  auto reader = start_capped(3 * kMiB);
  std::vector<proto::DataProto> inputs;
  std::vector<proto::DataProto> held;
  for (int i = 0; i < 3; ++i) {  // 1 MiB each, all held at once: three landing segments
    auto x = torch::full({4096, 64}, static_cast<float>(i), torch::kFloat32);
    inputs.push_back(*proto::DataProto::from_dict({{"x", x}}));
    auto out = reader->fetch(DataPlane::whole(owner->publish(inputs.back(), 1)), true);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    held.push_back(std::move(out).value());
  }
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(*held[i].tensor("x"), *inputs[i].tensor("x")));
  EXPECT_EQ(owner->stats().served_tcp_bytes, 0u);  // all through shared memory
  DataPlaneStats o = owner->stats();
  EXPECT_LE(o.peer_mapped_bytes, 3 * kMiB);
  EXPECT_EQ(o.peer_mappings, 1u);
  EXPECT_EQ(o.peer_mappings_evicted, 2u);
  held.clear();  // the three segments return to a pool with room for one
  DataPlaneStats r = reader->stats();
  EXPECT_EQ(r.landing_segments_created, 3u);
  EXPECT_EQ(r.landing_idle_segments, 1u);
  EXPECT_LE(r.landing_idle_bytes, 3 * kMiB);
  EXPECT_EQ(r.landing_segments_destroyed, 2u);
}

}  // namespace
}  // namespace tessera::runtime
