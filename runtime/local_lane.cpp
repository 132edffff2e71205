// local_lane.cpp: Note [Local lanes].
#include "runtime/local_lane.hpp"

#include <thread>
#include <unordered_map>
#include <vector>

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

void LocalLane::poll(const std::function<void(LocalCall&)>& handle) {
  if (idle_poll_.count() <= 0) return;
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
      if (Clock::now() < deadline && !closed_.load(std::memory_order_acquire)) {
        std::this_thread::yield();
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

struct Registry {
  std::mutex mutex;
  std::unordered_map<caf::actor_addr, std::shared_ptr<LocalLane>> lanes;
};

Registry& registry() {
  static Registry* r = new Registry();  // leaked: workers may outlive static destruction
  return *r;
}

}  // namespace

void register_lane(const caf::actor_addr& worker, std::shared_ptr<LocalLane> lane) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.lanes[worker] = std::move(lane);
}

void unregister_lane(const caf::actor_addr& worker) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.lanes.erase(worker);
}

std::shared_ptr<LocalLane> find_lane(const caf::actor_addr& worker) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.lanes.find(worker);
  return it == r.lanes.end() ? nullptr : it->second;
}

bool poll_until(const std::function<bool()>& done, std::chrono::microseconds budget) {
  if (done()) return true;
  if (budget.count() <= 0) return false;
  auto deadline = std::chrono::steady_clock::now() + budget;
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
    if (done()) return true;
  }
  return false;
}

}  // namespace tessera::runtime::internal
