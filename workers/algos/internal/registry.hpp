// registry.hpp: a name -> function table shared by the advantage-estimator and policy-loss
// registries (verl's ADV_ESTIMATOR_REGISTRY / POLICY_LOSS_REGISTRY). Thread-safe: every access
// takes the mutex, and get() returns a copy of the function so callers never hold the lock.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "proto/status.hpp"

namespace tessera::algos::internal {

template <class Fn>
class Registry {
 public:
  /// `kind` names the table in errors ("advantage estimator"), `key` the config key that selects it.
  Registry(std::string kind, std::string key, std::vector<std::pair<std::string, Fn>> builtins)
      : kind_(std::move(kind)), key_(std::move(key)) {
    for (auto& [name, fn] : builtins) fns_.emplace(name, std::move(fn));
  }

  /// Adds `fn` under `name`; already_exists when taken, invalid_argument for an empty name or fn.
  Status add(const std::string& name, Fn fn) {
    if (name.empty()) return make_error(ErrorCode::invalid_argument, "register {}: empty name", kind_);
    if (!fn) return make_error(ErrorCode::invalid_argument, "register {} '{}': empty function", kind_, name);
    std::lock_guard<std::mutex> lock(mu_);
    if (!fns_.emplace(name, std::move(fn)).second) {
      return make_error(ErrorCode::already_exists, "{} '{}' has already been registered", kind_, name);
    }
    return Status();
  }

  /// The function under `name`; not_found naming it and listing the known names otherwise.
  Result<Fn> get(const std::string& name) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = fns_.find(name);
    if (it != fns_.end()) return it->second;
    std::vector<std::string> known;
    for (const auto& entry : fns_) known.push_back(entry.first);
    return make_error(ErrorCode::not_found, "{}: unknown {} '{}' (known: {})", key_, kind_, name,
                      fmt::join(known, ", "));
  }

  /// Registered names, sorted.
  std::vector<std::string> names() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const auto& entry : fns_) out.push_back(entry.first);
    return out;
  }

 private:
  const std::string kind_;
  const std::string key_;
  mutable std::mutex mu_;
  std::map<std::string, Fn> fns_;
};

}  // namespace tessera::algos::internal
