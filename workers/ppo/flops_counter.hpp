// flops_counter.hpp: verl's FlopsCounter (verl/utils/flops_counter.py) for the decoders Tessera
// trains, and the MFU figure update_actor / update_critic report (perf/mfu/actor).
#pragma once

#include <cstdint>
#include <vector>

#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include "workers/models/config.hpp"

namespace tessera::ppo {

/// FLOPs of one forward + backward over sequences of `seqlens` tokens (verl's estimate: 6 x dense
/// parameters x tokens, plus 12 x sum(seqlen^2) x head_dim x heads x layers for attention; for
/// gemma3_text, as verl's _estimate_gemma3_flops, a sliding layer counts seqlen x min(seqlen, window)).
double training_flops(const models::ModelConfig& config, const std::vector<int64_t>& seqlens);

/// verl's perf/mfu/actor: training_flops(meta_info.global_token_num) x ppo_epochs over `seconds`,
/// as a fraction of the device's peak (proto::device_peak_flops) per rank of a `world_size`
/// world. 0 where the peak is unknown (a CPU device, an unlisted GPU) or the batch carries no
/// global_token_num.
double model_flops_utilization(const models::ModelConfig& config, const nlohmann::json& meta_info,
                               int64_t ppo_epochs, double seconds, const c10::Device& device, int world_size);

}  // namespace tessera::ppo
