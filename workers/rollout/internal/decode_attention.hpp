// decode_attention.hpp (internal): attention for ONE new token per row, read straight from the KV
// cache: out[b, h] = softmax_s(q[b, h] . K[b, h/groups, s] / sqrt(D)) V[b, h/groups, s] over the
// visible columns s < columns. Same maths as the decoder's attention (decoder.hpp) for T = 1.
//
// Why it exists: a decode step's attention is a batch of B*H tiny matrix-vector products. Through
// at::matmul that is B*H separate BLAS calls per layer, which on CPU cost more than the whole
// step's weight matmuls. This kernel reads each key and value once (AVX2/FMA when the CPU has
// it, plain loops otherwise), parallel over (row, head) with at::parallel_for.
//
// Thread-safety: re-entrant.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace tessera::rollout::internal {

/// Whether decode_attention handles caches like `keys` (fp32, contiguous) with this head size.
bool decode_attention_supported(const at::Tensor& keys);

/// q [B, H, D] fp32 contiguous; keys/values [B, KV, capacity, D] fp32 contiguous (H % KV == 0);
/// visible [B, >= columns] bool with unit column stride. Returns [B, H * D] fp32; a row with no
/// visible column gets zeros. REQUIRES: decode_attention_supported(keys), columns <= capacity.
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                            const at::Tensor& visible, int64_t columns);

}  // namespace tessera::rollout::internal
