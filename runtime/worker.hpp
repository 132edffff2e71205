// worker.hpp: the plain worker object a worker actor wraps, its method table, and the registry
// of worker TYPES by name that agents spawn from.
//
// A worker type (ActorRolloutRefWorker, CriticWorker, a test echo worker, ...) derives from
// Worker and registers its methods in its constructor:
//
//   class Echo : public runtime::Worker {
//    public:
//     explicit Echo(const WorkerContext& ctx) {
//       register_method("double_it", [](std::vector<Value>& args) -> Result<Value> { ... },
//                       {{"dispatch_mode", "DP_COMPUTE_PROTO"}});
//     }
//   };
//   registry.add("echo", [](const WorkerContext& ctx, const nlohmann::json& cfg)
//                            -> Result<std::unique_ptr<Worker>> { return std::make_unique<Echo>(ctx); });
//
// Method attributes are opaque JSON to the runtime; dispatch/ stores its MethodSpec there
// (dispatch_mode, execute_mode, blocking) and reads it back through methods_atom.
//
// Thread-safety: a Worker is used by exactly one actor thread. The registry is filled before
// the runtime starts and is read-only afterwards (concurrent find() is safe then).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "proto/status.hpp"
#include "runtime/messages.hpp"
#include "runtime/value.hpp"

namespace tessera::runtime {

/// A registered method: takes the (already resolved) arguments, returns a Value or an error.
/// It may throw; the worker actor catches every exception and turns it into an error.
using Method = std::function<Result<Value>(std::vector<Value>& args)>;

/// One entry of a method table.
struct MethodEntry {
  Method fn;
  nlohmann::json attributes;
};

/// name -> method, in name order.
using MethodTable = std::map<std::string, MethodEntry>;

/// Base class of every plain worker object.
class Worker {
 public:
  virtual ~Worker() = default;

  /// The methods this object serves.
  const MethodTable& methods() const { return methods_; }

 protected:
  /// Adds a method. REQUIRES: called from the constructor; `name` not registered yet (a
  /// duplicate replaces the earlier entry).
  void register_method(const std::string& name, Method fn,
                       nlohmann::json attributes = nlohmann::json::object());

 private:
  MethodTable methods_;
};

/// Builds a worker object for `context` from its init config; errors name the bad key.
using WorkerFactory = std::function<Result<std::unique_ptr<Worker>>(
    const WorkerContext& context, const nlohmann::json& init_config)>;

/// Worker types by name.
class WorkerTypeRegistry {
 public:
  /// Registers `factory` under `type_name`. Error (already_exists) if the name is taken.
  Status add(const std::string& type_name, WorkerFactory factory);
  /// The factory, or not_found naming the type and listing the registered ones.
  Result<WorkerFactory> find(const std::string& type_name) const;
  /// Registered names, sorted.
  std::vector<std::string> names() const;

 private:
  std::map<std::string, WorkerFactory> factories_;
};

/// "{role}_{method}" (verl's colocated naming), or `method` when role is empty.
std::string qualified_method_name(const std::string& role, const std::string& method);

}  // namespace tessera::runtime
