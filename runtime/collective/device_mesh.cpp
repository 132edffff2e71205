// device_mesh.cpp: row-major rank layout and per-dimension sub-communicators.
#include "runtime/collective/device_mesh.hpp"

#include <torch/torch.h>

#include <numeric>

namespace tessera::collective {
namespace {

std::string describe(const std::vector<std::string>& names) {
  return fmt::format("({})", fmt::join(names, ", "));
}

Status check_shape(const std::vector<std::string>& names, const std::vector<int>& shape,
                   int world_size) {
  std::string mesh = "device mesh " + describe(names);
  if (names.empty() || names.size() > 2 || names.size() != shape.size()) {
    return make_error(ErrorCode::invalid_argument,
                      "{}: needs 1 or 2 dimensions with one size each, got {} names and {} sizes",
                      mesh, names.size(), shape.size());
  }
  if (names.size() == 2 && names[0] == names[1]) {
    return make_error(ErrorCode::invalid_argument, "{}: dimension names must differ", mesh);
  }
  int64_t product = 1;
  for (int s : shape) {
    if (s < 1) return make_error(ErrorCode::invalid_argument, "{}: size {} must be >= 1", mesh, s);
    product *= s;
  }
  if (product != world_size) {
    return make_error(ErrorCode::invalid_argument,
                      "{}: shape {} has {} ranks but the world size is {}", mesh,
                      fmt::join(shape, "x"), product, world_size);
  }
  return Status();
}

}  // namespace

Result<DeviceMesh> DeviceMesh::for_fsdp(std::shared_ptr<Communicator> world, int fsdp_size,
                                        const CollectiveOptions& opts) {
  if (!world) return make_error(ErrorCode::invalid_argument, "device mesh: world is null");
  int n = world->size();
  if (fsdp_size < 0 || fsdp_size >= n) {
    // The shard group is the whole world: its group is the world's communicator itself rather than
    // a second one over the same ranks in the same order (on GPUs every NCCL communicator holds
    // device buffers and a proxy thread; each FSDP module of a worker would add one). A worker's
    // calls on it come one at a time, as on the world. Sharing it, a failed FSDP collective marks
    // the world broken too, and the world's own calls queue behind FSDP's (one stream on a GPU).
    DeviceMesh mesh;
    mesh.dim_names_ = {"fsdp"};
    mesh.shape_ = {n};
    mesh.coords_ = {world->rank()};
    std::vector<int> members(static_cast<size_t>(n));
    std::iota(members.begin(), members.end(), 0);
    mesh.members_ = {std::move(members)};
    mesh.groups_ = {world};
    mesh.world_ = std::move(world);
    return mesh;
  }
  if (fsdp_size == 0) {
    return make_error(ErrorCode::invalid_argument,
                      "device mesh (ddp, fsdp): fsdp_size 0 is invalid (use -1 for the whole "
                      "world of {})", n);
  }
  if (n % fsdp_size != 0) {
    return make_error(ErrorCode::invalid_argument,
                      "device mesh (ddp, fsdp): world size {} is not divisible by fsdp_size {}",
                      n, fsdp_size);
  }
  return create(std::move(world), {"ddp", "fsdp"}, {n / fsdp_size, fsdp_size}, opts);
}

Result<DeviceMesh> DeviceMesh::create(std::shared_ptr<Communicator> world,
                                      std::vector<std::string> dim_names, std::vector<int> shape,
                                      const CollectiveOptions& opts) {
  if (!world) return make_error(ErrorCode::invalid_argument, "device mesh: world is null");
  TESSERA_RETURN_IF_ERROR(check_shape(dim_names, shape, world->size()));
  DeviceMesh mesh;
  mesh.world_ = std::move(world);
  mesh.dim_names_ = std::move(dim_names);
  mesh.shape_ = std::move(shape);
  mesh.coords_ = mesh.coordinates_of(mesh.world_->rank());
  for (int d = 0; d < mesh.ndim(); ++d) {
    std::vector<int> members;
    for (int r = 0; r < mesh.world_->size(); ++r) {
      std::vector<int> c = mesh.coordinates_of(r);
      bool same = true;
      for (int e = 0; e < mesh.ndim(); ++e) same = same && (e == d || c[e] == mesh.coords_[e]);
      if (same) members.push_back(r);
    }
    auto group = mesh.world_->new_subgroup(members, mesh.dim_names_[d], opts);
    if (!group.ok()) return group.status().with_context("device mesh " + mesh.to_string());
    mesh.members_.push_back(std::move(members));
    mesh.groups_.push_back(std::move(*group));
  }
  return mesh;
}

bool DeviceMesh::has_dim(const std::string& name) const {
  return std::find(dim_names_.begin(), dim_names_.end(), name) != dim_names_.end();
}

Result<int> DeviceMesh::dim_index(const std::string& name) const {
  auto it = std::find(dim_names_.begin(), dim_names_.end(), name);
  if (it == dim_names_.end()) {
    return make_error(ErrorCode::not_found, "device mesh {} has no dimension '{}'", to_string(),
                      name);
  }
  return static_cast<int>(it - dim_names_.begin());
}

Result<std::shared_ptr<Communicator>> DeviceMesh::group(const std::string& name) const {
  TESSERA_ASSIGN_OR_RETURN(int d, dim_index(name));
  return groups_[d];
}

std::vector<int> DeviceMesh::coordinates_of(int rank) const {
  std::vector<int> c(shape_.size());
  for (int d = ndim() - 1; d >= 0; --d) {
    c[d] = rank % shape_[d];
    rank /= shape_[d];
  }
  return c;
}

std::string DeviceMesh::to_string() const {
  std::vector<std::string> parts;
  for (int d = 0; d < ndim(); ++d) parts.push_back(fmt::format("{}={}", dim_names_[d], shape_[d]));
  return fmt::format("({})", fmt::join(parts, ", "));
}

}  // namespace tessera::collective
