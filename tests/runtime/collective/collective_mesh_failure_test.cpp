// DeviceMesh layout and sub-group collectives; timeouts, mismatches and the broken state.
// Timeouts are exercised through the timeout mechanism itself: a rank that never joins.
#include <torch/torch.h>

#include "runtime/collective/communicator.hpp"
#include "runtime/collective/device_mesh.hpp"
#include "tests/runtime/collective/collective_test_util.hpp"

namespace tessera::collective {
namespace {

using testing::with_world;
using std::chrono::milliseconds;

bool contains(const Status& st, const std::string& text) {
  return st.message().find(text) != std::string::npos;
}

class Mesh2x2 : public ::testing::TestWithParam<std::string> {};

TEST_P(Mesh2x2, CoordinatesMembersAndSubgroupOps) {
  with_world(GetParam(), 4, [&](int rank, Communicator& world) {
    auto mesh = DeviceMesh::for_fsdp(
        std::shared_ptr<Communicator>(&world, [](Communicator*) {}), /*fsdp_size=*/2);
    ASSERT_TRUE(mesh.ok()) << mesh.status().to_string();
    EXPECT_EQ(mesh->dim_names(), (std::vector<std::string>{"ddp", "fsdp"}));
    EXPECT_EQ(mesh->to_string(), "(ddp=2, fsdp=2)");
    int ddp = rank / 2, fsdp = rank % 2;
    EXPECT_EQ(mesh->coordinate(0), ddp);
    EXPECT_EQ(mesh->coordinate(1), fsdp);
    EXPECT_EQ(mesh->group_members(1), (std::vector<int>{2 * ddp, 2 * ddp + 1}));
    EXPECT_EQ(mesh->group_members(0), (std::vector<int>{fsdp, fsdp + 2}));
    auto fsdp_group = *mesh->group("fsdp");
    auto ddp_group = *mesh->group("ddp");
    EXPECT_EQ(fsdp_group->rank(), fsdp);
    EXPECT_EQ(ddp_group->rank(), ddp);
    EXPECT_EQ(fsdp_group->group_name(), "fsdp");
    // Sum of world ranks over my row, then over my column.
    at::Tensor t = at::full({5}, static_cast<float>(rank));
    ASSERT_TRUE(fsdp_group->all_reduce(t, ReduceOp::sum).ok());
    EXPECT_EQ(t[0].item<float>(), 2 * ddp * 2 + 1);
    at::Tensor u = at::full({5}, static_cast<float>(rank));
    ASSERT_TRUE(ddp_group->all_reduce(u, ReduceOp::sum).ok());
    EXPECT_EQ(u[0].item<float>(), 2 * fsdp + 2);
    // all_gather along fsdp yields the world ranks of my row.
    at::Tensor g = at::empty({2}, at::kLong);
    ASSERT_TRUE(fsdp_group->all_gather(at::full({1}, rank, at::kLong), g).ok());
    EXPECT_EQ(g[0].item<int64_t>(), 2 * ddp);
    EXPECT_EQ(g[1].item<int64_t>(), 2 * ddp + 1);
    EXPECT_FALSE(mesh->group("tp").ok());
    ASSERT_TRUE(world.barrier().ok());  // the world still works beside its sub-groups
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, Mesh2x2, ::testing::Values("inproc", "gloo"));

TEST(DeviceMesh, OneDimensionalWhenFsdpSizeCoversTheWorld) {
  with_world("inproc", 2, [&](int rank, Communicator& world) {
    auto handle = std::shared_ptr<Communicator>(&world, [](Communicator*) {});
    for (int fsdp_size : {-1, 2, 5}) {
      auto mesh = DeviceMesh::for_fsdp(handle, fsdp_size);
      ASSERT_TRUE(mesh.ok()) << mesh.status().to_string();
      EXPECT_EQ(mesh->dim_names(), std::vector<std::string>{"fsdp"});
      EXPECT_EQ(mesh->group(0)->size(), 2);
      EXPECT_EQ(mesh->group(0), handle);  // the world itself: no second communicator over its ranks
      EXPECT_EQ(mesh->group_members(0), (std::vector<int>{0, 1}));
      EXPECT_EQ(mesh->coordinate(0), rank);
    }
  });
}

TEST(DeviceMesh, BadFactorisationsNameTheSizes) {
  with_world("inproc", 6, [&](int, Communicator& world) {
    auto handle = std::shared_ptr<Communicator>(&world, [](Communicator*) {});
    auto mesh = DeviceMesh::for_fsdp(handle, 4);
    ASSERT_FALSE(mesh.ok());
    EXPECT_EQ(mesh.status().code(), ErrorCode::invalid_argument);
    EXPECT_TRUE(contains(mesh.status(), "world size 6 is not divisible by fsdp_size 4"))
        << mesh.status().message();
    mesh = DeviceMesh::for_fsdp(handle, 0);
    EXPECT_TRUE(contains(mesh.status(), "fsdp_size 0 is invalid")) << mesh.status().message();
    mesh = DeviceMesh::create(handle, {"ddp", "fsdp"}, {2, 4});
    EXPECT_TRUE(contains(mesh.status(), "shape 2x4 has 8 ranks but the world size is 6"))
        << mesh.status().message();
    mesh = DeviceMesh::create(handle, {"a", "b", "c"}, {1, 2, 3});
    EXPECT_TRUE(contains(mesh.status(), "needs 1 or 2 dimensions")) << mesh.status().message();
    EXPECT_FALSE(world.broken());
  });
}

TEST(Timeout, InprocRankThatNeverJoinsAnOpIsNamed) {
  with_world("inproc", 2, [&](int rank, Communicator& c) {
    if (rank == 1) return;  // rank 1 never calls all_gather
    Status st = c.all_gather(at::ones({4}), at::empty({8}), {milliseconds(300)});
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), ErrorCode::timeout);
    EXPECT_EQ(st.message(), "all_gather (rank 0 of 2, group world): peer rank 1 timed out after 300 ms");
    EXPECT_TRUE(c.broken());
    Status again = c.barrier();
    EXPECT_EQ(again.code(), ErrorCode::unavailable);
    EXPECT_TRUE(contains(again, "barrier (rank 0 of 2, group world): group is broken by an earlier "
                                "failure: all_gather"))
        << again.message();
  });
}

TEST(Timeout, InprocRendezvousNamesTheMissingRank) {
  auto opts = testing::world_options("inproc", 0, 3, 0, testing::fresh_key("rdv"));
  opts.timeout = milliseconds(300);
  auto c = make_communicator(opts);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), ErrorCode::timeout);
  EXPECT_EQ(c.status().message(),
            "rendezvous (rank 0 of 3, group world): peer ranks 1,2 timed out after 300 ms");
}

