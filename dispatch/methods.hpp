// methods.hpp: the method registry, Tessera's equivalent of verl's `@register`.
//
// A worker class builds a MethodTable: for each method its MethodSpec {name, dispatch_mode,
// execute_mode, blocking} and the function that runs it on a rank. The WorkerGroup reads the
// specs (to split, call and collect); the worker actor shell invokes the functions by name.
// Colocated roles (verl's create_colocated_worker_cls) merge several tables into one actor with
// methods prefixed "{role}_{method}"; each role's WorkerGroup view strips the prefix again.
//
// Thread-safety: a MethodTable is built once, then only read (concurrent reads are fine).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "dispatch/modes.hpp"
#include "dispatch/value.hpp"
#include "proto/status.hpp"

namespace tessera::dispatch {

/// What `@register(dispatch_mode, execute_mode, blocking, materialize_futures)` records.
struct MethodSpec {
  std::string name;
  std::string dispatch_mode = Dispatch::ALL_TO_ALL;  ///< verl's default.
  ExecuteMode execute_mode = ExecuteMode::all;
  bool blocking = true;
  bool materialize_futures = true;  ///< Resolve FutureRef args on the worker before the body runs.
};

/// The body of a registered method: runs on one rank with that rank's args.
using MethodFn = std::function<Result<Value>(const Args&)>;

/// name -> (spec, function) for one worker class (or one colocated actor).
class MethodTable {
 public:
  /// Registers a method. Errors: empty or duplicate name, a dispatch mode unknown to
  /// DispatchRegistry::global(), an empty function.
  Status add(MethodSpec spec, MethodFn fn);
  /// Same, with a literal mode: add("update_actor", Dispatch::DP_COMPUTE_PROTO, fn).
  Status add(const std::string& name, const std::string& dispatch_mode, MethodFn fn);

  /// The spec of `name`; not_found lists the registered names.
  Result<MethodSpec> spec(const std::string& name) const;
  /// Runs `name` with `args`. Errors: unknown method; otherwise whatever the method returns.
  /// Exceptions are NOT caught here; the worker actor shell catches them once.
  Result<Value> invoke(const std::string& name, const Args& args) const;
  /// Every spec, sorted by name.
  std::vector<MethodSpec> specs() const;
  bool contains(const std::string& name) const { return methods_.count(name) > 0; }
  size_t size() const { return methods_.size(); }

  /// Adds every method of `role_table` as "{role}_{name}" (verl's WorkerDict). Error on a clash.
  Status merge_with_prefix(const std::string& role, const MethodTable& role_table);

 private:
  struct Entry {
    MethodSpec spec;
    MethodFn fn;
  };
  std::map<std::string, Entry> methods_;
};

/// The specs of one role inside a colocated table: methods named "{role}_{x}" come back named
/// "x" (what the role's WorkerGroup view exposes). Methods of other roles are left out.
std::vector<MethodSpec> role_view(const std::vector<MethodSpec>& colocated, const std::string& role);

}  // namespace tessera::dispatch
