#include "dispatch/methods.hpp"

namespace tessera::dispatch {

Status MethodTable::add(MethodSpec spec, MethodFn fn) {
  if (spec.name.empty()) return make_error(ErrorCode::invalid_argument, "method name must not be empty");
  if (!fn) return make_error(ErrorCode::invalid_argument, "method '{}' has no function", spec.name);
  if (methods_.count(spec.name))
    return make_error(ErrorCode::already_exists, "method '{}' is registered twice", spec.name);
  if (!DispatchRegistry::global().contains(spec.dispatch_mode))
    return make_error(ErrorCode::invalid_argument, "method '{}': unknown dispatch mode '{}'", spec.name,
                      spec.dispatch_mode);
  std::string name = spec.name;
  methods_.emplace(std::move(name), Entry{std::move(spec), std::move(fn)});
  return Status();
}

Status MethodTable::add(const std::string& name, const std::string& dispatch_mode, MethodFn fn) {
  MethodSpec spec;
  spec.name = name;
  spec.dispatch_mode = dispatch_mode;
  return add(std::move(spec), std::move(fn));
}

Result<MethodSpec> MethodTable::spec(const std::string& name) const {
  auto it = methods_.find(name);
  if (it != methods_.end()) return it->second.spec;
  std::string known;
  for (const auto& [n, e] : methods_) known += (known.empty() ? "" : ", ") + n;
  return make_error(ErrorCode::not_found, "no method '{}' (registered: {})", name, known);
}

Result<Value> MethodTable::invoke(const std::string& name, const Args& args) const {
  auto it = methods_.find(name);
  if (it == methods_.end()) return spec(name).status();
  return it->second.fn(args);
}

std::vector<MethodSpec> MethodTable::specs() const {
  std::vector<MethodSpec> out;
  out.reserve(methods_.size());
  for (const auto& [n, e] : methods_) out.push_back(e.spec);
  return out;
}

Status MethodTable::merge_with_prefix(const std::string& role, const MethodTable& role_table) {
  if (role.empty()) return make_error(ErrorCode::invalid_argument, "colocated role name must not be empty");
  for (const auto& [n, e] : role_table.methods_) {
    if (methods_.count(role + "_" + n))
      return make_error(ErrorCode::already_exists, "colocated method '{}_{}' clashes", role, n);
  }
  for (const auto& [n, e] : role_table.methods_) {
    MethodSpec spec = e.spec;
    spec.name = role + "_" + n;
    methods_.emplace(spec.name, Entry{spec, e.fn});
  }
  return Status();
}

std::vector<MethodSpec> role_view(const std::vector<MethodSpec>& colocated, const std::string& role) {
  const std::string prefix = role + "_";
  std::vector<MethodSpec> out;
  for (const auto& s : colocated) {
    if (s.name.size() > prefix.size() && s.name.compare(0, prefix.size(), prefix) == 0) {
      MethodSpec v = s;
      v.name = s.name.substr(prefix.size());
      out.push_back(std::move(v));
    }
  }
  return out;
}

}  // namespace tessera::dispatch
