// runtime_calls.cpp: Runtime's spawning and calling (split from runtime.cpp for size).
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "runtime/errors.hpp"
#include "runtime/runtime.hpp"
#include "runtime/wire.hpp"

namespace tessera::runtime {
namespace {

const Node* node_for(const std::vector<Node>& nodes, const NodeDevices& nd) {
  for (const Node& n : nodes) {
    if (n.address == nd.address) return &n;
  }
  return nullptr;
}

std::string master_host(const Node& node) {
  if (node.local) return "127.0.0.1";
  return node.address.substr(0, node.address.rfind(':'));
}

}  // namespace

Result<std::vector<WorkerRef>> Runtime::spawn_workers(const std::string& group,
                                                      const ResourcePool& pool,
                                                      const std::vector<RoleSpec>& roles) {
  std::vector<const Node*> where;
  for (const Placement& p : pool.placements()) {
    const Node* n = node_for(nodes_, pool.nodes()[p.node]);
    if (n == nullptr) {
      return make_error(ErrorCode::not_found, "resource pool names node {}, not connected",
                        pool.nodes()[p.node].address);
    }
    where.push_back(n);
  }
  TESSERA_ASSIGN_OR_RETURN(uint16_t master_port, rendezvous_port(*where[0]));
  caf::scoped_actor self{system()};
  using Handle = decltype(self->request(caf::actor{}, Millis{}, caf::spawn_atom::value,
                                        SpawnRequest{}));
  std::vector<Handle> pending;
  std::vector<WorkerContext> contexts;
  for (const Placement& p : pool.placements()) {
    const Node& n = *where[p.rank];
    WorkerContext c{group, p.rank, pool.world_size(), p.local_rank, p.local_world_size,
                    p.device, n.info.host, master_host(*where[0]), master_port};
    contexts.push_back(c);
    pending.push_back(self->request(n.agent, config_.spawn_timeout, caf::spawn_atom::value,
                                    SpawnRequest{c, roles}));
  }
  std::vector<WorkerRef> out;
  Status first;
  for (size_t r = 0; r < pending.size(); ++r) {
    pending[r].receive(
        [&](caf::actor& a) {
          out.push_back(WorkerRef{a, contexts[r], where[r]->local, where[r]->agent,
                                  std::make_shared<const std::string>(worker_label(contexts[r]))});
        },
        [&](caf::error& e) {
          if (first.ok()) {
            first = to_status(e).with_context(fmt::format("spawning rank {} of '{}' on {}", r,
                                                          group, where[r]->address));
          }
        });
  }
  if (!first.ok()) {
    for (auto& w : out) caf::anon_send_exit(w.actor, caf::exit_reason::user_shutdown);
    return first;
  }
  for (auto& w : out) hub_->watch_worker(w);
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& w : out) spawned_.push_back(w.actor);
  return out;
}

Result<std::vector<MethodInfo>> Runtime::methods(const WorkerRef& worker) {
  caf::scoped_actor self{system()};
  Status st;
  std::vector<MethodInfo> out;
  self->request(worker.actor, config_.call_timeout, methods_atom::value)
      .receive([&](std::vector<MethodInfo>& m) { out = std::move(m); },
               [&](caf::error& e) { st = to_status(e); });
  if (!st.ok()) return st.with_context(fmt::format("methods of rank {}", worker.context.rank));
  return out;
}

Result<std::vector<WireValue>> Runtime::encode_args(const WorkerRef& worker,
                                                    const std::vector<Value>& args,
                                                    std::vector<PayloadHandle>& published) {
  EncodeOptions opts{!worker.local, 1, config_.inline_payload_max_bytes, worker.local};
  std::vector<WireValue> out;
  out.reserve(args.size());
  for (const Value& v : args) {
    TESSERA_ASSIGN_OR_RETURN(WireValue w, to_wire(v, *data_plane_, opts, &published));
    out.push_back(std::move(w));
  }
  return out;
}

