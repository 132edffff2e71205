// device_mesh.hpp: 1-D ("fsdp",) and 2-D ("ddp","fsdp") meshes over a world communicator.
//
// Ranks are laid out row-major, as torch's init_device_mesh does: in a (ddp=D, fsdp=F) mesh,
// rank r has coordinates (r / F, r % F); its "fsdp" group is the F ranks of its row and its
// "ddp" group the D ranks of its column. Each dimension gets its own sub-communicator, created
// collectively over the world (every rank constructs the same mesh, in the same order).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "proto/status.hpp"
#include "runtime/collective/communicator.hpp"

namespace tessera::collective {

/// A named arrangement of the world's ranks with one sub-communicator per dimension.
class DeviceMesh {
 public:
  /// verl's create_device_mesh: fsdp_size < 0 or >= world size gives the 1-D mesh ("fsdp",), whose
  /// group is `world` itself (no second communicator; `opts` only shape the sub-groups of a 2-D mesh);
  /// 0 < fsdp_size < world size gives the 2-D mesh ("ddp","fsdp") = (world/fsdp_size, fsdp_size).
  /// Errors: fsdp_size == 0, or a world size that fsdp_size does not divide (names both sizes).
  static Result<DeviceMesh> for_fsdp(std::shared_ptr<Communicator> world, int fsdp_size,
                                     const CollectiveOptions& opts = {});

  /// A mesh with explicit dimension names and sizes (1 or 2 dimensions, product = world size).
  static Result<DeviceMesh> create(std::shared_ptr<Communicator> world,
                                   std::vector<std::string> dim_names, std::vector<int> shape,
                                   const CollectiveOptions& opts = {});

  /// Number of dimensions (1 or 2).
  int ndim() const { return static_cast<int>(shape_.size()); }
  /// Dimension names, outermost first.
  const std::vector<std::string>& dim_names() const { return dim_names_; }
  /// Dimension sizes, outermost first.
  const std::vector<int>& shape() const { return shape_; }
  /// True when a dimension of that name exists.
  bool has_dim(const std::string& name) const;
  /// Index of dimension `name`; not_found names the mesh's dimensions.
  Result<int> dim_index(const std::string& name) const;
  /// Size of dimension `dim`. REQUIRES: 0 <= dim < ndim().
  int size(int dim) const { return shape_[dim]; }
  /// This rank's coordinate along `dim`. REQUIRES: 0 <= dim < ndim().
  int coordinate(int dim) const { return coords_[dim]; }
  /// World ranks of this rank's group along `dim`, ascending. REQUIRES: 0 <= dim < ndim().
  const std::vector<int>& group_members(int dim) const { return members_[dim]; }
  /// The sub-communicator along `dim`. REQUIRES: 0 <= dim < ndim().
  const std::shared_ptr<Communicator>& group(int dim) const { return groups_[dim]; }
  /// The sub-communicator along the dimension called `name`.
  Result<std::shared_ptr<Communicator>> group(const std::string& name) const;
  /// The world communicator the mesh was built over.
  const std::shared_ptr<Communicator>& world() const { return world_; }
  /// Coordinates of world rank `rank` (row-major). REQUIRES: 0 <= rank < world size.
  std::vector<int> coordinates_of(int rank) const;
  /// "(ddp=2, fsdp=2)".
  std::string to_string() const;

 private:
  DeviceMesh() = default;

  std::shared_ptr<Communicator> world_;
  std::vector<std::string> dim_names_;
  std::vector<int> shape_;
  std::vector<int> coords_;
  std::vector<std::vector<int>> members_;
  std::vector<std::shared_ptr<Communicator>> groups_;
};

}  // namespace tessera::collective
