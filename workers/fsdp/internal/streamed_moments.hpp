// streamed_moments.hpp (internal): the copies of the streamed optimizer step (Note [Streamed
// optimizer step] in fsdp_step.cpp), apart from the step so that tests can drive them.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include <c10/core/Device.h>

#include "workers/fsdp/optim.hpp"

namespace tessera::fsdp::internal {

/// The AdamW step of one unit on its working moments (on `device`).
using UnitAdamW = std::function<void(size_t unit, AdamWState& working)>;

/// Runs `adamw(i, working)` for each unit i in order, its moments loaded from the host buffers
/// `home[i]` into `working` on `device` and copied back after; returns once every copy home has
/// landed. On a GPU the copies home overlap the next units' loads and steps.
void stream_moments(const std::vector<AdamWState*>& home, const c10::Device& device, const UnitAdamW& adamw);

}  // namespace tessera::fsdp::internal