TEST(Timeout, InprocRecvWithoutSender) {
  with_world("inproc", 2, [&](int rank, Communicator& c) {
    if (rank == 0) return;
    Status st = c.recv(at::empty({2}), 0, {milliseconds(300)});
    EXPECT_EQ(st.message(),
              "recv (rank 1 of 2, group world): peer rank 0 timed out after 300 ms (no message sent)");
  });
}

TEST(Timeout, GlooRendezvousNamesTheMissingRank) {
  auto opts = testing::world_options("gloo", 0, 2, testing::free_port(), "");
  opts.timeout = milliseconds(300);
  auto c = make_communicator(opts);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), ErrorCode::timeout) << c.status().to_string();
  EXPECT_EQ(c.status().message(),
            "rendezvous (rank 0 of 2, group world): peer rank 1 did not join within 300 ms");
}

TEST(Timeout, GlooRankThatNeverJoinsAnOpIsNamed) {
  int port = testing::free_port();
  std::vector<std::shared_ptr<Communicator>> comms(2);
  testing::run_ranks(2, [&](int rank) {
    auto c = make_communicator(testing::world_options("gloo", rank, 2, port, ""));
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    comms[rank] = *c;
  });
  ASSERT_TRUE(comms[0] && comms[1]);
  Status st = comms[0]->all_gather(at::ones({4}), at::empty({8}), {milliseconds(300)});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ErrorCode::timeout) << st.to_string();
  EXPECT_TRUE(contains(st, "all_gather (rank 0 of 2, group world): peer rank 1 timed out after 300 ms"))
      << st.message();
  EXPECT_TRUE(comms[0]->broken());
  comms[1].reset();  // closing rank 1's connections ends rank 0's pending Gloo op promptly
  comms[0].reset();
}

TEST(Mismatch, DifferentOpsOnDifferentRanksAreReported) {
  with_world("inproc", 2, [&](int rank, Communicator& c) {
    at::Tensor t = at::ones({4});
    Status st = rank == 0 ? c.all_reduce(t, ReduceOp::sum) : c.broadcast(t, 0);
    ASSERT_FALSE(st.ok());
    if (rank == 0) {
      EXPECT_TRUE(contains(st, "rank 1 called broadcast while this rank called all_reduce"))
          << st.message();
    }
    at::Tensor small = at::ones({rank + 1});
    EXPECT_FALSE(c.all_reduce(small, ReduceOp::sum).ok());  // broken by the mismatch
  });
}

TEST(Mismatch, DifferentSizesAreReported) {
  with_world("inproc", 2, [&](int rank, Communicator& c) {
    Status st = c.all_reduce(at::ones({rank + 2}), ReduceOp::sum);
    ASSERT_FALSE(st.ok());
    EXPECT_TRUE(contains(st, fmt::format("rank {} passed {} elements", 1 - rank, 3 - rank)))
        << st.message();
  });
}

}  // namespace
}  // namespace tessera::collective