std::shared_ptr<CallBatch> Runtime::call_wire(const std::vector<WorkerRef>& workers,
                                              std::vector<CallRequest> requests,
                                              const CallOptions& options) {
  if (options.keep_results) {
    for (auto& r : requests) r.result_mode = static_cast<uint8_t>(ResultMode::keep);
  }
  return hub_->call(workers, std::move(requests), options.timeout);
}

void Runtime::release_all(const std::vector<PayloadHandle>& handles) {
  for (const PayloadHandle& h : handles) {
    Status st = data_plane_->release(h);
    if (!st.ok() && st.code() != ErrorCode::not_found) {
      spdlog::warn("releasing payload {}: {}", h.id, st.to_string());
    }
  }
}

Result<std::vector<WireValue>> first_error(std::vector<Result<WireValue>> results) {
  std::vector<WireValue> out;
  out.reserve(results.size());
  Status first;            // the first real failure; cancelled only when there is none
  size_t failed = 0, cancelled = 0;
  for (auto& r : results) {
    if (r.ok()) {
      out.push_back(std::move(r).value());
      continue;
    }
    bool is_cancel = r.status().code() == ErrorCode::cancelled;
    (is_cancel ? cancelled : failed) += 1;
    if (first.ok() || (!is_cancel && first.code() == ErrorCode::cancelled)) first = r.status();
  }
  if (failed + cancelled == 0) return out;
  std::string more;
  if (failed > 1) more = fmt::format("{} more rank(s) failed", failed - 1);
  if (cancelled > 0 && failed > 0) {
    more += fmt::format("{}{} rank(s) given up unanswered", more.empty() ? "" : ", ", cancelled);
  }
  if (more.empty()) return first;
  return Status(first.code(), fmt::format("{} ({})", first.message(), more));
}

Result<std::vector<Value>> Runtime::call(const std::vector<WorkerRef>& workers,
                                         const std::string& method,
                                         const std::vector<std::vector<Value>>& args_per_rank,
                                         const CallOptions& options) {
  if (args_per_rank.size() != workers.size()) {
    return make_error(ErrorCode::invalid_argument, "call '{}': {} argument lists for {} ranks",
                      method, args_per_rank.size(), workers.size());
  }
  std::vector<PayloadHandle> published;
  std::vector<CallRequest> requests(workers.size());
  for (size_t i = 0; i < workers.size(); ++i) {
    requests[i].method = method;
    Result<std::vector<WireValue>> a = encode_args(workers[i], args_per_rank[i], published);
    if (!a.ok()) {
      release_all(published);
      return a.status();
    }
    requests[i].args = std::move(a).value();
  }
  CallOptions blocking = options;
  blocking.keep_results = false;
  std::vector<Result<WireValue>> results = call_wire(workers, std::move(requests), blocking)->wait();
  release_all(published);
  std::vector<PayloadHandle> result_payloads;
  for (auto& r : results) {
    if (!r.ok()) continue;
    for (auto& h : payload_handles(*r)) result_payloads.push_back(h);
  }
  Result<std::vector<WireValue>> wires = first_error(std::move(results));
  if (!wires.ok()) {
    release_all(result_payloads);  // the ranks that succeeded: nobody will fetch theirs
    return wires.status();
  }
  return from_wire_many(*wires, *data_plane_, /*consume=*/true);
}

void Runtime::shutdown() {
  std::vector<caf::actor> workers;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (shut_down_) return;
    shut_down_ = true;
    workers.swap(spawned_);
  }
  for (auto& w : workers) caf::anon_send_exit(w, caf::exit_reason::user_shutdown);
  hub_.reset();
  if (!actors_) return;  // start() failed before the actor system existed
  if (!actors_->shutdown()) {
    (void)data_plane_.release();  // Note [Bounded shutdown]: abandoned actors may still use it.
  }
}

}  // namespace tessera::runtime
