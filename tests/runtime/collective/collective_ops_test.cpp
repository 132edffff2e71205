// Every collective on the in-process and Gloo backends (threads as ranks; Gloo through a real
// TCPStore on 127.0.0.1) at world sizes 1, 2 and 4, against expected values computed here with
// plain loops; then Gloo against in-process on non-integer data.
#include <torch/torch.h>

#include <algorithm>

#include "runtime/collective/communicator.hpp"
#include "tests/runtime/collective/collective_test_util.hpp"

namespace tessera::collective {
namespace {

using testing::rank_values;
using testing::to_tensor;
using testing::to_vector;
using testing::with_world;

constexpr int64_t kChunk = 6;  // elements per rank chunk

struct Param {
  std::string backend;
  int world;
};

class CollectiveOps : public ::testing::TestWithParam<Param> {};

std::vector<double> expected_reduce(int world, int64_t offset, int64_t n, ReduceOp op) {
  std::vector<double> out(n, op == ReduceOp::max ? -1e300 : 0.0);
  for (int r = 0; r < world; ++r) {
    std::vector<double> v = rank_values(r, offset + n);
    for (int64_t i = 0; i < n; ++i) {
      double x = v[offset + i];
      out[i] = op == ReduceOp::max ? std::max(out[i], x) : out[i] + x;
    }
  }
  if (op == ReduceOp::avg) for (double& x : out) x /= world;
  return out;
}

TEST_P(CollectiveOps, AllGather) {
  auto [backend, world] = GetParam();
  with_world(backend, world, [&](int rank, Communicator& c) {
    at::Tensor in = to_tensor(rank_values(rank, kChunk));
    at::Tensor out = at::full({world * kChunk}, -1.0f);
    ASSERT_TRUE(c.all_gather(in, out).ok());
    std::vector<double> expected;
    for (int r = 0; r < world; ++r) {
      auto v = rank_values(r, kChunk);
      expected.insert(expected.end(), v.begin(), v.end());
    }
    EXPECT_EQ(to_vector(out), expected) << "rank " << rank;
  });
}

TEST_P(CollectiveOps, AllGatherInPlaceFromViewOfOutput) {
  auto [backend, world] = GetParam();
  with_world(backend, world, [&](int rank, Communicator& c) {
    at::Tensor out = at::zeros({world * kChunk}, at::kFloat);
    out.narrow(0, rank * kChunk, kChunk).copy_(to_tensor(rank_values(rank, kChunk)));
    ASSERT_TRUE(c.all_gather(out.narrow(0, rank * kChunk, kChunk), out).ok());
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(to_vector(out.narrow(0, r * kChunk, kChunk)), rank_values(r, kChunk));
    }
  });
}

TEST_P(CollectiveOps, ReduceScatterSumAvgMax) {
  auto [backend, world] = GetParam();
  with_world(backend, world, [&](int rank, Communicator& c) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
      at::Tensor in = to_tensor(rank_values(rank, world * kChunk));
      at::Tensor out = at::empty({kChunk}, at::kFloat);
      ASSERT_TRUE(c.reduce_scatter(in, out, op).ok()) << to_string(op);
      EXPECT_EQ(to_vector(out), expected_reduce(world, rank * kChunk, kChunk, op))
          << to_string(op) << " rank " << rank;
    }
  });
}

TEST_P(CollectiveOps, AllReduceSumAvgMax) {
  auto [backend, world] = GetParam();
  with_world(backend, world, [&](int rank, Communicator& c) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
      at::Tensor t = to_tensor(rank_values(rank, kChunk));
      ASSERT_TRUE(c.all_reduce(t, op).ok()) << to_string(op);
      EXPECT_EQ(to_vector(t), expected_reduce(world, 0, kChunk, op)) << to_string(op);
    }
  });
}

TEST_P(CollectiveOps, AllReduceBFloat16AccumulatesInFp32) {
  auto [backend, world] = GetParam();
  with_world(backend, world, [&](int rank, Communicator& c) {
    at::Tensor t = to_tensor(rank_values(rank, kChunk), at::kBFloat16);
    ASSERT_TRUE(c.all_reduce(t, ReduceOp::sum).ok());
    EXPECT_EQ(t.scalar_type(), at::kBFloat16);
    std::vector<double> expected = expected_reduce(world, 0, kChunk, ReduceOp::sum);
    EXPECT_EQ(to_vector(t), to_vector(to_tensor(expected, at::kBFloat16)));
  });
}

