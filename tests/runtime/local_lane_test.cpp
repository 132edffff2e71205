// Note [Local lanes] and Note [In-process values]: the polling hand-off to in-process workers
// keeps every caller's order, fails what a terminating worker still held, and in-process calls
// move DataProtos by reference (nothing published on the data plane). Note [Polling under
// contention]: a thread's repeated stalled yields switch polling off process-wide for the backoff
// window; lone stalls (one per thread) do not.
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
  CallRequest request;
  request.method = std::to_string(i);
  return std::make_shared<LocalCall>(std::move(request), false, batch, i);
}

std::shared_ptr<CallBatch> make_batch(size_t n) {
  return std::make_shared<CallBatch>(CallLabels(std::vector<std::string>(n, "target")),
                                     std::chrono::steady_clock::time_point::max());
}

// Spins until `lane` polls (the worker thread has started polling).
void await_polling(const LocalLane& lane) {
  while (!lane.polling()) std::this_thread::yield();
}

constexpr std::chrono::hours kNever{1};
constexpr std::chrono::nanoseconds kDefaultStall = std::chrono::milliseconds(2);
constexpr std::chrono::nanoseconds kDefaultBackoff = std::chrono::milliseconds(10);
constexpr std::chrono::nanoseconds kDefaultConfirm = std::chrono::milliseconds(20);

// Puts Note [Polling under contention]'s defaults back after each test.
class ContentionSettings : public ::testing::Test {
 protected:
  void TearDown() override {
    internal::set_poll_contention_for_testing(kDefaultStall, kDefaultBackoff, kDefaultConfirm);
  }
};

// Lane tests that need the worker to keep polling: no yield counts as a stall (ctest runs
// other binaries beside this one, which would otherwise switch polling off at random).
class LocalLane_ : public ContentionSettings {
 protected:
  void SetUp() override {
    internal::set_poll_contention_for_testing(kNever, kDefaultBackoff, kDefaultConfirm);
  }
};

// Every yield counts as a stall, a thread's second stall always confirms contention, and the
// backoff window outlasts the test.
class PollingUnderContention : public ContentionSettings {
 protected:
  void SetUp() override {
    internal::set_poll_contention_for_testing(std::chrono::nanoseconds(0), kNever, kNever);
  }
};

