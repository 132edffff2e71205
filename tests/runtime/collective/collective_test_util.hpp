// collective_test_util.hpp: threads-as-ranks helpers and independent expected values.
#pragma once


#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "proto/free_port.hpp"
#include "runtime/collective/communicator.hpp"

namespace tessera::collective::testing {

/// A TCP port for a rendezvous store (Note [Ports outside the ephemeral range]).
inline int free_port() {
  Result<uint16_t> port = proto::pick_free_port("0.0.0.0");
  EXPECT_TRUE(port.ok()) << port.status().to_string();
  return port.ok() ? *port : 0;
}

/// Runs fn(rank) on `n` threads and joins them.
inline void run_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

/// Options for rank `rank` of a world of `n` on `backend`, rendezvousing at a fresh key/port.
inline CommunicatorOptions world_options(const std::string& backend, int rank, int n, int port,
                                         const std::string& key) {
  CommunicatorOptions o;
  o.backend = backend;
  o.rank = rank;
  o.world_size = n;
  o.master_addr = "127.0.0.1";
  o.master_port = port;
  o.gloo_hostname = "127.0.0.1";
  o.inproc_key = key;
  o.timeout = std::chrono::milliseconds(20000);
  return o;
}

/// A unique rendezvous key per call (inproc groups are process-wide).
inline std::string fresh_key(const std::string& base) {
  static std::atomic<int> counter{0};
  return base + "#" + std::to_string(counter++);
}

/// Creates one communicator per thread for a world of `n`, runs body(rank, comm) on each.
inline void with_world(const std::string& backend, int n,
                       const std::function<void(int, Communicator&)>& body) {
  int port = backend == "inproc" ? 0 : free_port();
  std::string key = fresh_key(::testing::UnitTest::GetInstance()->current_test_info()->name());
  run_ranks(n, [&](int rank) {
    auto comm = make_communicator(world_options(backend, rank, n, port, key));
    ASSERT_TRUE(comm.ok()) << comm.status().to_string();
    body(rank, **comm);
  });
}

/// Rank r's test input: element i = (r + 1) * 10 + i * (r % 2 == 0 ? 1 : -1), integer-valued, so
/// every sum and average in these tests is exact in fp32.
inline std::vector<double> rank_values(int rank, int64_t n) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = (rank + 1) * 10.0 + static_cast<double>(i) * (rank % 2 == 0 ? 1 : -1);
  return v;
}

inline at::Tensor to_tensor(const std::vector<double>& v, at::ScalarType dtype = at::kFloat) {
  return at::tensor(v, at::kDouble).to(dtype);
}

inline std::vector<double> to_vector(const at::Tensor& t) {
  at::Tensor d = t.to(at::kDouble).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

}  // namespace tessera::collective::testing
