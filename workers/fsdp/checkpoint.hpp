// checkpoint.hpp: sharded FSDP checkpoints that any world size can load, and HF export.
//
// Note [Sharded checkpoint]
// Layout of a checkpoint directory (all tensors in safetensors files):
//   manifest.json                          written last; a directory without it is not a checkpoint
//   model_shard_<k>_of_<K>.safetensors     tensor "<unit>": flat shard k (model_dtype)
//   optim_shard_<k>_of_<K>.safetensors     "<unit>.exp_avg", "<unit>.exp_avg_sq" (none when frozen)
//   extra_state_rank_<r>_of_<W>.safetensors  "rng_state" (CPU generator) of world rank r
//   huggingface/config.json                when SaveOptions::hf_config is given (for export_hf)
// Shard k is written by the first replica holding it (ddp coordinate 0), so HYBRID_SHARD does not
// write duplicates; NO_SHARD has K = 1. The manifest records the world size, K, the strategy, the
// mesh, model_dtype, the optimizer step count, the LR scheduler position, whether optimizer files
// exist ("optimizer_state": false for a frozen module; absent in older manifests, meaning true),
// every unit's flat layout (names, shapes, offsets, padding) and every file's size.
// A frozen module loads any checkpoint's model shards and ignores its optimizer files; a
// trainable module refuses a checkpoint without optimizer state.
// Atomicity: all ranks write into "<dir>.tmp" (stale leftovers are removed first); the ranks agree
// that every file was written; then world rank 0 writes the manifest and swaps the temp
// directory into place (renameat2 RENAME_EXCHANGE when <dir> exists, else rename) and deletes the
// old one. A crash at any point before the swap leaves <dir> exactly as it was.
// Loading at another world size re-cuts each unit's new shard range from the old shards
// (pieces_for_range in flat_param.hpp); only the files overlapping a rank's range are read.
// All ranks must see the same filesystem (a shared disk across nodes).
#pragma once

#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "proto/status.hpp"
#include "workers/fsdp/fsdp_module.hpp"

namespace tessera::fsdp {

/// Options for save_checkpoint.
struct SaveOptions {
  nlohmann::json hf_config;  ///< Non-null: written to huggingface/config.json (by world rank 0).
  /// Called on every rank after its files are in the temp directory and before the ranks agree:
  /// files a worker adds (the LoRA adapter), and the tests' failure injection. An error (or a
  /// process kill) here must leave the previous checkpoint intact.
  std::function<Status(const std::string& temp_dir)> after_rank_files;
};

/// Saves `engine` to `dir` atomically (Note [Sharded checkpoint]). Collective over the world;
/// every rank returns the same verdict.
Status save_checkpoint(FsdpModule& engine, const std::string& dir, const SaveOptions& options = {});

/// Loads a checkpoint written at any world size into `engine` (same units and parameter shapes);
/// restores shards, AdamW moments (not for a frozen engine), optimizer step count, LR scheduler
/// position and this rank's CPU RNG state (rank r % old world size). Keeps the engine's offload
/// state. Reads files only. Errors: a trainable engine and a checkpoint without optimizer state.
Status load_checkpoint(FsdpModule& engine, const std::string& dir);

/// The parsed manifest.json of a checkpoint directory (validated).
Result<nlohmann::json> read_manifest(const std::string& dir);

/// Options for export_hf.
struct ExportOptions {
  std::optional<c10::ScalarType> dtype;  ///< Cast the weights (e.g. bf16); default: as stored.
};

/// Writes an HF model directory (config.json + model*.safetensors) from a sharded checkpoint,
/// without any communicator (verl's model_merger). Errors when the checkpoint has no
/// huggingface/config.json.
Status export_hf(const std::string& checkpoint_dir, const std::string& out_dir,
                 const ExportOptions& options = {});

}  // namespace tessera::fsdp
