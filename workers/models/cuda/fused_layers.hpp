// fused_layers.hpp: CUDA kernels for the decoder's element-wise layer ops (rotary embedding and
// SwiGLU forward and backward; residual add + RMSNorm for inference), behind a plain C++ interface (raw device pointers and a stream,
// no LibTorch types) so their translation unit compiles with nvcc alone. The forwards round
// where HF's op chains round; the backwards compute in fp32 and round once to the element type.
// See Note [Fused layers] in ../fused_layers.cpp.
//
// Thread-safety: re-entrant; launches are asynchronous on `stream` and can be graph-captured.
#pragma once

#include <cstdint>

#include "proto/cuda/element.hpp"

namespace tessera::models::cuda {

using ElementType = proto::cuda::ElementType;

/// Rotary embedding over x [B, H, T, D] (any strides, last dim contiguous) with tables cos, sin
/// [B, 1, T, D] (any strides, last dim contiguous), into out [B, H, T, D] contiguous:
///   forward:  out = x * cos + rotate_half(x) * sin,  rotate_half(x) = cat(-x[D/2:], x[:D/2])
///   backward: out = g * cos + rotate_half^T(g * sin), rotate_half^T(y) = cat(y[D/2:], -y[:D/2])
/// (x is then the incoming gradient g). REQUIRES: D even.
struct RotaryArgs {
  const void* x = nullptr;
  int64_t x_stride[4] = {};
  const void* cos = nullptr;
  const void* sin = nullptr;
  int64_t table_stride[3] = {};  ///< Strides of cos and sin over B, T, D (the same for both).
  void* out = nullptr;
  int64_t batch = 0, heads = 0, tokens = 0, head_dim = 0;
  bool backward = false;
  ElementType dtype = ElementType::f32;
};
const char* launch_rotary(const RotaryArgs& args, void* stream);

/// SwiGLU over gate, up [n] (contiguous): forward out = silu(gate) * up; backward, with the
/// incoming gradient g, grad_gate = g * up * silu'(gate) and grad_up = g * silu(gate).
struct SwigluArgs {
  const void* gate = nullptr;
  const void* up = nullptr;
  const void* grad = nullptr;  ///< Backward only.
  void* out = nullptr;         ///< Forward: out. Backward: grad_gate.
  void* out_up = nullptr;      ///< Backward: grad_up.
  int64_t n = 0;
  bool backward = false;
  ElementType dtype = ElementType::f32;
};
const char* launch_swiglu(const SwigluArgs& args, void* stream);

/// Residual add + RMSNorm, one thread block per row of `hidden` elements (all contiguous):
///   sum = residual + x (rounded to the element type), written to `sum`; without x, sum = residual;
///   out = weight * (sum * rsqrt(mean(sum^2) + eps) in fp32, rounded to the element type).
struct AddRmsNormArgs {
  const void* residual = nullptr;  ///< [rows, hidden]
  const void* x = nullptr;         ///< [rows, hidden], or nullptr (no add)
  void* sum = nullptr;             ///< [rows, hidden] out when x is given
  const void* weight = nullptr;    ///< [hidden]
  void* out = nullptr;             ///< [rows, hidden]
  int64_t rows = 0, hidden = 0;
  float eps = 0.f;
  ElementType dtype = ElementType::f32;
};
const char* launch_add_rms_norm(const AddRmsNormArgs& args, void* stream);

}  // namespace tessera::models::cuda
