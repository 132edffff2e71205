#include "runtime/worker.hpp"

#include <fmt/format.h>

namespace tessera::runtime {

void Worker::register_method(const std::string& name, Method fn, nlohmann::json attributes) {
  methods_[name] = MethodEntry{std::move(fn), std::move(attributes)};
}

Status WorkerTypeRegistry::add(const std::string& type_name, WorkerFactory factory) {
  if (type_name.empty()) return make_error(ErrorCode::invalid_argument, "empty worker type name");
  if (!factory) {
    return make_error(ErrorCode::invalid_argument, "worker type '{}': empty factory", type_name);
  }
  if (!factories_.emplace(type_name, std::move(factory)).second) {
    return make_error(ErrorCode::already_exists, "worker type '{}' is already registered",
                      type_name);
  }
  return Status();
}

Result<WorkerFactory> WorkerTypeRegistry::find(const std::string& type_name) const {
  auto it = factories_.find(type_name);
  if (it != factories_.end()) return it->second;
  return make_error(ErrorCode::not_found, "unknown worker type '{}' (registered: {})", type_name,
                    fmt::join(names(), ", "));
}

std::vector<std::string> WorkerTypeRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [name, factory] : factories_) out.push_back(name);
  return out;
}

std::string qualified_method_name(const std::string& role, const std::string& method) {
  return role.empty() ? method : role + "_" + method;
}

}  // namespace tessera::runtime
