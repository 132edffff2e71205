// worker_group.hpp: the driver-facing WorkerGroup (verl's RayWorkerGroup) and the adapter that
// turns a worker class with registered MethodSpecs into a runtime worker type.
//
//   auto wg = WorkerGroup::spawn(rt, "actor", pool, {{"", "echo", "{}"}});
//   Result<Value> out = (*wg)->call("compute_log_prob", {Value(batch)});
//
// call() reads the method's MethodSpec (registered by the worker class, fetched from rank 0
// once), splits the args with the spec's dispatch mode, calls the ranks of its execute mode in
// parallel through the runtime, and collects. A blocking method returns the collected value;
// a non-blocking one returns a FutureRef value at once. A FutureRef passed to another group's
// method is never materialised at the driver: each consumer rank receives the list of producer
// row ranges it needs (Note [Futures across groups] in dispatch/futures.hpp) and pulls them
// peer to peer over the data plane.
//
// Futures are single-use, like the temporaries verl passes them as: the producers' payloads
// are released as soon as one consuming call (or get()) is done with them. Using a FutureRef
// again is an error naming it; release() drops an unused one.
//
// Thread-safety: a WorkerGroup may be called from several threads; calls are independent.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "dispatch/methods.hpp"
#include "dispatch/modes.hpp"
#include "dispatch/value.hpp"
#include "proto/device.hpp"
#include "proto/status.hpp"
#include "runtime/runtime.hpp"
#include "runtime/worker.hpp"

namespace tessera::dispatch {

// ---- worker side -------------------------------------------------------------------------------

/// Base class of worker classes whose methods carry MethodSpecs (verl's Worker + @register).
class WorkerBase {
 public:
  /// REQUIRES: context.device parses (proto::parse_device). The worker shell refuses a device it
  /// cannot parse or reach before any factory runs, so the CPU default below is never taken for one.
  explicit WorkerBase(runtime::WorkerContext context)
      : context_(std::move(context)),
        device_(parsed_device(context_.device)) {}
  virtual ~WorkerBase() = default;

  /// Rank, world size, device and rendezvous of this worker.
  const runtime::WorkerContext& context() const { return context_; }
  /// The device everything this worker owns lives on (context().device, parsed). The worker
  /// shell makes it current on the actor's thread for every call.
  const c10::Device& device() const { return device_; }
  /// The methods; register them in the constructor.
  MethodTable& methods() { return methods_; }
  const MethodTable& methods() const { return methods_; }

  /// verl's _register_dispatch_collect_info: this rank consumes data chunk `dp_rank` of mesh
  /// `mesh`, and its output is gathered iff `is_collect`.
  void register_dispatch_collect_info(const std::string& mesh, int64_t dp_rank, bool is_collect);
  /// What was registered for `mesh`; not_found names the mesh and the rank.
  Result<std::pair<int64_t, bool>> dispatch_collect_info(const std::string& mesh) const;

 private:
  static c10::Device parsed_device(const std::string& name) {
    Result<c10::Device> d = proto::parse_device(name);
    return d.ok() ? *d : c10::Device(c10::DeviceType::CPU);
  }

  runtime::WorkerContext context_;
  c10::Device device_;
  MethodTable methods_;
  std::map<std::string, std::pair<int64_t, bool>> mesh_info_;
};

/// Builds a WorkerBase for one rank from its init config.
using WorkerBaseFactory = std::function<Result<std::unique_ptr<WorkerBase>>(
    const runtime::WorkerContext& context, const nlohmann::json& init_config)>;

/// Registers a WorkerBase class as a runtime worker type: every method keeps its MethodSpec as
/// attributes, and the built-in method "__dispatch_info__"(mesh) answers n-d queries.
Status register_worker_type(runtime::WorkerTypeRegistry& registry, const std::string& type_name,
                            WorkerBaseFactory factory);

/// Name of the built-in n-d query method.
inline constexpr const char* kDispatchInfoMethod = "__dispatch_info__";

/// MethodSpec <-> the JSON attributes the runtime carries.
nlohmann::json spec_to_json(const MethodSpec& spec);
Result<MethodSpec> spec_from_json(const std::string& name, const nlohmann::json& attributes);

// ---- driver side -------------------------------------------------------------------------------

/// Options of a WorkerGroup.
struct WorkerGroupOptions {
  /// Pad every DataProto arg of padding modes (verl's DataProtoConfig.auto_padding).
  bool auto_padding = false;
  /// Per-call deadline; 0: RuntimeConfig::call_timeout.
  runtime::Millis timeout{0};
  /// Whether in-process ranks cut their own rows of a DP call's DataProto arguments instead of
  /// the caller (Note [Chunks cut by the receiver] in runtime/wire.hpp). Unset: when this host
  /// has more hardware threads than the group has ranks, so that the ranks cut in parallel.
  std::optional<bool> cut_rows_on_receivers;
};

/// A group of worker actors called as one (verl's WorkerGroup).
class WorkerGroup {
 public:
  /// Spawns one worker per rank of `pool` hosting `roles` and reads rank 0's method specs.
  /// REQUIRES: `rt` outlives the group.
  static Result<std::shared_ptr<WorkerGroup>> spawn(runtime::Runtime& rt, const std::string& name,
                                                    const runtime::ResourcePool& pool,
                                                    const std::vector<runtime::RoleSpec>& roles,
                                                    WorkerGroupOptions options = {});
  /// verl's spawn(prefix_set) for colocated roles: a view on the same actors exposing the
  /// methods of `role` without their "{role}_" prefix. Error if no method has that prefix.
  Result<std::shared_ptr<WorkerGroup>> role(const std::string& role) const;

  const std::string& name() const { return name_; }
  int32_t world_size() const { return static_cast<int32_t>(workers_.size()); }
  const std::vector<runtime::WorkerRef>& workers() const { return workers_; }
  /// The specs this group exposes (prefix stripped for role views), sorted by name.
  std::vector<MethodSpec> methods() const;

  /// verl's wg.method(*args), by the method's spec: the collected value if blocking, else a
  /// FutureRef value. Errors name the group, the method and (for rank failures) the rank.
  Result<Value> call(const std::string& method, const Args& args);
  /// The same call, non-blocking regardless of the spec: a FutureRef.
  Result<FutureRef> call_async(const std::string& method, const Args& args);

  /// Blocks until the call behind `future` finished; its data stays on the producer ranks.
  /// The producer's error, if it failed.
  static Status wait(const FutureRef& future);
  /// Materialises a future at the driver (collects its outputs) and releases its payloads.
  static Result<Value> get(const FutureRef& future);
  /// Drops an unused future's payloads. not_found if it was already consumed or released.
  static Status release(const FutureRef& future);

 private:
  WorkerGroup() = default;
  Result<MethodSpec> find_spec(const std::string& method) const;
  Result<MeshDispatchInfo> mesh_info(const std::string& mesh);
  Result<Value> invoke(const MethodSpec& spec, const Args& args, bool blocking);

  runtime::Runtime* rt_ = nullptr;
  std::string name_;
  std::string prefix_;  // "{role}_" for role views
  std::vector<runtime::WorkerRef> workers_;
  std::map<std::string, MethodSpec> specs_;  // by exposed name
  WorkerGroupOptions options_;
  std::shared_ptr<std::mutex> mesh_mutex_ = std::make_shared<std::mutex>();
  std::shared_ptr<std::map<std::string, MeshDispatchInfo>> mesh_cache_ =
      std::make_shared<std::map<std::string, MeshDispatchInfo>>();
};

}  // namespace tessera::dispatch
