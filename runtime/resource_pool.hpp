// resource_pool.hpp: pools of nodes x devices and the placement of ranks on them.
//
// Ranks follow a stable order: nodes sorted by host name (then agent address), devices by
// kind then ordinal ("cpu:2" < "cpu:10"). The same cluster therefore gives every rank the same
// device after a restart, which is what keeps per-rank sharded checkpoints valid (verl sorts
// its placement groups by node IP for the same reason).
//
// Thread-safety: immutable after make().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "proto/status.hpp"

namespace tessera::runtime {

/// One node's devices, as its agent advertised them.
struct NodeDevices {
  std::string host;                  ///< Host name (sort key).
  std::string address;               ///< Agent address "host:port", or "embedded".
  std::vector<std::string> devices;  ///< "cpu:0", "cuda:3", ...
};

/// Where one rank runs.
struct Placement {
  int32_t rank = 0;
  size_t node = 0;            ///< Index into ResourcePool::nodes().
  std::string device;
  int32_t local_rank = 0;     ///< Rank among this pool's ranks on the node.
  int32_t local_world_size = 1;
};

/// verl's ResourcePool: a set of devices on nodes with a fixed rank order.
class ResourcePool {
 public:
  /// A pool over `nodes`. With `process_on_nodes` (verl's argument, one count per node in the
  /// sorted node order) only the first k devices of each node are used; empty uses them all.
  /// Errors: no devices, a count larger than a node's devices, counts/nodes length mismatch,
  /// a duplicate device on one node.
  static Result<ResourcePool> make(std::vector<NodeDevices> nodes,
                                   const std::vector<int>& process_on_nodes = {});

  /// Number of ranks.
  int32_t world_size() const { return static_cast<int32_t>(placements_.size()); }
  /// Placement of every rank, in rank order.
  const std::vector<Placement>& placements() const { return placements_; }
  /// The nodes, sorted.
  const std::vector<NodeDevices>& nodes() const { return nodes_; }

 private:
  std::vector<NodeDevices> nodes_;
  std::vector<Placement> placements_;
};

/// Orders device names: kind, then numeric ordinal.
bool device_less(const std::string& a, const std::string& b);

}  // namespace tessera::runtime
