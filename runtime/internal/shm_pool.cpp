// shm_pool.cpp: Note [Landing segments].
#include "runtime/internal/shm_pool.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tessera::runtime::internal {
namespace {

constexpr uint64_t kGranule = uint64_t{2} << 20;  // segment sizes are multiples of 2 MiB

struct Segment {
  int fd = -1;
  void* addr = nullptr;
  uint64_t capacity = 0;
};

void destroy(const Segment& s) {
  ::munmap(s.addr, s.capacity);
  ::close(s.fd);
}

Result<Segment> create_segment(uint64_t bytes) {
  Segment s;
  s.capacity = (bytes + kGranule - 1) / kGranule * kGranule;
  s.fd = ::memfd_create("tessera-landing", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (s.fd < 0) return make_error(ErrorCode::io_error, "memfd_create: {}", std::strerror(errno));
  // Sealed against shrinking: the owner that writes into it can rely on its size (no SIGBUS).
  if (::ftruncate(s.fd, static_cast<off_t>(s.capacity)) != 0 ||
      ::fcntl(s.fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    int err = errno;
    ::close(s.fd);
    return make_error(ErrorCode::io_error, "sizing/sealing a landing segment: {}",
                      std::strerror(err));
  }
  s.addr = ::mmap(nullptr, s.capacity, PROT_READ | PROT_WRITE, MAP_SHARED, s.fd, 0);
  if (s.addr == MAP_FAILED) {
    ::close(s.fd);
    return make_error(ErrorCode::io_error, "mmap(landing segment): {}", std::strerror(errno));
  }
  return s;
}

}  // namespace

struct ShmPool::State {
  std::mutex mutex;
  uint64_t max_idle = 0;
  uint64_t idle_bytes = 0;
  std::multimap<uint64_t, Segment> idle;  // by capacity
  bool closed = false;
  uint64_t created = 0;
  uint64_t destroyed = 0;

  // REQUIRES: mutex held.
  void destroy_locked(const Segment& s) {
    destroy(s);
    ++destroyed;
  }

  void give_back(const Segment& s, bool poisoned) {
    std::lock_guard<std::mutex> lock(mutex);
    if (poisoned || closed || idle_bytes + s.capacity > max_idle) return destroy_locked(s);
    idle.emplace(s.capacity, s);
    idle_bytes += s.capacity;
  }
};

ShmPool::ShmPool(uint64_t max_idle_bytes) : state_(std::make_shared<State>()) {
  state_->max_idle = max_idle_bytes;
}

ShmPool::~ShmPool() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->closed = true;
  for (auto& [cap, s] : state_->idle) state_->destroy_locked(s);
  state_->idle.clear();
  state_->idle_bytes = 0;
}

ShmPoolStats ShmPool::stats() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return ShmPoolStats{state_->idle_bytes, state_->idle.size(), state_->created,
                      state_->destroyed};
}

Result<Landing> ShmPool::acquire(uint64_t bytes) {
  if (bytes == 0) return make_error(ErrorCode::invalid_argument, "a landing segment of 0 bytes");
  Segment seg;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    auto it = state_->idle.lower_bound(bytes);
    if (it != state_->idle.end() && it->first <= bytes + bytes / 4 + kGranule) {
      seg = it->second;
      state_->idle_bytes -= it->first;
      state_->idle.erase(it);
    }
  }
  if (seg.fd < 0) {
    TESSERA_ASSIGN_OR_RETURN(seg, create_segment(bytes));
    std::lock_guard<std::mutex> lock(state_->mutex);
    ++state_->created;
  }
  std::shared_ptr<State> state = state_;
  auto poisoned = std::make_shared<std::atomic<bool>>(false);
  auto buffer = proto::Buffer::wrap(seg.addr, bytes,
                                    [state, seg, poisoned] { state->give_back(seg, *poisoned); });
  return Landing{std::move(buffer), seg.fd, poisoned};
}

MappingCache::Mapping::~Mapping() {
  if (addr != nullptr) ::munmap(addr, size);
}

Result<std::shared_ptr<MappingCache::Mapping>> MappingCache::map(int fd, uint64_t min_bytes) {
  // A segment that could shrink under our writes would kill this process with SIGBUS.
  int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    ::close(fd);
    return make_error(ErrorCode::permission_denied, "landing segment is not a memfd sealed "
                      "against shrinking");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < min_bytes) {
    ::close(fd);
    return make_error(ErrorCode::invalid_argument,
                      "landing segment holds fewer than the {} bytes to write", min_bytes);
  }
  Key key{st.st_dev, st.st_ino};
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.first->size >= min_bytes) {
    ::close(fd);
    lru_.splice(lru_.begin(), lru_, it->second.second);
    return it->second.first;
  }
  auto m = std::make_shared<Mapping>();
  m->size = static_cast<uint64_t>(st.st_size);
  void* p = ::mmap(nullptr, m->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    return make_error(ErrorCode::io_error, "mmap(peer landing segment): {}", std::strerror(errno));
  }
  m->addr = static_cast<uint8_t*>(p);
  if (it != entries_.end()) {  // same inode, grown: replace
    bytes_ -= it->second.first->size;
    lru_.erase(it->second.second);
    entries_.erase(it);
  }
  lru_.push_front(key);
  entries_[key] = {m, lru_.begin()};
  bytes_ += m->size;
  // Down to no entry at all: the caller's reference keeps `m` mapped for this transfer.
  while (bytes_ > max_bytes_ && !lru_.empty()) {
    auto victim = entries_.find(lru_.back());
    bytes_ -= victim->second.first->size;
    entries_.erase(victim);
    lru_.pop_back();
    ++evicted_;
  }
  return m;
}

MappingCacheStats MappingCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return MappingCacheStats{bytes_, entries_.size(), evicted_};
}

}  // namespace tessera::runtime::internal
