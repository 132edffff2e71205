// local_lane.cpp: Note [Local lanes].
#include "runtime/local_lane.hpp"

#include <algorithm>
#include <thread>
#include <unordered_map>
#include <vector>

#include <caf/actor_cast.hpp>
#include <caf/actor_control_block.hpp>

#include "runtime/call_hub.hpp"

namespace tessera::runtime::internal {

bool LocalLane::try_hand_off(std::shared_ptr<LocalCall>& call) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (polling_ && !closed_) {
    queue_.push_back(std::move(call));
    queued_.store(queue_.size(), std::memory_order_release);
    return true;
  }
  ++mailed_;
  return false;
}

void LocalLane::took_mailed() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (mailed_ > 0) --mailed_;
}

void LocalLane::hold(std::shared_ptr<const void> reply) { held_.push_back(std::move(reply)); }

void LocalLane::poll(const std::function<void(LocalCall&)>& handle) {
  // Note [Replies freed by their worker]: on every return, outside the lock (declared first,
  // destroyed last), the held replies are let go of.
  struct LetGo {
    std::vector<std::shared_ptr<const void>>& held;
    ~LetGo() { held.clear(); }
  } let_go{held_};
  if (idle_poll_.count() <= 0 || !polling_allowed()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (mailed_ > 0 || closed_) return;
    polling_ = true;
  }
  using Clock = std::chrono::steady_clock;
  auto deadline = Clock::now() + idle_poll_;
  std::vector<std::shared_ptr<LocalCall>> taken;
  for (;;) {
    if (queued_.load(std::memory_order_acquire) == 0) {
      // The replies whose callers are done: the last reference is this thread's, and dropping
      // it (an acq_rel decrement) orders the destruction after the caller's use.
      held_.erase(std::remove_if(held_.begin(), held_.end(),
                                 [](const std::shared_ptr<const void>& r) { return r.use_count() == 1; }),
                  held_.end());
      if (Clock::now() < deadline && !closed_.load(std::memory_order_acquire) && poll_yield()) {
        continue;
      }
      std::lock_guard<std::mutex> lock(mutex_);
      if (queue_.empty()) {  // back to the mailbox: later calls are mailed
        polling_ = false;
        return;
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      taken.assign(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.end()));
      queue_.clear();
      queued_.store(0, std::memory_order_release);
    }
    for (auto& call : taken) handle(*call);
    taken.clear();
    deadline = Clock::now() + idle_poll_;
  }
}

void LocalLane::close() {
  std::deque<std::shared_ptr<LocalCall>> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    polling_ = false;
    dropped.swap(queue_);
    queued_.store(0);
  }
  // `dropped` goes out of scope here, outside the lock: each ReplySlot fails its target.
}

bool LocalLane::polling() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return polling_;
}

namespace {

// Keyed by the worker's control block, not by its actor_addr: addresses compare equal when
// (actor id, node id) are, and every actor system in one process has the same CAF node id and
// counts actor ids from the same start, so two runtimes in one process (tests, benches, a
// program embedding two) have workers with equal addresses. Keyed by address, the second
// runtime's lanes replaced the first's: calls to the first runtime's workers were handed to
// the second's polling workers (the wrong worker ran them), or counted as mailed on the
// wrong lane (the right worker then never polled again: 1 ms per call, seen in bench_runtime
// with both an embedded polling runtime and a non-polling one). A control block lives until
// its actor is gone; the worker unregisters while it terminates, before that.
using LaneKey = const caf::actor_control_block*;

LaneKey lane_key(const caf::actor_addr& worker) {
  return caf::actor_cast<caf::actor_control_block*>(worker);
}

struct Registry {
  std::mutex mutex;
  std::unordered_map<LaneKey, std::shared_ptr<LocalLane>> lanes;
};

Registry& registry() {
  static Registry* r = new Registry();  // leaked: workers may outlive static destruction
  return *r;
}

}  // namespace

void register_lane(const caf::actor_addr& worker, std::shared_ptr<LocalLane> lane) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.lanes[lane_key(worker)] = std::move(lane);
}

void unregister_lane(const caf::actor_addr& worker) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.lanes.erase(lane_key(worker));
}

std::shared_ptr<LocalLane> find_lane(const caf::actor_addr& worker) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.lanes.find(lane_key(worker));
  return it == r.lanes.end() ? nullptr : it->second;
}

