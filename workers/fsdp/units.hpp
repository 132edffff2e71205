// units.hpp: verl's wrap policies, turned into FSDP units (sets of parameter names).
//
//   transformer layers (default): every submodule whose class name matches one of
//     wrap_policy.transformer_layer_cls_to_wrap becomes a unit; the remaining parameters form the
//     "root" unit. A listed name matches the C++ class name's last component, and HF's names
//     LlamaDecoderLayer / Qwen2DecoderLayer / Qwen3DecoderLayer / Qwen2MoeDecoderLayer /
//     Qwen3MoeDecoderLayer / MistralDecoderLayer / Gemma2DecoderLayer / Gemma3DecoderLayer also match Tessera's
//     DecoderLayer.
//     With an empty list the model's "no split" class is used: any class whose name ends with
//     "DecoderLayer".
//   min_num_params > 0: size-based, like FSDP's size_based_auto_wrap_policy: bottom-up, a
//     submodule whose not-yet-wrapped parameters number at least min_num_params becomes a unit.
//   disable: one "root" unit with every parameter.
// Units are listed in module order, root last. A unit that holds LoRA adapters (models'
// Note [LoRA adapters]) is split in two: its base weights keep the unit's name, and its adapters
// form a unit "<name>.lora" attached to it, right after it (Note [Attached units]). Layer units are marked `recompute` when asked
// (the model must then run them through FsdpModule::run_unit).
//
// HF decoders (models::PretrainedModel): make_decoder_units marks each unit that is exactly one
// decoder layer recompute, and install_layer_runner makes the backbone run those layers through
// run_unit (models::LayerRunner), so each layer keeps only its input and is recomputed in backward
// (activation checkpointing); under FULL_SHARD / HYBRID_SHARD it is also freed right after its
// forward: peak gathered memory is then the root plus one layer.
#pragma once

#include <vector>

#include <torch/nn/module.h>

#include "proto/status.hpp"
#include "workers/fsdp/fsdp_module.hpp"
#include "workers/fsdp/options.hpp"
#include "workers/models/model.hpp"

namespace tessera::fsdp {

/// Units for `module` under `policy`. `recompute_layers` marks the non-root units recompute.
/// Errors: a module without parameters.
Result<std::vector<UnitSpec>> make_units(const torch::nn::Module& module, const WrapPolicy& policy,
                                         bool recompute_layers = false);

/// Units for an HF decoder model under `policy`: make_units, with every unit that holds exactly
/// one decoder layer's parameters ("model.layers.<i>") marked recompute, under every strategy.
/// Follow the wrap with install_layer_runner.
Result<std::vector<UnitSpec>> make_decoder_units(const models::PretrainedModel& model, const WrapPolicy& policy);

/// Whether `layout` is a unit of LoRA adapters only (split_adapters' "<name>.lora" units, or a
/// size-based unit that holds nothing else).
bool is_adapter_unit(const FlatLayout& layout);

/// Makes `model`'s backbone run each decoder layer that is a unit of `engine` through
/// engine.run_unit() (other layers run directly). Once `engine` is destroyed, a forward through
/// the runner throws an error saying so. Errors: `engine` does not wrap `model`.
Status install_layer_runner(FsdpModule& engine, models::PretrainedModel& model);

}  // namespace tessera::fsdp
