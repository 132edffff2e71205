// weight_loader.hpp: verl's hf_weight_loader idea as a table. Each HF architecture name
// ("Qwen2ForCausalLM", "LlamaForTokenClassification", ...) maps to a loader function that moves a
// checkpoint's tensors into a Tessera model (renaming, dropping or initialising as that
// architecture needs). A new architecture is added by registering a row, not by editing a switch.
// (A new model *family* also needs a row in config.cpp's model-type table.)
//
// Built-in rows: {Llama,Qwen2,Qwen3,Mistral,Gemma2}ForCausalLM and ...ForTokenClassification, all
// served by load_hf_decoder_weights().
//
// Thread-safety: the global registry is internally locked; registration may happen at any time.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "proto/status.hpp"
#include "workers/models/config.hpp"
#include "workers/models/safetensors.hpp"

namespace tessera::models {

class PretrainedModel;

/// Options for loading a checkpoint into a model.
struct LoadOptions {
  /// Parameter dtype. Unset: the checkpoint's model.embed_tokens.weight dtype. On the host, tensors
  /// already in this dtype alias the mmap'd file (zero copy); others are converted (copied).
  std::optional<c10::ScalarType> dtype;
  /// Seed for a value head that the checkpoint lacks (critic initialised from an actor checkpoint).
  uint64_t score_seed = 0;
  /// Where the parameters end up: each tensor is uploaded in the checkpoint's dtype and converted
  /// there (a GPU), or converted on the host. Unset: the host.
  std::optional<c10::Device> device;
  /// model.override_config: config.json fields set over the file's (load_model_config), and the
  /// config key that holds them, for errors.
  nlohmann::json config_override;
  std::string config_override_key = "override_config";
};

/// Moves `checkpoint` (read from `source`) into `model`; every parameter must end up set.
using WeightLoaderFn = std::function<Status(const TensorMap& checkpoint, const std::string& source,
                                            PretrainedModel& model, const LoadOptions& options)>;

/// One registered architecture.
struct ArchitectureEntry {
  HeadKind head = HeadKind::causal_lm;  ///< The head the checkpoint itself carries.
  WeightLoaderFn load;
};

/// Architecture name -> loader.
class WeightLoaderRegistry {
 public:
  /// The process-wide registry, with the built-in rows.
  static WeightLoaderRegistry& global();

  /// Adds a row; an error if `architecture` is already registered.
  Status add(const std::string& architecture, ArchitectureEntry entry);
  /// The row for `architecture`; not_found listing the known names otherwise.
  Result<ArchitectureEntry> find(const std::string& architecture) const;
  /// Registered names, sorted.
  std::vector<std::string> architectures() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, ArchitectureEntry> table_;
};

/// The loader for HF Llama/Qwen2/Qwen3/Qwen2-MoE/Qwen3-MoE/Mistral/Gemma2 checkpoints (names are
/// Tessera's, but for MoE experts). It drops `*.rotary_emb.inv_freq`, drops lm_head.weight when the
/// head is tied or the target is a value model, and seeds a missing `score.*` for a value model
/// (logging that it did, as HF does). A MoE layer's experts are stacked into Tessera's
/// experts.{gate,up,down}_proj (SparseMoeBlock) from the per-expert tensors released checkpoints
/// hold (experts.<e>.gate_proj.weight, ...) or from transformers 5's fused experts.gate_up_proj.
/// Any other unknown or missing tensor is an error naming it and `source`.
Status load_hf_decoder_weights(const TensorMap& checkpoint, const std::string& source, PretrainedModel& model,
                               const LoadOptions& options);

/// The tensors of `params` (a model's parameters, or an FSDP export) under HF's checkpoint names:
/// each stacked MoE expert tensor "<layer>.mlp.experts.gate_proj" [E, ...] becomes E views
/// "<layer>.mlp.experts.<e>.gate_proj.weight", the form every transformers version loads; the rest
/// is returned as it is.
TensorMap to_hf_checkpoint_tensors(const TensorMap& params);

}  // namespace tessera::models