int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace {

// Note [Polling under contention]: process-wide, read by every poll loop without a lock.
std::atomic<int64_t> g_stall_ns{2'000'000};
std::atomic<int64_t> g_backoff_ns{10'000'000};  // the first window; doubles per level
std::atomic<int64_t> g_confirm_ns{20'000'000};  // a thread's second stall within this: contention
constexpr int kMaxBackoffLevel = 7;              // 10 ms << 7 = 1.28 s
std::atomic<int64_t> g_poll_off_until_ns{0};
std::atomic<int> g_backoff_level{0};
std::atomic<uint64_t> g_stalls{0};
std::atomic<uint64_t> g_lone_stalls{0};
// Bumped to forget every thread's last stall (tests, end_poll_window).
std::atomic<uint64_t> g_stall_epoch{0};
std::atomic<int64_t (*)()> g_clock{&steady_now_ns};

// The calling thread's last stalled yield: when it ended, in which epoch.
struct LastStall {
  uint64_t epoch = 0;
  int64_t end_ns = 0;
  bool valid = false;
};
thread_local LastStall t_last_stall;

int64_t clock_ns() { return g_clock.load(std::memory_order_relaxed)(); }

// A yield from `start` to `end` stalled. Opens a backoff window when the contention is
// confirmed: this thread stalled shortly before, or the last window closed just before (the
// contention persists: the window doubles). A lone stall (the VM taking every vCPU a moment)
// opens none.
void stalled(int64_t start, int64_t end) {
  uint64_t epoch = g_stall_epoch.load(std::memory_order_relaxed);
  LastStall last = t_last_stall;
  t_last_stall = {epoch, end, true};
  int64_t until = g_poll_off_until_ns.load(std::memory_order_relaxed);
  if (until != 0 && end < until) return;  // already open: the same contention seen elsewhere
  int64_t base = g_backoff_ns.load(std::memory_order_relaxed);
  bool persists = until != 0 && end - until < base;
  bool repeated = last.valid && last.epoch == epoch &&
                  start - last.end_ns < g_confirm_ns.load(std::memory_order_relaxed);
  if (!persists && !repeated) {
    g_lone_stalls.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  int level = persists
                  ? std::min(g_backoff_level.load(std::memory_order_relaxed) + 1, kMaxBackoffLevel)
                  : 0;
  g_backoff_level.store(level, std::memory_order_relaxed);
  g_poll_off_until_ns.store(end + (base << level), std::memory_order_relaxed);
  g_stalls.fetch_add(1, std::memory_order_relaxed);
}

// True unless a backoff window is open at time `t`.
bool no_window_at(int64_t t) {
  int64_t off_until = g_poll_off_until_ns.load(std::memory_order_relaxed);
  return off_until == 0 || t >= off_until;
}

}  // namespace

bool polling_allowed() { return no_window_at(clock_ns()); }

bool poll_yield() {
  int64_t before = clock_ns();
  std::this_thread::yield();
  int64_t after = clock_ns();
  if (after - before > g_stall_ns.load(std::memory_order_relaxed)) {
    stalled(before, after);
    return false;
  }
  return no_window_at(after);
}

uint64_t poll_stalls() { return g_stalls.load(std::memory_order_relaxed); }

uint64_t poll_lone_stalls() { return g_lone_stalls.load(std::memory_order_relaxed); }

int poll_backoff_level() { return g_backoff_level.load(std::memory_order_relaxed); }

void end_poll_window() {
  g_poll_off_until_ns.store(0, std::memory_order_relaxed);
  g_backoff_level.store(0, std::memory_order_relaxed);
  g_stall_epoch.fetch_add(1, std::memory_order_relaxed);
}

void set_poll_contention_for_testing(std::chrono::nanoseconds stall,
                                     std::chrono::nanoseconds backoff,
                                     std::chrono::nanoseconds confirm, int64_t (*clock)()) {
  g_stall_ns.store(stall.count());
  g_backoff_ns.store(backoff.count());
  g_confirm_ns.store(confirm.count());
  g_clock.store(clock != nullptr ? clock : &steady_now_ns);
  end_poll_window();
}

bool poll_until(const std::function<bool()>& done, std::chrono::microseconds budget) {
  if (done()) return true;
  if (budget.count() <= 0 || !polling_allowed()) return false;
  auto deadline = std::chrono::steady_clock::now() + budget;
  while (std::chrono::steady_clock::now() < deadline) {
    bool go_on = poll_yield();
    if (done()) return true;
    if (!go_on) return false;
  }
  return false;
}

}  // namespace tessera::runtime::internal
