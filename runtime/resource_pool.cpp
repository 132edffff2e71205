// resource_pool.cpp: stable rank placement.
#include "runtime/resource_pool.hpp"

#include <algorithm>
#include <set>

namespace tessera::runtime {
namespace {

std::pair<std::string, long> split_device(const std::string& d) {
  auto colon = d.find(':');
  if (colon == std::string::npos) return {d, -1};
  try {
    return {d.substr(0, colon), std::stol(d.substr(colon + 1))};
  } catch (const std::exception&) {
    return {d, -1};
  }
}

Status check_node(const NodeDevices& n) {
  std::set<std::string> seen;
  for (const auto& d : n.devices) {
    if (!seen.insert(d).second) {
      return make_error(ErrorCode::invalid_argument, "node {} lists device '{}' twice", n.address, d);
    }
  }
  return Status();
}

}  // namespace

bool device_less(const std::string& a, const std::string& b) {
  auto [ka, ia] = split_device(a);
  auto [kb, ib] = split_device(b);
  if (ka != kb) return ka < kb;
  if (ia != ib) return ia < ib;
  return a < b;
}

Result<ResourcePool> ResourcePool::make(std::vector<NodeDevices> nodes,
                                        const std::vector<int>& process_on_nodes) {
  std::sort(nodes.begin(), nodes.end(), [](const NodeDevices& a, const NodeDevices& b) {
    return std::tie(a.host, a.address) < std::tie(b.host, b.address);
  });
  if (!process_on_nodes.empty() && process_on_nodes.size() != nodes.size()) {
    return make_error(ErrorCode::invalid_argument,
                      "process_on_nodes has {} entries for {} nodes", process_on_nodes.size(),
                      nodes.size());
  }
  ResourcePool pool;
  for (size_t n = 0; n < nodes.size(); ++n) {
    TESSERA_RETURN_IF_ERROR(check_node(nodes[n]));
    std::sort(nodes[n].devices.begin(), nodes[n].devices.end(), device_less);
    int take = process_on_nodes.empty() ? static_cast<int>(nodes[n].devices.size())
                                        : process_on_nodes[n];
    if (take < 0 || take > static_cast<int>(nodes[n].devices.size())) {
      return make_error(ErrorCode::invalid_argument, "node {} has {} devices; {} requested",
                        nodes[n].address, nodes[n].devices.size(), take);
    }
    for (int i = 0; i < take; ++i) {
      Placement p;
      p.rank = static_cast<int32_t>(pool.placements_.size());
      p.node = n;
      p.device = nodes[n].devices[i];
      p.local_rank = i;
      p.local_world_size = take;
      pool.placements_.push_back(p);
    }
  }
  if (pool.placements_.empty()) {
    return make_error(ErrorCode::invalid_argument, "resource pool has no devices");
  }
  pool.nodes_ = std::move(nodes);
  return pool;
}

}  // namespace tessera::runtime
