// worker_actor.cpp: the worker actor shell (see the header).
#include "runtime/worker_actor.hpp"

#include <algorithm>
#include <chrono>

#include <c10/util/Exception.h>
#include <caf/stateful_actor.hpp>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "proto/device.hpp"
#include "runtime/call_hub.hpp"
#include "runtime/errors.hpp"
#include "runtime/local_lane.hpp"
#include "runtime/wire.hpp"

namespace tessera::runtime {
namespace {

struct WorkerState {
  SpawnRequest request;
  WorkerHostEnv env;
  c10::Device device = c10::Device(c10::DeviceType::CPU);  // request.context.device, checked by init_roles
  std::vector<std::unique_ptr<Worker>> roles;
  std::map<std::string, const MethodEntry*> table;  // qualified name -> entry
  bool ready = false;
  static inline const char* name = "tessera.worker";
};

using WorkerActor = caf::stateful_actor<WorkerState>*;

// One line: newlines of multi-line exception texts become " | ".
std::string one_line(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  std::replace(text.begin(), text.end(), '\n', '|');
  return text;
}

// Runs `f`, turning any exception into a Status naming `what`. A device running out of memory is
// one line with the sizes (resource_exhausted), never an abort; the caller adds rank and method.
template <class F>
auto guarded(const std::string& what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::OutOfMemoryError& e) {
    return make_error(ErrorCode::resource_exhausted, "{} ran out of device memory: {}", what,
                      one_line(proto::out_of_memory_summary(e)));
  } catch (const c10::Error& e) {
    return make_error(ErrorCode::internal, "{} threw c10::Error: {}", what,
                      one_line(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, "{} threw: {}", what, one_line(e.what()));
  } catch (...) {
    return make_error(ErrorCode::internal, "{} threw a non-std exception", what);
  }
}

Result<std::unique_ptr<Worker>> build_role(const WorkerState& st, const RoleSpec& role) {
  TESSERA_ASSIGN_OR_RETURN(WorkerFactory factory, st.env.registry->find(role.type_name));
  nlohmann::json config = nlohmann::json::parse(role.init_config, nullptr, false);
  if (config.is_discarded()) {
    return make_error(ErrorCode::invalid_argument, "role '{}': init config is not valid JSON",
                      role.role);
  }
  std::string what = fmt::format("constructing worker type '{}'", role.type_name);
  return guarded(what, [&] { return factory(st.request.context, config); });
}

std::vector<MethodInfo> method_infos(const WorkerState& st) {
  std::vector<MethodInfo> out;
  for (const auto& [name, entry] : st.table) out.push_back(MethodInfo{name, entry->attributes.dump()});
  return out;
}

Status init_roles(WorkerState& st) {
  if (st.ready) return Status();
  if (st.request.roles.empty()) return make_error(ErrorCode::invalid_argument, "no roles given");
  TESSERA_ASSIGN_OR_RETURN(st.device, proto::parse_device(st.request.context.device));
  TESSERA_RETURN_IF_ERROR(proto::require_device(st.device));
  proto::DeviceScope on_device(st.device);  // the roles build their state on the worker's device
  for (const RoleSpec& role : st.request.roles) {
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<Worker> w, build_role(st, role));
    for (const auto& [name, entry] : w->methods()) {
      std::string q = qualified_method_name(role.role, name);
      if (!st.table.emplace(q, &entry).second) {
        return make_error(ErrorCode::already_exists, "two roles register method '{}'", q);
      }
    }
    st.roles.push_back(std::move(w));
  }
  st.ready = true;
  return Status();
}

Result<CallReply> invoke(WorkerState& st, const CallRequest& req, bool caller_remote) {
  if (!st.ready) return make_error(ErrorCode::unavailable, "worker is not initialised");
  auto it = st.table.find(req.method);
  if (it == st.table.end()) return make_error(ErrorCode::not_found, "no method '{}'", req.method);
  DataPlane& dp = *st.env.data_plane;
  Result<std::vector<Value>> resolved = from_wire_many(req.args, dp, /*consume=*/true);
  if (!resolved.ok()) return resolved.status().with_context("resolving the arguments");
  std::vector<Value> args = std::move(resolved).value();
  const MethodEntry* entry = it->second;
  proto::DeviceScope on_device(st.device);
  // SPDLOG_LEVEL=debug traces every call a worker runs (which method a rank is in, and for how
  // long), in the agent's log for remote workers.
  const bool trace = spdlog::should_log(spdlog::level::debug);
  const auto start = std::chrono::steady_clock::now();
  if (trace) spdlog::debug("{}: method '{}' begins", describe_worker(st.request.context), req.method);
  Result<Value> out = guarded("the method", [&] { return entry->fn(args); });
  if (trace) {
    spdlog::debug("{}: method '{}' {} after {:.3f} s", describe_worker(st.request.context), req.method,
                  out.ok() ? "returned" : "failed",
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  if (!out.ok()) return out.status();
  bool keep = req.result_mode == static_cast<uint8_t>(ResultMode::keep);
  EncodeOptions opts{caller_remote, keep ? 0u : 1u, keep ? 0 : st.env.inline_payload_max_bytes,
                     /*in_process=*/!caller_remote && !keep};
  TESSERA_ASSIGN_OR_RETURN(WireValue w, to_wire(std::move(*out), dp, opts));
  return CallReply{std::move(w)};
}

// Note [Late replies]: a result the caller no longer waits for frees what it published.
void answer(DataPlane& dp, ReplySlot& slot, WireValue result) {
  std::vector<PayloadHandle> handles = payload_handles(result);
  if (slot.set(std::move(result))) return;
  count_late_reply(handles.size());
  for (const PayloadHandle& h : handles) (void)dp.release(h);
}

// `lane`: the worker's own, which holds in-process replies (Note [Replies freed by their worker]).
void run_local_call(WorkerActor self, LocalCall& call, internal::LocalLane* lane) {
  Result<CallReply> r = invoke(self->state, call.request, call.caller_remote);
  if (r.ok()) {
    if (lane != nullptr && r->result.local) lane->hold(r->result.local);
    return answer(*self->state.env.data_plane, call.slot, std::move(r->result));
  }
  (void)call.slot.set(r.status().with_context(fmt::format(
      "{}, method '{}'", describe_worker(self->state.request.context), call.request.method)));
}

caf::behavior worker_behavior(WorkerActor self, SpawnRequest request, WorkerHostEnv env,
                              std::shared_ptr<internal::LocalLane> lane) {
  self->state.request = std::move(request);
  self->state.env = env;
  if (lane) {
    self->attach_functor([lane, addr = self->address()] {
      lane->close();
      internal::unregister_lane(addr);
    });
  }
  return {
      [=](init_atom) -> caf::result<std::vector<MethodInfo>> {
        Status st = init_roles(self->state);
        if (!st.ok()) return to_caf_error(st.with_context(describe_worker(self->state.request.context)));
        return method_infos(self->state);
      },
      [=](call_atom, const std::shared_ptr<LocalCall>& call) {
        if (lane) lane->took_mailed();
        run_local_call(self, *call, lane.get());
        if (lane) lane->poll([self, l = lane.get()](LocalCall& next) { run_local_call(self, next, l); });
      },
      [=](call_atom, const CallRequest& req) -> caf::result<CallReply> {
        const auto& sender = self->current_sender();
        bool remote = sender != nullptr && sender->node() != self->node();
        Result<CallReply> r = invoke(self->state, req, remote);
        if (r.ok()) return std::move(r).value();
        std::string where = fmt::format("{}, method '{}'", describe_worker(self->state.request.context),
                                        req.method);
        return to_caf_error(r.status().with_context(where));
      },
      [=](methods_atom) { return method_infos(self->state); },
      [=](context_atom) { return self->state.request.context; },
  };
}

}  // namespace

std::string describe_worker(const WorkerContext& c) {
  return fmt::format("rank {} ({} on {})", c.rank, c.device, c.host);
}

caf::actor spawn_worker_actor(caf::actor_system& system, SpawnRequest request, WorkerHostEnv env,
                              bool detached) {
  if (!detached) return system.spawn(worker_behavior, std::move(request), env, nullptr);
  // Note [Local lanes]: registered before anyone holds the handle, so no call can miss it.
  auto lane = std::make_shared<internal::LocalLane>(env.idle_poll);
  caf::actor worker = system.spawn<caf::detached>(worker_behavior, std::move(request), env, lane);
  internal::register_lane(worker.address(), std::move(lane));
  return worker;
}

}  // namespace tessera::runtime