TEST_F(LocalLane_, AMailedCallKeepsTheWorkerOffTheLaneUntilTaken) {
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

TEST_F(LocalLane_, HandedOffCallsRunInOrderOnThePollingThread) {
  LocalLane lane(microseconds(100000));
  constexpr size_t kCalls = 200;
  auto batch = make_batch(kCalls);
  std::vector<size_t> order;
  std::thread worker([&] {
    lane.took_mailed();  // (nothing was mailed: must not underflow)
    lane.poll([&](LocalCall& c) {
      order.push_back(std::stoul(c.request.method));
      EXPECT_TRUE(c.slot.set(WireValue{}));
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

TEST_F(LocalLane_, ClosingFailsTheQueuedCallsAndRefusesLaterOnes) {
  LocalLane lane(microseconds(1000000));
  // One batch per call: each call's own outcome (in one batch, the first failure would cancel
  // the others, Note [Failing fast]).
  std::vector<std::shared_ptr<CallBatch>> batches{make_batch(1), make_batch(1), make_batch(1)};
  std::mutex gate;
  gate.lock();  // the first call blocks in its handler until the test opens the gate
  std::atomic<bool> first_started{false};
  std::thread worker([&] {
    lane.poll([&](LocalCall& c) {
      first_started = true;
      std::lock_guard<std::mutex> wait(gate);
      EXPECT_TRUE(c.slot.set(WireValue{}));
    });
  });
  await_polling(lane);
  auto first = make_call(batches[0], 0);
  ASSERT_TRUE(lane.try_hand_off(first));
  while (!first_started) std::this_thread::yield();
  auto queued = make_call(batches[1], 0);
  ASSERT_TRUE(lane.try_hand_off(queued));  // waits behind the blocked call
  lane.close();                            // the worker terminates
  auto late = make_call(batches[2], 0);
  EXPECT_FALSE(lane.try_hand_off(late));  // refused: the caller mails it (CAF drops it)
  late.reset();                           // ... which destroys it
  gate.unlock();
  worker.join();
  std::vector<Result<WireValue>> results;
  for (auto& b : batches) results.push_back(b->wait()[0]);
  EXPECT_TRUE(results[0].ok());
  for (size_t i : {1, 2}) {
    EXPECT_EQ(results[i].status().code(), ErrorCode::unavailable);
    EXPECT_NE(results[i].status().message().find("terminated before answering"),
              std::string::npos);
  }
}

// Note [Replies freed by their worker]: a held reply is destroyed on the polling thread once
// the caller has dropped its reference, and a reply the caller keeps is let go of (not kept
// alive by the lane) when polling ends.
TEST_F(LocalLane_, HeldRepliesAreFreedByThePollingThreadOnceTheCallerLetsGo) {
  LocalLane lane(microseconds(100000));
  auto batch = make_batch(2);
  std::atomic<std::thread::id> freed_on{};
  std::atomic<bool> freed{false};
  std::shared_ptr<const int> first;  // the caller's references
  std::shared_ptr<const int> second;
  std::thread::id worker_id;
  std::thread worker([&] {
    worker_id = std::this_thread::get_id();
    lane.poll([&](LocalCall& c) {
      auto reply = c.request.method == "0"
                       ? std::shared_ptr<const int>(new int(0),
                                                    [&](const int* p) {
                                                      freed_on = std::this_thread::get_id();
                                                      freed = true;
                                                      delete p;
                                                    })
                       : std::make_shared<const int>(1);
      (c.request.method == "0" ? first : second) = reply;  // the "caller" reads it after set()
      lane.hold(reply);
      EXPECT_TRUE(c.slot.set(WireValue{}));
    });
  });
  await_polling(lane);
  auto call = make_call(batch, 0);
  ASSERT_TRUE(lane.try_hand_off(call));
  auto other = make_call(batch, 1);
  ASSERT_TRUE(lane.try_hand_off(other));
  std::vector<Result<WireValue>> results = batch->wait();  // both answered
  ASSERT_TRUE(results[0].ok() && results[1].ok());
  ASSERT_TRUE(first && second);
  first.reset();  // done with the first reply: the worker destroys it while it polls
  while (!freed) std::this_thread::yield();
  EXPECT_EQ(freed_on.load(), worker_id);
  worker.join();  // 100 ms without calls: polling ends
  EXPECT_EQ(second.use_count(), 1) << "the lane let go of the reply the caller kept";
}

// Note [Lock-free outcomes]: outcomes set from many threads at once, two per target, keep the
// first per target only, and the batch completes exactly once.
TEST(CallBatchOutcomes, ManyThreadsAtOnceFirstOutcomePerTargetWins) {
  constexpr size_t kTargets = 8;
  for (int round = 0; round < 50; ++round) {
    auto batch = make_batch(kTargets);
    std::atomic<int> completions{0};
    batch->on_complete([&] { ++completions; });
    std::atomic<int> accepted{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (size_t t = 0; t < kTargets; ++t) {
      threads.emplace_back([&, t] {
        while (!go.load()) std::this_thread::yield();
        // Target t gets "own"; the next target gets a competing "other".
        if (batch->set(t, json_wire(nlohmann::json{{"from", t}, {"own", true}}))) ++accepted;
        if (batch->set((t + 1) % kTargets, json_wire(nlohmann::json{{"from", t}, {"own", false}}))) {
          ++accepted;
        }
      });
    }
    go = true;
    for (auto& th : threads) th.join();
    EXPECT_EQ(accepted.load(), static_cast<int>(kTargets));
    EXPECT_TRUE(batch->ready());
    EXPECT_EQ(completions.load(), 1);
    std::vector<Result<WireValue>> results = batch->wait();
    ASSERT_EQ(results.size(), kTargets);
    for (size_t i = 0; i < kTargets; ++i) {
      ASSERT_TRUE(results[i].ok());
      nlohmann::json j = nlohmann::json::parse(results[i]->json);
      const size_t from = j.at("from").get<size_t>();
      EXPECT_EQ(j.at("own").get<bool>() ? from : (from + 1) % kTargets, i) << "round " << round;
    }
    EXPECT_FALSE(batch->set(0, json_wire(nlohmann::json(1)))) << "complete: later outcomes ignored";
  }
}

// A deadline that passes fails the unanswered targets with timeout and keeps the answered ones.
TEST(CallBatchOutcomes, TheDeadlineFailsOnlyTheUnansweredTargets) {
  auto batch = std::make_shared<CallBatch>(CallLabels(std::vector<std::string>{"a", "b", "c"}),
                                           std::chrono::steady_clock::now());
  ASSERT_TRUE(batch->set(1, json_wire(nlohmann::json(7))));
  std::vector<Result<WireValue>> results = batch->wait();
  EXPECT_EQ(results[0].status().code(), ErrorCode::timeout);
  EXPECT_NE(results[0].status().message().find("a: no answer"), std::string::npos);
  ASSERT_TRUE(results[1].ok());
  EXPECT_EQ(results[1]->json, "7");
  EXPECT_EQ(results[2].status().code(), ErrorCode::timeout);
  EXPECT_FALSE(batch->set(2, json_wire(nlohmann::json(8)))) << "too late";
}

// Note [Failing fast]: the first failure ends the batch; the targets still unanswered are
// cancelled naming it, their late answers are refused, and first_error reports the real error.
TEST(CallBatchOutcomes, TheFirstFailureCancelsTheUnansweredTargets) {
  auto batch = std::make_shared<CallBatch>(CallLabels(std::vector<std::string>{"a", "b", "c", "d"}),
                                           std::chrono::steady_clock::time_point::max());
  ASSERT_TRUE(batch->set(0, json_wire(nlohmann::json(1))));
  EXPECT_FALSE(batch->ready());
  ASSERT_TRUE(batch->set(2, Status(ErrorCode::unavailable, "c: gloo connectFullMesh failed")));
  EXPECT_TRUE(batch->ready()) << "no wait for b and d";
  EXPECT_FALSE(batch->set(1, json_wire(nlohmann::json(2)))) << "b's late answer is refused";
  std::vector<Result<WireValue>> results = batch->wait();
  ASSERT_TRUE(results[0].ok());
  EXPECT_EQ(results[2].status().code(), ErrorCode::unavailable);
  for (size_t i : {1, 3}) {
    EXPECT_EQ(results[i].status().code(), ErrorCode::cancelled);
    EXPECT_NE(results[i].status().message().find("c failed first"), std::string::npos)
        << results[i].status().message();
  }
  Result<std::vector<WireValue>> all = first_error(std::move(results));
  ASSERT_FALSE(all.ok());
  EXPECT_EQ(all.status().code(), ErrorCode::unavailable);
  EXPECT_EQ(all.status().message(), "c: gloo connectFullMesh failed (2 rank(s) given up unanswered)");
}

// Failing several targets at once (a dead agent's ranks) keeps each one's own error; the rest of
// the batch is cancelled after them.
TEST(CallBatchOutcomes, SeveralFailuresAtOnceKeepTheirOwnErrors) {
  auto batch = std::make_shared<CallBatch>(CallLabels(std::vector<std::string>{"a", "b", "c"}),
                                           std::chrono::steady_clock::time_point::max());
  ASSERT_TRUE(batch->set(1, Status(ErrorCode::unavailable, "b: agent h2 is down"), false));
  ASSERT_TRUE(batch->set(2, Status(ErrorCode::unavailable, "c: agent h2 is down"), false));
  EXPECT_FALSE(batch->ready());
  batch->cancel_unanswered(1);
  std::vector<Result<WireValue>> results = batch->wait();
  EXPECT_EQ(results[0].status().code(), ErrorCode::cancelled);
  EXPECT_EQ(results[1].status().message(), "b: agent h2 is down");
  EXPECT_EQ(results[2].status().message(), "c: agent h2 is down");
  Result<std::vector<WireValue>> all = first_error(std::move(results));
  EXPECT_EQ(all.status().message(),
            "b: agent h2 is down (1 more rank(s) failed, 1 rank(s) given up unanswered)");
}

TEST_F(LocalLane_, DisabledPollingNeverTakesTheLane) {
  LocalLane lane(microseconds(0));
  int handled = 0;
  auto reply = std::make_shared<const int>(7);
  lane.hold(reply);  // as a worker answering a mailed call does before it polls
  lane.poll([&](LocalCall&) { ++handled; });
  EXPECT_FALSE(lane.polling());
  EXPECT_EQ(reply.use_count(), 1) << "a lane that does not poll holds nothing";
  auto batch = make_batch(1);
  auto call = make_call(batch, 0);
  EXPECT_FALSE(lane.try_hand_off(call));
}

// A real detached worker: calls sent back to back without waiting (some mailed, most through
// the lane while the worker polls) arrive in the order sent.
TEST_F(LocalLane_, CallsToARealWorkerKeepTheCallersOrder) {
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

// Two runtimes in one process: their actor systems share CAF's node id and count actor ids
// alike, so their workers have equal addresses. Each runtime's calls must still reach its own
// workers, through its own workers' lanes, while the other runtime's workers poll.
TEST_F(LocalLane_, TwoRuntimesInOneProcessEachCallTheirOwnWorkers) {
  RuntimeConfig cfg;
  cfg.embedded_devices = "cpu:2";
  cfg.idle_poll = std::chrono::milliseconds(500);  // every worker polls between the calls below
  auto a = Runtime::start(cfg, testing::test_registry());
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  auto b = Runtime::start(cfg, testing::test_registry());
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  auto wa = (*a)->spawn_workers("a", *(*a)->resource_pool(), {{"", "echo", "{}"}});
  ASSERT_TRUE(wa.ok()) << wa.status().to_string();
  auto wb = (*b)->spawn_workers("b", *(*b)->resource_pool(), {{"", "echo", "{}"}});
  ASSERT_TRUE(wb.ok()) << wb.status().to_string();
  // The situation this test is about: equal addresses in the two runtimes.
  ASSERT_EQ((*wa)[0].actor.address(), (*wb)[0].actor.address());
  uint64_t lane_before = call_counters().lane_calls;
  for (int round = 0; round < 20; ++round) {
    for (auto* side : {&*a, &*b}) {
      Runtime& rt = **side;
      const std::vector<WorkerRef>& w = side == &*a ? *wa : *wb;
      auto infos = rt.call(w, "rank_info", std::vector<std::vector<Value>>(2));
      ASSERT_TRUE(infos.ok()) << infos.status().to_string();
      for (size_t r = 0; r < 2; ++r) {
        EXPECT_EQ((*infos)[r].json()["group"], side == &*a ? "a" : "b") << "round " << round;
        EXPECT_EQ((*infos)[r].json()["rank"], static_cast<int>(r));
      }
    }
  }
  EXPECT_GT(call_counters().lane_calls, lane_before);  // through the lanes, not only mailed
}

TEST_F(PollingUnderContention, AThreadsSecondStallSwitchesPollingOffForTheWindow) {
  EXPECT_TRUE(internal::polling_allowed());
  uint64_t stalls = internal::poll_stalls();
  uint64_t lone = internal::poll_lone_stalls();
  EXPECT_FALSE(internal::poll_yield());  // "stalled": this loop stops, but no window yet
  EXPECT_EQ(internal::poll_lone_stalls(), lone + 1);
  EXPECT_EQ(internal::poll_stalls(), stalls);
  EXPECT_TRUE(internal::polling_allowed());
  EXPECT_FALSE(internal::poll_yield());  // stalled again: contention, the window opens
  EXPECT_EQ(internal::poll_stalls(), stalls + 1);
  EXPECT_FALSE(internal::polling_allowed());
  EXPECT_FALSE(internal::poll_until([] { return false; }, std::chrono::seconds(30)));
  EXPECT_TRUE(internal::poll_until([] { return true; }, std::chrono::seconds(30)));  // done: true
  // Ended early (a benchmark's load has stopped), with the thresholds kept: the stalls before
  // are forgotten, so it takes two more to reopen it.
  internal::end_poll_window();
  EXPECT_TRUE(internal::polling_allowed());
  EXPECT_EQ(internal::poll_backoff_level(), 0);
  EXPECT_FALSE(internal::poll_yield());
  EXPECT_TRUE(internal::polling_allowed());
  EXPECT_FALSE(internal::poll_yield());
  EXPECT_EQ(internal::poll_stalls(), stalls + 2);
  EXPECT_EQ(internal::poll_lone_stalls(), lone + 2);
  EXPECT_FALSE(internal::polling_allowed());
  // A window that has passed lets polling probe again.
  internal::set_poll_contention_for_testing(kNever, kDefaultBackoff, kDefaultConfirm);
  EXPECT_TRUE(internal::polling_allowed());
  EXPECT_TRUE(internal::poll_yield());
}

// A moment when the VM takes every vCPU stalls each poller once: no window.
TEST_F(PollingUnderContention, OneStallOnEachOfManyThreadsOpensNoWindow) {
  uint64_t stalls = internal::poll_stalls();
  uint64_t lone = internal::poll_lone_stalls();
  std::vector<std::thread> pollers;
  for (int i = 0; i < 8; ++i) {
    pollers.emplace_back([] { EXPECT_FALSE(internal::poll_yield()); });
  }
  for (auto& t : pollers) t.join();
  EXPECT_EQ(internal::poll_lone_stalls(), lone + 8);
  EXPECT_EQ(internal::poll_stalls(), stalls);
  EXPECT_TRUE(internal::polling_allowed());
  // Still none after this thread's first; its second opens it.
  EXPECT_FALSE(internal::poll_yield());
  EXPECT_TRUE(internal::polling_allowed());
  EXPECT_FALSE(internal::poll_yield());
  EXPECT_FALSE(internal::polling_allowed());
}

// A clock the test moves: each read returns the current time, then adds the step (a yield
// reads it twice, so a step above the threshold makes every yield a stall).
std::atomic<int64_t> g_fake_now{0};
std::atomic<int64_t> g_fake_step{0};
int64_t fake_clock() { return g_fake_now.fetch_add(g_fake_step.load()); }
constexpr int64_t kMs = 1'000'000;

TEST_F(PollingUnderContention, WindowsDoubleWhileStallsPersistAndResetAfterAnIsolatedOne) {
  internal::set_poll_contention_for_testing(std::chrono::milliseconds(2),
                                            std::chrono::milliseconds(10),
                                            std::chrono::milliseconds(20), &fake_clock);
  auto stall_at = [](int64_t ms) {  // a yield that starts at `ms` and takes 3 ms
    g_fake_now = ms * kMs;
    g_fake_step = 3 * kMs;
    bool polled_on = internal::poll_yield();
    g_fake_step = 0;
    return polled_on;
  };
  uint64_t stalls = internal::poll_stalls();
  EXPECT_FALSE(stall_at(0));  // ends at 3: lone
  EXPECT_FALSE(stall_at(30));  // 27 ms after this thread's last: lone again
  EXPECT_TRUE(internal::polling_allowed());
  std::thread other([&] { EXPECT_FALSE(stall_at(35)); });  // another thread's: lone too
  other.join();
  EXPECT_TRUE(internal::polling_allowed());
  EXPECT_EQ(internal::poll_stalls(), stalls);
  EXPECT_FALSE(stall_at(40));  // 7 ms after this thread's last: window [43, 53)
  EXPECT_EQ(internal::poll_stalls(), stalls + 1);
  EXPECT_EQ(internal::poll_backoff_level(), 0);
  g_fake_now = 45 * kMs;
  EXPECT_FALSE(internal::polling_allowed());
  EXPECT_FALSE(internal::poll_yield());  // no stall (0 ms), but the window is open
  g_fake_now = 53 * kMs;
  EXPECT_TRUE(internal::polling_allowed());
  EXPECT_TRUE(internal::poll_yield());
  EXPECT_FALSE(stall_at(54));  // right after the window: [57, 77)
  EXPECT_EQ(internal::poll_backoff_level(), 1);
  EXPECT_FALSE(stall_at(80));  // again: [83, 123)
  EXPECT_EQ(internal::poll_backoff_level(), 2);
  g_fake_now = 122 * kMs;
  EXPECT_FALSE(internal::polling_allowed());
  EXPECT_FALSE(stall_at(118));  // inside the window (another thread, same descheduling): no change
  EXPECT_EQ(internal::poll_backoff_level(), 2);
  EXPECT_EQ(internal::poll_stalls(), stalls + 3);
  EXPECT_FALSE(stall_at(300));  // long after: lone, no window
  EXPECT_TRUE(internal::polling_allowed());
  EXPECT_FALSE(stall_at(310));  // repeated, but not right after a window: back to 10 ms
  EXPECT_EQ(internal::poll_backoff_level(), 0);
  EXPECT_EQ(internal::poll_stalls(), stalls + 4);
  g_fake_now = 323 * kMs;
  EXPECT_TRUE(internal::polling_allowed());
  for (int64_t ms = 400; ms < 400 + 40 * 3000; ms += 3000) (void)stall_at(ms);
  EXPECT_EQ(internal::poll_stalls(), stalls + 4);  // 3 s apart: each lone
  int64_t t = 200'000;
  (void)stall_at(t);
  for (int i = 0; i < 12; ++i) {  // each a few ms after the previous window closed
    t = (g_fake_now.load() / kMs) + (10 << internal::poll_backoff_level()) + 1;
    (void)stall_at(t);
  }
  EXPECT_EQ(internal::poll_backoff_level(), 7);  // 1.28 s at most
}

TEST_F(PollingUnderContention, ALaneStopsPollingAtAStallAndStaysOffDuringTheWindow) {
  LocalLane lane(microseconds(30000000));  // 30 s: only a stall ends this poll early
  auto batch = make_batch(2);
  std::thread worker([&] {
    // Its first yield stalls: back to the mailbox at once, no window yet.
    lane.poll([](LocalCall&) { ADD_FAILURE() << "nothing was handed"; });
    EXPECT_FALSE(lane.polling());
    EXPECT_TRUE(internal::polling_allowed());
    // It polls again and stalls again: contention, the window opens.
    lane.poll([](LocalCall&) { ADD_FAILURE() << "nothing was handed"; });
  });
  worker.join();
  EXPECT_FALSE(lane.polling());
  EXPECT_FALSE(internal::polling_allowed());
  auto call = make_call(batch, 0);
  EXPECT_FALSE(lane.try_hand_off(call));  // not polling: the caller mails it
  lane.took_mailed();
  int handled = 0;
  lane.poll([&](LocalCall&) { ++handled; });  // the window is open: does not start polling
  EXPECT_FALSE(lane.polling());
  EXPECT_EQ(handled, 0);
}

// With polling off, calls to real workers go through their mailboxes and are answered.
TEST_F(PollingUnderContention, CallsAreMailedAndAnsweredWhilePollingIsOff) {
  RuntimeConfig cfg;
  cfg.embedded_devices = "cpu:2";
  cfg.idle_poll = std::chrono::milliseconds(500);
  auto rt = Runtime::start(cfg, testing::test_registry());
  ASSERT_TRUE(rt.ok()) << rt.status().to_string();
  auto workers = (*rt)->spawn_workers("off", *(*rt)->resource_pool(), {{"", "echo", "{}"}});
  ASSERT_TRUE(workers.ok()) << workers.status().to_string();
  EXPECT_FALSE(internal::poll_yield());  // open the window (a lone stall, then a repeated one)
  EXPECT_FALSE(internal::poll_yield());
  ASSERT_FALSE(internal::polling_allowed());
  uint64_t lane_before = call_counters().lane_calls;
  for (int i = 0; i < 50; ++i) {
    Value v = nlohmann::json(i);
    auto out = (*rt)->call(*workers, "log", {{v}, {v}});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    ASSERT_EQ((*out)[0].json().size(), static_cast<size_t>(i + 1));
    EXPECT_EQ((*out)[1].json().back().get<int>(), i);
  }
  EXPECT_EQ(call_counters().lane_calls, lane_before);  // every call was mailed
}

// Note [Call labels]: a batch names its targets from shared parts, joined only when asked.
TEST(CallLabels, JoinTheWorkerAndTheMethodOnDemand) {
  const WorkerContext c{"g", 1, 2, 1, 2, "cpu:1", "node-a", "", 0};
  auto worker = std::make_shared<const std::string>(worker_label(c));
  EXPECT_EQ(*worker, "rank 1 (cpu:1 on node-a) of group 'g'");
  EXPECT_EQ(call_label(c, "m"), "rank 1 (cpu:1 on node-a) of group 'g': method 'm'");
  CallLabels same;
  for (int i = 0; i < 3; ++i) same.add(worker, "m");
  ASSERT_EQ(same.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(same[i], call_label(c, "m"));
  CallLabels mixed;  // a second method switches to one method per target
  const std::vector<std::string> methods = {"a", "a", "b", "a", "c"};
  for (const std::string& m : methods) mixed.add(worker, m);
  for (size_t i = 0; i < methods.size(); ++i) EXPECT_EQ(mixed[i], call_label(c, methods[i]));
  CallLabels whole(std::vector<std::string>{"x", "y"});
  whole.add(worker, "m");
  ASSERT_EQ(whole.size(), 3u);
  EXPECT_EQ(whole[0], "x");
  EXPECT_EQ(whole[1], "y");
  EXPECT_EQ(whole[2], call_label(c, "m"));
  // A target that times out is named by its label.
  CallBatch batch(std::move(mixed), std::chrono::steady_clock::now());
  std::vector<Result<WireValue>> out = batch.wait();
  ASSERT_EQ(out.size(), methods.size());
  EXPECT_EQ(out[2].status().code(), ErrorCode::timeout);
  EXPECT_NE(out[2].status().message().find(call_label(c, "b")), std::string::npos)
      << out[2].status().message();
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

// Note [Chunks cut by the receiver]: an in-process value with a row range decodes to a view of
// those rows; a range outside the DataProto is refused (corrupt data), not cut.
TEST(InProcessValues, ARowRangeDecodesToAViewOfThoseRows) {
  RuntimeConfig cfg;
  auto rt = Runtime::start(cfg, testing::test_registry());
  ASSERT_TRUE(rt.ok()) << rt.status().to_string();
  at::Tensor x = torch::arange(12, torch::kFloat32).view({6, 2});
  auto whole = std::make_shared<const proto::DataProto>(*proto::DataProto::from_dict({{"x", x}}));
  Result<Value> v = from_wire(local_rows_wire(whole, 2, 5), (*rt)->data_plane(), true);
  ASSERT_TRUE(v.ok()) << v.status().to_string();
  EXPECT_TRUE(torch::equal(*v->proto().batch().find("x"), x.slice(0, 2, 5)));
  EXPECT_EQ(v->proto().batch().find("x")->data_ptr<float>(), x.data_ptr<float>() + 4);
  EXPECT_EQ(whole->size(), 6) << "the shared DataProto is left whole";
  for (auto [begin, end] : {std::pair<int64_t, int64_t>{4, 7}, {-1, 2}, {3, 2}}) {
    Result<Value> bad = from_wire(local_rows_wire(whole, begin, end), (*rt)->data_plane(), true);
    EXPECT_EQ(bad.status().code(), ErrorCode::corrupt_data) << begin << ".." << end;
  }
}

// to_wire(Value&&) moves the DataProto into an in-process wire value (the caller's tensors, by
// reference). A decode that does not consume, or one while someone else still holds the
// reference (a sender that kept it), copies the DataProto (tensors still by reference) and
// leaves the wire value intact; the consuming decode of the only reference takes the DataProto
// itself (a blocking call's receiver: no copy at the worker nor back at the caller).
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
  auto decodes_to_x = [&](bool consume) {
    Result<Value> v = from_wire(*w, dp, consume);
    ASSERT_TRUE(v.ok());
    EXPECT_TRUE(torch::equal(*v->proto().batch().find("x"), x));
    EXPECT_EQ(v->proto().batch().find("x")->data_ptr(), x.data_ptr());
  };
  std::shared_ptr<const proto::DataProto> sender = w->local;
  for (bool consume : {false, true}) decodes_to_x(consume);
  ASSERT_NE(w->local->batch().find("x"), nullptr);  // shared: both decodes copied
  sender.reset();
  decodes_to_x(/*consume=*/false);
  ASSERT_NE(w->local->batch().find("x"), nullptr);  // not consuming: copied
  decodes_to_x(/*consume=*/true);
  EXPECT_EQ(w->local->batch().find("x"), nullptr);  // the only reference, consumed: taken
  EXPECT_EQ(dp.stats().payloads, 0u);               // nothing published
}

}  // namespace
}  // namespace tessera::runtime
