// all_to_all_v and all_gather_bytes (exchange.hpp) on the in-process and Gloo backends: every rank
// receives exactly what each peer addressed to it, with uneven and empty entries, and payloads
// large enough that a send cannot complete before its matching recv (the pairwise schedule).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "runtime/collective/exchange.hpp"
#include "tests/runtime/collective/collective_test_util.hpp"

namespace tessera::collective {
namespace {

using testing::with_world;

// What rank `src` sends to rank `dst`: (src*7 + dst*3) % 5 * scale elements (some are empty),
// valued src*1000 + dst*100 + index, so a misplaced element is visible.
int64_t count(int src, int dst, int64_t scale) { return (src * 7 + dst * 3) % 5 * scale; }
at::Tensor payload(int src, int dst, int64_t scale) {
  return at::arange(count(src, dst, scale), at::kFloat).fmod(100) + src * 1000 + dst * 100;
}

class ExchangeTest : public ::testing::TestWithParam<std::tuple<std::string, int, int64_t>> {};

TEST_P(ExchangeTest, AllToAllVDeliversEveryPeersEntry) {
  const auto [backend, n, scale] = GetParam();
  with_world(backend, n, [&, n = n, scale = scale](int rank, Communicator& comm) {
    std::vector<at::Tensor> send, recv;
    for (int p = 0; p < n; ++p) {
      send.push_back(payload(rank, p, scale));
      recv.push_back(at::full({count(p, rank, scale)}, -1.0f));
    }
    Status st = all_to_all_v(comm, send, recv);
    ASSERT_TRUE(st.ok()) << st.to_string();
    for (int p = 0; p < n; ++p) EXPECT_TRUE(at::equal(recv[p], payload(p, rank, scale))) << "from rank " << p;
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, ExchangeTest,
                         ::testing::Values(std::make_tuple(std::string("inproc"), 3, int64_t{3}),
                                           std::make_tuple(std::string("inproc"), 4, int64_t{1}),
                                           std::make_tuple(std::string("gloo"), 3, int64_t{200000})));

TEST(Exchange, AllToAllVRejectsWrongEntryCountsBeforeMovingBytes) {
  with_world("inproc", 2, [&](int rank, Communicator& comm) {
    Status st = all_to_all_v(comm, {at::zeros({1})}, {at::zeros({1}), at::zeros({1})});
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("1 send and 2 recv"), std::string::npos) << st.to_string();
    // The communicator is still usable.
    at::Tensor t = at::full({1}, static_cast<float>(rank));
    ASSERT_TRUE(comm.all_reduce(t, ReduceOp::sum).ok());
    EXPECT_EQ(t.item<float>(), 1.0f);
  });
}

TEST(Exchange, AllGatherBytesReturnsEachRanksBytesInRankOrder) {
  with_world("inproc", 3, [&](int rank, Communicator& comm) {
    at::Tensor mine = at::full({rank * 5}, static_cast<uint8_t>(rank + 1), at::kByte);  // rank 0 sends nothing
    auto all = all_gather_bytes(comm, mine);
    ASSERT_TRUE(all.ok()) << all.status().to_string();
    ASSERT_EQ(all->size(), 3u);
    for (int r = 0; r < 3; ++r) {
      EXPECT_TRUE(at::equal((*all)[r], at::full({r * 5}, static_cast<uint8_t>(r + 1), at::kByte))) << r;
    }
  });
}

}  // namespace
}  // namespace tessera::collective