TEST_P(CollectiveOps, BroadcastFromLastRank) {
  auto [backend, world] = GetParam();
  int root = world - 1;
  with_world(backend, world, [&](int rank, Communicator& c) {
    at::Tensor t = to_tensor(rank_values(rank, kChunk), at::kLong);
    ASSERT_TRUE(c.broadcast(t, root).ok());
    EXPECT_EQ(to_vector(t), rank_values(root, kChunk));
  });
}

TEST_P(CollectiveOps, BarrierAndRingSendRecv) {
  auto [backend, world] = GetParam();
  with_world(backend, world, [&](int rank, Communicator& c) {
    ASSERT_TRUE(c.barrier().ok());
    if (world == 1) return;
    int next = (rank + 1) % world, prev = (rank + world - 1) % world;
    at::Tensor received = at::empty({kChunk}, at::kFloat);
    // Even ranks send first, odd ranks receive first: no deadlock with rendezvous sends either.
    if (rank % 2 == 0) {
      ASSERT_TRUE(c.send(to_tensor(rank_values(rank, kChunk)), next).ok());
      ASSERT_TRUE(c.recv(received, prev).ok());
    } else {
      ASSERT_TRUE(c.recv(received, prev).ok());
      ASSERT_TRUE(c.send(to_tensor(rank_values(rank, kChunk)), next).ok());
    }
    EXPECT_EQ(to_vector(received), rank_values(prev, kChunk));
  });
}

TEST_P(CollectiveOps, BadArgumentsAreReportedWithoutBreakingTheGroup) {
  auto [backend, world] = GetParam();
  with_world(backend, world, [&](int rank, Communicator& c) {
    at::Tensor in = at::ones({kChunk});
    Status st = c.all_gather(in, at::empty({world * kChunk + 1}));
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), ErrorCode::invalid_argument);
    EXPECT_NE(st.message().find(fmt::format("all_gather (rank {} of {}, group world)", rank, world)),
              std::string::npos) << st.message();
    st = c.all_reduce(at::ones({4}, at::kLong), ReduceOp::avg);
    EXPECT_NE(st.message().find("avg needs a floating dtype"), std::string::npos) << st.message();
    st = c.broadcast(in, world);
    EXPECT_EQ(st.code(), ErrorCode::out_of_range) << st.message();
    st = c.all_reduce(at::ones({4, 4}).t(), ReduceOp::sum);
    EXPECT_NE(st.message().find("contiguous"), std::string::npos) << st.message();
    EXPECT_FALSE(c.broken());
    at::Tensor t = at::full({3}, static_cast<float>(rank));
    ASSERT_TRUE(c.all_reduce(t, ReduceOp::sum).ok());  // still usable
    EXPECT_EQ(t[0].item<float>(), world * (world - 1) / 2.0f);
  });
}

