// lora.hpp: LoRA adapters on a decoder's linear layers, as verl applies PEFT's get_peft_model to
// the actor (model.lora_rank > 0).
//
// Note [LoRA adapters]
// A targeted Linear with weight W [out, in] gets lora_A [r, in] and lora_B [out, r], named as
// PEFT saves them ("model.layers.0.self_attn.q_proj.lora_A.weight"), and computes
//   y = x W^T (+ b) + (x A^T) B^T * alpha / r
// (PEFT's LoraLayer with lora_dropout 0 and bias "none", which is what verl configures). A starts
// as PEFT's kaiming_uniform_(a = sqrt(5)), i.e. uniform(-1/sqrt(in), 1/sqrt(in)), drawn from a
// fixed seed so runs repeat; B starts at zero, so the adapted model starts as the base model.
// The base parameters stop requiring gradients: only the adapters train (FSDP keeps each layer's
// adapters in a unit of their own, gathered with the layer: fsdp_module.hpp's UnitSpec::owner),
// and with the adapters disabled the model is the base model, which verl uses as the reference
// policy (no second copy of the weights). The rollout and a saved HF model get merged weights,
// W + B A * alpha / r (merge_lora_weights), as PEFT's merge_and_unload computes them.
//
// target_modules follows PEFT: a string is a regular expression that must match a module's whole
// name; a list matches a module whose name is an entry or ends with "." + entry; "all-linear" is
// every Linear of the decoder layers (PEFT's shorthand: every linear layer but the output head),
// and of a value model also its `score` head (PEFT's all-linear leaves out output embeddings, which
// a TokenClassification model does not have, and verl wraps the critic as a CAUSAL_LM task).
// exclude_modules removes matches the same way. A match that is not a Linear layer (a container
// such as "mlp" included, as PEFT refuses it), or one outside the decoder layers (lm_head, a value
// model's score excepted), is refused, as is a target list that matches nothing. The regular expressions are ECMAScript's
// (std::regex), which reads the patterns used to select modules as Python's re does; Python-only
// syntax is refused as invalid rather than misread.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>
#include <nlohmann/json.hpp>

#include "proto/status.hpp"
#include "workers/models/safetensors.hpp"

namespace tessera::models {

class PretrainedModel;

/// PEFT's module selector: a regular expression (full match), or a list of names / name suffixes.
struct ModuleSelector {
  std::optional<std::string> regex;  ///< Set: match the whole module name.
  std::vector<std::string> names;    ///< Else: the name is an entry or ends with "." + entry.
  bool all_linear = false;           ///< PEFT's "all-linear".
  bool empty() const { return !regex && names.empty() && !all_linear; }
};

/// model.lora_rank / lora_alpha / target_modules / exclude_modules.
struct LoraConfig {
  int64_t rank = 0;
  double alpha = 16.0;
  ModuleSelector target;
  ModuleSelector exclude;
  /// Seed of lora_A's initial values (the workers pass the run's seed).
  uint64_t seed = 0;
  /// The adapters' dtype (their master weights, e.g. fp32 over a bf16 base); unset: the base's.
  std::optional<c10::ScalarType> dtype;
  bool enabled() const { return rank > 0; }
  double scaling() const { return alpha / static_cast<double>(rank); }
};

/// Reads verl's LoRA keys from a model block (`path` e.g. "actor_rollout_ref.model" names them in
/// errors). lora_rank 0 (or absent) gives a disabled config. Errors: a negative rank, a non-positive
/// alpha, a target_modules / exclude_modules that is neither a string nor a list of strings, an
/// invalid regular expression.
Result<LoraConfig> lora_config_from_json(const nlohmann::json& model_block, const std::string& path);

/// The names of the modules `config` adapts in `model` (e.g. "model.layers.0.self_attn.q_proj"),
/// in module order. Errors: see Note [LoRA adapters]; `path` prefixes the key names.
Result<std::vector<std::string>> lora_target_modules(const PretrainedModel& model, const LoraConfig& config,
                                                     const std::string& path);

/// Adds adapters to every target module (lora_target_modules) and freezes the base parameters.
/// Call before wrapping the model in FSDP. Errors: as lora_target_modules; a model with adapters.
Status apply_lora(PretrainedModel& model, const LoraConfig& config, const std::string& path);

/// Whether any Linear of `model` has an adapter.
bool has_lora(const PretrainedModel& model);

/// Turns every adapter of `model` on or off (verl's disable_adapter() context for the reference).
void set_lora_enabled(PretrainedModel& model, bool enabled);

/// Whether `name` is a parameter of an adapter ("...lora_A.weight" / "...lora_B.weight").
bool is_lora_parameter(const std::string& name);

/// For an adapter's lora_A parameter ("X.lora_A.weight"), the base weight it merges into
/// ("X.weight"); nullopt for any other name.
std::optional<std::string> lora_adapted_weight(const std::string& name);

/// The factors whose product B A is the part of the full delta that a (sliced) base weight `name`
/// holds: rows of W are rows of B, columns of W are columns of A. Gets and returns {A, B}.
using FactorSlicer =
    std::function<std::pair<at::Tensor, at::Tensor>(const std::string& name, const at::Tensor& a, const at::Tensor& b)>;

/// `params` (tensors by name, adapters included) with every adapter folded into its base weight,
/// W + B A * scaling computed in fp32 and cast to W's dtype, and the adapter entries removed.
/// With `slice`, the base weights are slices of the full ones (rollout tensor parallelism) and
/// each gets the product of its sliced factors. `in_place` writes the merged values into the base
/// tensors given (they must not be views of anything that must keep the base values); otherwise
/// the merged weights are new tensors and the other entries alias `params`. Errors: an adapter
/// without its base weight or partner, mismatched shapes.
Result<TensorMap> merge_lora_weights(const TensorMap& params, double scaling, bool in_place,
                                     const FactorSlicer& slice = nullptr);

/// PEFT's adapter_config.json for `config` over the base model at `base_model_path`, with the
/// target modules by their whole names, so PEFT adapts exactly those modules when it loads it.
nlohmann::json peft_adapter_config(const LoraConfig& config, const std::vector<std::string>& targets,
                                   const std::string& base_model_path);

}  // namespace tessera::models
