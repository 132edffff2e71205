// data_plane.cpp: DataPlane glue between the store, the server and the client.
#include "runtime/data_plane.hpp"

#include <random>

#include "runtime/internal/dp_client.hpp"
#include "runtime/internal/dp_server.hpp"
#include "runtime/internal/payload_store.hpp"
#include "runtime/internal/shm.hpp"

namespace tessera::runtime {

Result<std::unique_ptr<DataPlane>> DataPlane::start(const DataPlaneConfig& config) {
  std::unique_ptr<DataPlane> dp(new DataPlane());
  dp->config_ = config;
  std::random_device rd;
  while (dp->owner_ == 0) dp->owner_ = (uint64_t{rd()} << 32) ^ rd();
  dp->host_ = config.advertise_host;
  if (dp->host_.empty()) {
    bool wildcard = config.bind_host == "0.0.0.0" || config.bind_host == "::";
    dp->host_ = wildcard ? internal::host_name() : config.bind_host;
  }
  dp->store_ = std::make_unique<internal::PayloadStore>();
  dp->counters_ = std::make_unique<Counters>();
  TESSERA_ASSIGN_OR_RETURN(dp->server_, internal::DataPlaneServer::start(
                                            config, dp->owner_, *dp->store_, *dp->counters_));
  dp->client_ = std::make_unique<internal::DataPlaneClient>(config, *dp->counters_);
  return dp;
}

DataPlane::~DataPlane() {
  server_.reset();  // stop serving before the store goes
}

uint16_t DataPlane::port() const { return server_->port(); }

PayloadHandle DataPlane::publish(proto::DataProto data, uint32_t consumers) {
  int64_t rows = data.size();
  internal::PayloadStore::Ticket t = store_->put(std::move(data), consumers);
  PayloadHandle h;
  h.host = host_;
  h.port = server_->port();
  h.host_id = internal::machine_id();
  h.owner = owner_;
  h.id = t.id;
  h.key = t.key;
  h.bytes = t.bytes;
  h.rows = rows;
  return h;
}

Result<proto::DataProto> DataPlane::fetch(const PayloadSlice& slice, bool consume) {
  if (!is_local(slice.handle)) {
    auto results = client_->fetch_all({slice}, consume);
    return std::move(results[0]);
  }
  counters_->local_fetches++;
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto data,
                           store_->get(slice.handle.id, slice.handle.key, consume));
  int64_t rows = data.size();
  if (slice.row_begin < 0 || slice.row_end < slice.row_begin || slice.row_end > rows) {
    return make_error(ErrorCode::out_of_range, "payload {}: rows [{}, {}) requested, it has {}",
                      slice.handle.id, slice.row_begin, slice.row_end, rows);
  }
  if (slice.row_begin == 0 && slice.row_end == rows) return data;
  return data.slice(slice.row_begin, slice.row_end);
}

std::vector<Result<proto::DataProto>> DataPlane::fetch_all(
    const std::vector<PayloadSlice>& slices, bool consume) {
  std::vector<Result<proto::DataProto>> out(
      slices.size(), Result<proto::DataProto>(Status(ErrorCode::internal, "not fetched")));
  std::vector<PayloadSlice> remote;
  std::vector<size_t> remote_index;
  for (size_t i = 0; i < slices.size(); ++i) {
    if (is_local(slices[i].handle)) {
      out[i] = fetch(slices[i], consume);
    } else {
      remote.push_back(slices[i]);
      remote_index.push_back(i);
    }
  }
  if (remote.empty()) return out;
  auto fetched = client_->fetch_all(remote, consume);
  for (size_t j = 0; j < remote.size(); ++j) out[remote_index[j]] = std::move(fetched[j]);
  return out;
}

Status DataPlane::release(const PayloadHandle& handle) {
  if (is_local(handle)) return store_->release(handle.id, handle.key);
  return client_->release(handle);
}

DataPlaneStats DataPlane::stats() const {
  DataPlaneStats s;
  s.payloads = store_->count();
  s.payload_bytes = store_->bytes();
  s.served_tcp_bytes = counters_->served_tcp_bytes;
  s.served_shm_bytes = counters_->served_shm_bytes;
  s.fetched_remote_bytes = counters_->fetched_remote_bytes;
  s.local_fetches = counters_->local_fetches;
  s.remote_fetches = counters_->remote_fetches;
  s.bad_requests = counters_->bad_requests;
  internal::ShmPoolStats landings = client_->landings().stats();
  s.landing_idle_bytes = landings.idle_bytes;
  s.landing_idle_segments = landings.idle_segments;
  s.landing_segments_created = landings.created;
  s.landing_segments_destroyed = landings.destroyed;
  internal::MappingCacheStats mappings = server_->mappings().stats();
  s.peer_mapped_bytes = mappings.mapped_bytes;
  s.peer_mappings = mappings.mappings;
  s.peer_mappings_evicted = mappings.evicted;
  return s;
}

}  // namespace tessera::runtime
