// checkpoint_io.hpp (internal): file-level helpers of the sharded checkpoint.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "proto/status.hpp"
#include "workers/fsdp/flat_param.hpp"
#include "workers/models/safetensors.hpp"

namespace tessera::fsdp::internal {

inline constexpr const char* kManifestFormat = "tessera-fsdp-checkpoint";
inline constexpr int kManifestVersion = 1;

std::string model_file(int shard, int shards);
std::string optim_file(int shard, int shards);
std::string extra_file(int rank, int world);

/// Writes `text` to `path` through a temp file, fsync and rename.
Status write_text_atomic(const std::string& path, const std::string& text);
/// Reads a whole file.
Result<std::string> read_text(const std::string& path);
/// Removes `path` if present and creates it empty.
Status fresh_directory(const std::string& path);
/// Moves `tmp` to `dir`, atomically replacing an existing `dir`, and removes the old contents.
Status swap_into_place(const std::string& tmp, const std::string& dir);
/// `dir`, or "<dir>.old" when a non-atomic swap was interrupted between its two renames.
std::string resolve_checkpoint_dir(const std::string& dir);

/// Reads manifest.json, checks format/version/fields and that every listed file has its size.
Result<nlohmann::json> read_and_check_manifest(const std::string& dir);
/// The manifest's "optimizer_state" flag (true when absent: manifests before frozen modules).
Result<bool> manifest_has_optimizer_state(const nlohmann::json& manifest, const std::string& dir);
/// The unit layouts recorded in a manifest.
Result<std::vector<FlatLayout>> manifest_layouts(const nlohmann::json& manifest, const std::string& dir);
/// Same unit names, parameter names and shapes, in the same order.
Status check_same_units(const std::vector<FlatLayout>& saved, const std::vector<FlatLayout>& now,
                        const std::string& dir);

/// Lazily opened shard files of one checkpoint; re-cuts flat ranges out of them.
class ShardFiles {
 public:
  ShardFiles(std::string dir, int shard_count);
  /// [begin, end) of `tensor` ("model" or "optim" files) in the flat coordinates of `layout`,
  /// zeros beyond layout.numel, as `dtype` (default: the stored dtype).
  Result<at::Tensor> recut(const FlatLayout& layout, int64_t begin, int64_t end,
                           const std::string& kind, const std::string& tensor,
                           std::optional<c10::ScalarType> dtype);

 private:
  Result<const models::TensorMap*> open(const std::string& kind, int shard);
  std::string dir_;
  int shard_count_;
  std::map<std::string, models::SafetensorsContents> files_;
};

/// Restores the CPU generator from extra_state_rank_<rank % world>_of_<world>.
Status restore_rng(const std::string& dir, int rank, int saved_world);

/// HF's torch_dtype string for a scalar type ("bfloat16", "float32", ...).
std::string hf_dtype_name(c10::ScalarType dtype);

}  // namespace tessera::fsdp::internal
