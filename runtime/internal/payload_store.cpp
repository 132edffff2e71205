#include "runtime/internal/payload_store.hpp"

namespace tessera::runtime::internal {

uint64_t tensor_bytes(const proto::DataProto& data) {
  uint64_t total = 0;
  for (const auto& [key, t] : data.batch()) total += t.numel() * t.element_size();
  return total;
}

PayloadStore::Ticket PayloadStore::put(proto::DataProto data, uint32_t consumers) {
  uint64_t bytes = tensor_bytes(data);
  std::lock_guard<std::mutex> lock(mutex_);
  Ticket t{next_id_++, rng_(), bytes};
  entries_.emplace(t.id, Entry{std::move(data), t.key, bytes, consumers});
  total_bytes_ += bytes;
  return t;
}

Result<proto::DataProto> PayloadStore::get(uint64_t id, uint64_t key, bool consume) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.key != key) {
    return make_error(ErrorCode::not_found, "payload {} is not served here (released or consumed)",
                      id);
  }
  proto::DataProto out = it->second.data;
  if (consume && it->second.remaining > 0 && --it->second.remaining == 0) {
    total_bytes_ -= it->second.bytes;
    entries_.erase(it);
  }
  return out;
}

Status PayloadStore::release(uint64_t id, uint64_t key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.key != key) {
    return make_error(ErrorCode::not_found, "payload {} is not served here (released or consumed)",
                      id);
  }
  total_bytes_ -= it->second.bytes;
  entries_.erase(it);
  return Status();
}

size_t PayloadStore::count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

uint64_t PayloadStore::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return total_bytes_;
}

}  // namespace tessera::runtime::internal
