// units.hpp: verl's wrap policies, turned into FSDP units (sets of parameter names).
//
//   transformer layers (default): every submodule whose class name matches one of
//     wrap_policy.transformer_layer_cls_to_wrap becomes a unit; the remaining parameters form the
//     "root" unit. A listed name matches the C++ class name's last component, and HF's names
//     LlamaDecoderLayer / Qwen2DecoderLayer also match Tessera's DecoderLayer. With an empty list
//     the model's "no split" class is used: any class whose name ends with "DecoderLayer".
//   min_num_params > 0: size-based, like FSDP's size_based_auto_wrap_policy: bottom-up, a
//     submodule whose not-yet-wrapped parameters number at least min_num_params becomes a unit.
//   disable: one "root" unit with every parameter.
// Units are listed in module order, root last. Layer units are marked `recompute` when asked
// (the model must then run them through FsdpModule::run_unit).
#pragma once

#include <vector>

#include <torch/nn/module.h>

#include "proto/status.hpp"
#include "workers/fsdp/fsdp_module.hpp"
#include "workers/fsdp/options.hpp"

namespace tessera::fsdp {

/// Units for `module` under `policy`. `recompute_layers` marks the non-root units recompute.
/// Errors: a module without parameters.
Result<std::vector<UnitSpec>> make_units(const torch::nn::Module& module, const WrapPolicy& policy,
                                         bool recompute_layers = false);

}  // namespace tessera::fsdp
