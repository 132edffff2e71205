// safetensors.hpp: HF's safetensors format, read zero-copy with mmap and written atomically.
//
// File layout: u64 little-endian header length N, N bytes of JSON header
// ({name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}), then the data.
//
// Reading: the file is mapped privately (MAP_PRIVATE, read+write, copy-on-write), and each tensor
// is an at::Tensor built with from_blob over the mapping. The mapping is reference-counted by the
// tensors' deleters, so it lives exactly as long as the last tensor that aliases it. Writing into
// a loaded tensor (an optimizer step) touches private pages only; the file never changes. A tensor
// whose offset is not a multiple of its element size is copied into aligned memory instead.
// Every header is validated before any tensor is built: a truncated file, a header length past the
// end, a header that is not JSON, an unknown dtype, offsets out of order / overlapping / past the
// end / leaving holes, or shape*itemsize != byte length give a one-line error naming the file and
// the tensor. Nothing is read outside the mapping.
//
// Writing: tensors are written contiguous, little-endian, sorted by (element size desc, name) so
// every tensor is aligned; the header is padded with spaces to a multiple of 8. The file is written
// to a temp name and renamed (atomic). Sharded checkpoints follow HF: `model-0000i-of-0000n
// .safetensors` plus `model.safetensors.index.json` ({"metadata": {"total_size"}, "weight_map"}).
//
// Dtypes: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL.
// Thread-safety: free functions; concurrent calls on distinct paths are safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <ATen/core/Tensor.h>

#include "proto/status.hpp"

namespace tessera::models {

/// Tensors by name (sorted by name).
using TensorMap = std::map<std::string, at::Tensor>;

/// What one safetensors file holds.
struct SafetensorsContents {
  TensorMap tensors;                              ///< CPU tensors aliasing the file mapping.
  std::map<std::string, std::string> metadata;   ///< The "__metadata__" entry (may be empty).
};

/// Reads one .safetensors file (mmap, zero copy).
Result<SafetensorsContents> read_safetensors(const std::string& path);

/// Writes one .safetensors file atomically. Tensors may live on any device and be non-contiguous.
Status write_safetensors(const std::string& path, const TensorMap& tensors,
                         const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

/// Name of the safetensors dtype for a scalar type ("F32"), or an error for unsupported types.
Result<std::string> safetensors_dtype_name(c10::ScalarType dtype);

/// Options for writing a checkpoint directory.
struct CheckpointWriteOptions {
  int64_t max_shard_bytes = int64_t{5} << 30;  ///< HF's default "5GB" shard size.
  std::string prefix = "model";                ///< File stem: model.safetensors / model-0000i-of-...
};

/// Reads every tensor of a checkpoint directory: `<prefix>.safetensors.index.json` if present
/// (sharded), else `<prefix>.safetensors`. Tensors alias the mappings (zero copy).
Result<TensorMap> read_safetensors_checkpoint(const std::string& dir, const std::string& prefix = "model");

/// Writes `tensors` into `dir` (which must exist) as one file, or as shards plus an index when they
/// exceed max_shard_bytes. Each file is atomic; a stale single file or index of the other layout is
/// removed afterwards so readers never see both.
Status write_safetensors_checkpoint(const std::string& dir, const TensorMap& tensors,
                                    const CheckpointWriteOptions& options = {});

}  // namespace tessera::models