// Note [Deferred collectives]: a started all-gather or reduce-scatter gives the blocking call's
// numbers once waited for, several may be in flight at once, wait() is idempotent, a destroyed
// handle waits by itself, and bad arguments are the start call's error.
TEST_P(CollectiveOps, StartedCollectivesEqualBlockingOnes) {
  auto [backend, world] = GetParam();
  with_world(backend, world, [&](int rank, Communicator& c) {
    at::Tensor in = to_tensor(rank_values(rank, kChunk));
    at::Tensor gathered = at::full({world * kChunk}, -1.0f), want_gathered = at::full({world * kChunk}, -1.0f);
    at::Tensor grads = to_tensor(rank_values(rank, world * kChunk));
    at::Tensor reduced = at::empty({kChunk}, at::kFloat), want_reduced = at::empty({kChunk}, at::kFloat);
    ASSERT_TRUE(c.all_gather(in, want_gathered).ok());
    ASSERT_TRUE(c.reduce_scatter(grads, want_reduced, ReduceOp::avg).ok());
    auto gather = c.start_all_gather(in, gathered);
    ASSERT_TRUE(gather.ok()) << gather.status().to_string();
    auto reduce = c.start_reduce_scatter(grads, reduced, ReduceOp::avg);
    ASSERT_TRUE(reduce.ok()) << reduce.status().to_string();
    ASSERT_TRUE(reduce->wait().ok());
    ASSERT_TRUE(gather->wait().ok());
    EXPECT_FALSE(gather->pending());
    EXPECT_TRUE(gather->wait().ok());  // idempotent
    EXPECT_TRUE(at::equal(gathered, want_gathered)) << "rank " << rank;
    EXPECT_TRUE(at::equal(reduced, want_reduced)) << "rank " << rank;
    {
      auto dropped = c.start_all_gather(in, gathered);  // destroyed unwaited: waits by itself
      ASSERT_TRUE(dropped.ok());
    }
    EXPECT_TRUE(at::equal(gathered, want_gathered)) << "rank " << rank;
    auto bad = c.start_reduce_scatter(grads, at::empty({kChunk + 1}), ReduceOp::sum);
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), ErrorCode::invalid_argument);
    EXPECT_NE(bad.status().message().find("reduce_scatter (rank"), std::string::npos) << bad.status().message();
    EXPECT_FALSE(c.broken());
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, CollectiveOps,
                         ::testing::Values(Param{"inproc", 1}, Param{"inproc", 2},
                                           Param{"inproc", 4}, Param{"gloo", 1}, Param{"gloo", 2},
                                           Param{"gloo", 4}),
                         [](const auto& info) {
                           return info.param.backend + "_world" + std::to_string(info.param.world);
                         });

// Gloo and in-process give the same numbers on random (non-integer) data.
TEST(GlooVsInproc, SameResultsOnRandomData) {
  constexpr int kWorld = 4;
  auto run = [&](const std::string& backend) {
    std::vector<std::vector<at::Tensor>> results(kWorld);
    with_world(backend, kWorld, [&](int rank, Communicator& c) {
      at::Tensor base = at::randn({kWorld * 1000}, at::Generator(at::detail::createCPUGenerator(7 + rank)));
      at::Tensor rs = at::empty({1000});
      ASSERT_TRUE(c.reduce_scatter(base, rs, ReduceOp::avg).ok());
      at::Tensor ar = base.clone();
      ASSERT_TRUE(c.all_reduce(ar, ReduceOp::sum).ok());
      at::Tensor ag = at::empty({kWorld * kWorld * 1000});
      ASSERT_TRUE(c.all_gather(base, ag).ok());
      at::Tensor bf = base.to(at::kBFloat16);
      at::Tensor bf_rs = at::empty({1000}, at::kBFloat16);
      ASSERT_TRUE(c.reduce_scatter(bf, bf_rs, ReduceOp::sum).ok());
      results[rank] = {rs, ar, ag, bf_rs};
    });
    return results;
  };
  auto inproc = run("inproc");
  auto gloo = run("gloo");
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(at::equal(inproc[r][0], gloo[r][0])) << "reduce_scatter avg, rank " << r;
    // Gloo's ring all_reduce sums in its own order: equal up to fp32 rounding.
    EXPECT_TRUE(at::allclose(inproc[r][1], gloo[r][1], /*rtol=*/1e-6, /*atol=*/1e-6)) << r;
    EXPECT_TRUE(at::equal(inproc[r][2], gloo[r][2])) << "all_gather, rank " << r;
    EXPECT_TRUE(at::equal(inproc[r][3], gloo[r][3])) << "bf16 reduce_scatter, rank " << r;
  }
}

TEST(Factory, UnknownAndUnbuiltBackendsAreErrors) {
  CommunicatorOptions o;
  o.backend = "mpi";
  auto c = make_communicator(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), ErrorCode::invalid_argument);
  EXPECT_NE(c.status().message().find("unknown backend 'mpi'"), std::string::npos);
  EXPECT_NE(c.status().message().find("gloo"), std::string::npos);  // lists what is available
  o.backend = "nccl";
#ifndef TESSERA_WITH_CUDA
  c = make_communicator(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), ErrorCode::unimplemented) << c.status().to_string();
#endif
  o.backend = "inproc";
  o.rank = 3;
  o.world_size = 2;
  c = make_communicator(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), ErrorCode::out_of_range) << c.status().to_string();
}

}  // namespace
}  // namespace tessera::collective
