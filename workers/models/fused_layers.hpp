// fused_layers.hpp: the decoder's element-wise layer ops as one kernel each way on a GPU
// (verl's `model.use_liger`), and the switch that turns them on for a model. See Note [Fused
// layers] in fused_layers.cpp.
#pragma once

#include <utility>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>

#include "proto/status.hpp"

namespace tessera::models {

/// Turns the fused layer ops on or off in every RMSNorm, Attention and MLP under `root`.
void set_fused_layers(torch::nn::Module& root, bool on);

/// x * cos + rotate_half(x) * sin (x [B, H, T, D], cos / sin [B, 1, T, D]) as one CUDA kernel,
/// with a one-kernel backward. REQUIRES: x on a CUDA device, of the tables' dtype.
at::Tensor fused_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

/// silu(gate) * up as one CUDA kernel, with a one-kernel backward. REQUIRES: CUDA, same shape
/// and dtype.
at::Tensor fused_swiglu(const at::Tensor& gate, const at::Tensor& up);

/// Inference only (no autograd): (residual + x, weight * rmsnorm(residual + x)) with the roundings
/// of HF's ops (the sum rounded to the dtype, the norm in fp32, rounded, then the weight multiply
/// in the dtype), as one CUDA kernel instead of three (Note [Fused residual norm]). An undefined
/// x means no add: (residual, weight * rmsnorm(residual)). REQUIRES: CUDA; residual (and x) of one
/// shape [..., H] and dtype; weight [H] of that dtype.
std::pair<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& residual, const at::Tensor& x,
                                                     const at::Tensor& weight, double eps);

/// Whether fused_add_rms_norm takes these tensors: all contiguous, of one dtype and device, x
/// (when defined) of the residual's shape, weight [H]. It refuses the others.
bool fused_add_rms_norm_takes(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight);

/// Compares the fused ops (forward and backward) with the op sequences on a small random problem,
/// once per process and (device, dtype); later calls return the first verdict. An error names
/// `model.use_liger` and the rollout's `engine_kwargs.tessera.fused_layers`. Reads the host (call it outside CUDA-graph capture).
Status check_fused_layers(c10::Device device, c10::ScalarType dtype);

/// The same for fused_add_rms_norm (the rollout's only): its error names
/// engine_kwargs.tessera.fused_layers. Reads the host (call it outside CUDA-graph capture).
Status check_fused_residual_norm(c10::Device device, c10::ScalarType dtype);

}  // namespace tessera::models
