// Note [Local lanes] and Note [In-process values]: the polling hand-off to in-process workers
// keeps every caller's order, fails what a terminating worker still held, and in-process calls
// move DataProtos by reference (nothing published on the data plane).
#include <gtest/gtest.h>

#include <thread>

#include <torch/torch.h>

#include "runtime/call_hub.hpp"
#include "runtime/local_lane.hpp"
#include "runtime/runtime.hpp"
#include "runtime/wire.hpp"
#include "tests/runtime/test_workers.hpp"

namespace tessera::runtime {
namespace {

using internal::LocalLane;
using std::chrono::microseconds;

// A call answering target `i` of `batch`, carrying `i` as its method name.
std::shared_ptr<LocalCall> make_call(const std::shared_ptr<CallBatch>& batch, size_t i) {
  auto call = std::make_shared<LocalCall>();
  call->request.method = std::to_string(i);
  call->slot = std::make_shared<ReplySlot>(batch, i);
  return call;
}

std::shared_ptr<CallBatch> make_batch(size_t n) {
  return std::make_shared<CallBatch>(std::vector<std::string>(n, "target"),
                                     std::chrono::steady_clock::time_point::max());
}

// Spins until `lane` polls (the worker thread has started polling).
void await_polling(const LocalLane& lane) {
  while (!lane.polling()) std::this_thread::yield();
}

TEST(LocalLane, AMailedCallKeepsTheWorkerOffTheLaneUntilTaken) {
  LocalLane lane(microseconds(1000000));
  auto batch = make_batch(1);
  auto call = make_call(batch, 0);
  EXPECT_FALSE(lane.try_hand_off(call));  // not polling: the caller mails it
  ASSERT_NE(call, nullptr);               // and still owns it
  int handled = 0;
  lane.poll([&](LocalCall&) { ++handled; });  // a mailed call is pending: returns at once
  EXPECT_FALSE(lane.polling());
  EXPECT_EQ(handled, 0);
}

TEST(LocalLane, HandedOffCallsRunInOrderOnThePollingThread) {
  LocalLane lane(microseconds(100000));
  constexpr size_t kCalls = 200;
  auto batch = make_batch(kCalls);
  std::vector<size_t> order;
  std::thread worker([&] {
    lane.took_mailed();  // (nothing was mailed: must not underflow)
    lane.poll([&](LocalCall& c) {
      order.push_back(std::stoul(c.request.method));
      EXPECT_TRUE(c.slot->set(WireValue{}));
    });
  });
  await_polling(lane);
  // Handed off until the lane refuses one (only if this thread stalled past the 100 ms idle
  // period): the worker then stopped polling, and later calls would be mailed.
  size_t handed = 0;
  for (size_t i = 0; i < kCalls; ++i) {
    auto call = make_call(batch, i);
    if (!lane.try_hand_off(call)) break;
    ++handed;
  }
  worker.join();  // returns after 100 ms without calls
  EXPECT_GT(handed, 0u);
  ASSERT_EQ(order.size(), handed);
  for (size_t i = 0; i < handed; ++i) EXPECT_EQ(order[i], i);
  EXPECT_FALSE(lane.polling());
}

TEST(LocalLane, ClosingFailsTheQueuedCallsAndRefusesLaterOnes) {
  LocalLane lane(microseconds(1000000));
  auto batch = make_batch(3);
  std::mutex gate;
  gate.lock();  // the first call blocks in its handler until the test opens the gate
  std::atomic<bool> first_started{false};
  std::thread worker([&] {
    lane.poll([&](LocalCall& c) {
      first_started = true;
      std::lock_guard<std::mutex> wait(gate);
      EXPECT_TRUE(c.slot->set(WireValue{}));
    });
  });
  await_polling(lane);
  auto first = make_call(batch, 0);
  ASSERT_TRUE(lane.try_hand_off(first));
  while (!first_started) std::this_thread::yield();
  auto queued = make_call(batch, 1);
  ASSERT_TRUE(lane.try_hand_off(queued));  // waits behind the blocked call
  lane.close();                            // the worker terminates
  auto late = make_call(batch, 2);
  EXPECT_FALSE(lane.try_hand_off(late));  // refused: the caller mails it (CAF drops it)
  late.reset();                           // ... which destroys it
  gate.unlock();
  worker.join();
  std::vector<Result<WireValue>> results = batch->wait();
  EXPECT_TRUE(results[0].ok());
  for (size_t i : {1, 2}) {
    EXPECT_EQ(results[i].status().code(), ErrorCode::unavailable);
    EXPECT_NE(results[i].status().message().find("terminated before answering"),
              std::string::npos);
  }
}

TEST(LocalLane, DisabledPollingNeverTakesTheLane) {
  LocalLane lane(microseconds(0));
  int handled = 0;
  lane.poll([&](LocalCall&) { ++handled; });
  EXPECT_FALSE(lane.polling());
  auto batch = make_batch(1);
  auto call = make_call(batch, 0);
  EXPECT_FALSE(lane.try_hand_off(call));
}

// A real detached worker: calls sent back to back without waiting (some mailed, most through
// the lane while the worker polls) arrive in the order sent.
TEST(LocalLane, CallsToARealWorkerKeepTheCallersOrder) {
  RuntimeConfig cfg;
  cfg.embedded_devices = "cpu:1";
  cfg.idle_poll = std::chrono::milliseconds(500);  // wide: the calls below fit in one period
  auto rt = Runtime::start(cfg, testing::test_registry());
  ASSERT_TRUE(rt.ok()) << rt.status().to_string();
  auto workers = (*rt)->spawn_workers("lane", *(*rt)->resource_pool(), {{"", "echo", "{}"}});
  ASSERT_TRUE(workers.ok()) << workers.status().to_string();
  uint64_t lane_before = call_counters().lane_calls;
  // One call answered first: the worker then polls.
  ASSERT_TRUE((*rt)->call(*workers, "log", {{Value(nlohmann::json(-1))}}).ok());
  constexpr int kCalls = 300;
  std::vector<std::shared_ptr<CallBatch>> batches;
  for (int i = 0; i < kCalls; ++i) {
    CallRequest req;
    req.method = "log";
    req.args = {json_wire(i)};
    batches.push_back((*rt)->call_wire(*workers, {req}, CallOptions{}));
  }
  for (auto& b : batches) ASSERT_TRUE(b->wait()[0].ok());
  auto log = (*rt)->call(*workers, "log", {{Value(nlohmann::json(kCalls))}});
  ASSERT_TRUE(log.ok()) << log.status().to_string();
  const nlohmann::json& seen = (*log)[0].json();
  ASSERT_EQ(seen.size(), static_cast<size_t>(kCalls + 2));
  for (int i = 0; i <= kCalls + 1; ++i) EXPECT_EQ(seen[i].get<int>(), i - 1) << "position " << i;
  EXPECT_GT(call_counters().lane_calls, lane_before);  // the lane was used
}

// Note [In-process values]: a blocking DP call to in-process workers publishes nothing.
TEST(InProcessValues, BlockingCallsMoveDataProtosByReference) {
  RuntimeConfig cfg;
  cfg.embedded_devices = "cpu:2";
  auto rt = Runtime::start(cfg, testing::test_registry());
  ASSERT_TRUE(rt.ok()) << rt.status().to_string();
  auto workers = (*rt)->spawn_workers("local", *(*rt)->resource_pool(), {{"", "echo", "{}"}});
  ASSERT_TRUE(workers.ok()) << workers.status().to_string();
  at::Tensor x = torch::arange(8, torch::kFloat32).view({4, 2});
  auto in = *proto::DataProto::from_dict({{"x", x}});
  auto out = (*rt)->call(*workers, "identity", {{Value(*in.slice(0, 2))}, {Value(*in.slice(2, 4))}});
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const at::Tensor* first = (*out)[0].proto().batch().find("x");
  const at::Tensor* second = (*out)[1].proto().batch().find("x");
  ASSERT_TRUE(first != nullptr && second != nullptr);
  EXPECT_TRUE(torch::equal(*first, x.slice(0, 0, 2)));
  EXPECT_TRUE(torch::equal(*second, x.slice(0, 2, 4)));
  // The worker handed back the caller's own tensor memory: nothing was copied or published.
  EXPECT_EQ(second->data_ptr<float>(), x.data_ptr<float>() + 4);
  DataPlaneStats stats = (*rt)->data_plane().stats();
  EXPECT_EQ(stats.local_fetches, 0u);
  EXPECT_EQ(stats.payloads, 0u);
}

TEST(InProcessValues, AReferenceArrivingFromAnotherProcessIsRefused) {
  RuntimeConfig cfg;
  auto rt = Runtime::start(cfg, testing::test_registry());
  ASSERT_TRUE(rt.ok()) << rt.status().to_string();
  WireValue w;  // as deserialised: the kind survives, the pointer does not
  w.kind = static_cast<uint8_t>(WireKind::proto_local);
  Result<Value> v = from_wire(w, (*rt)->data_plane(), true);
  EXPECT_EQ(v.status().code(), ErrorCode::corrupt_data);
  EXPECT_NE(v.status().message().find("another process"), std::string::npos);
}

// to_wire(Value&&) moves the DataProto into an in-process wire value (the caller's tensors,
// by reference); decoding it, consuming or not, leaves the wire value intact.
TEST(InProcessValues, AMovedValueTravelsByReference) {
  RuntimeConfig cfg;
  auto rt = Runtime::start(cfg, testing::test_registry());
  ASSERT_TRUE(rt.ok()) << rt.status().to_string();
  DataPlane& dp = (*rt)->data_plane();
  at::Tensor x = torch::arange(6, torch::kFloat32).view({3, 2});
  auto data = proto::DataProto::from_dict({{"x", x}});
  ASSERT_TRUE(data.ok());
  EncodeOptions local{/*remote=*/false, /*consumers=*/1, /*inline_max_bytes=*/0,
                      /*in_process=*/true};
  Value original(*data);
  Result<WireValue> w = to_wire(std::move(original), dp, local);
  ASSERT_TRUE(w.ok());
  ASSERT_EQ(w->kind, static_cast<uint8_t>(WireKind::proto_local));
  for (bool consume : {false, false, true}) {
    Result<Value> v = from_wire(*w, dp, consume);
    ASSERT_TRUE(v.ok());
    EXPECT_TRUE(torch::equal(*v->proto().batch().find("x"), x));
    EXPECT_EQ(v->proto().batch().find("x")->data_ptr(), x.data_ptr());
  }
  ASSERT_NE(w->local->batch().find("x"), nullptr);
  EXPECT_EQ(w->local->batch().find("x")->data_ptr(), x.data_ptr());
  EXPECT_EQ(dp.stats().payloads, 0u);  // nothing published
}

}  // namespace
}  // namespace tessera::runtime
