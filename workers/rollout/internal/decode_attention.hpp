// decode_attention.hpp (internal): attention for ONE new token per row, read straight from the
// paged KV cache (Note [Paged KV cache] in paged_kv.hpp):
//   out[b, h] = softmax_s(q[b, h] . K[b, h/groups, s] / sqrt(D)) V[b, h/groups, s]
// over the row's positions s in [max(0, len - window), len), len = context_lens[b], where
// position s lives in row s % block_size of block block_tables[b, s / block_size]. Same maths as
// the decoder's attention (decoder.hpp) for T = 1.
//
// Why it exists: on the CPU a decode step's attention is a batch of B*H tiny matrix-vector
// products. Through at::matmul that is B*H separate BLAS calls per layer, which cost more than
// the whole step's weight matmuls, and gathering the blocks first would copy the cache. This
// kernel reads each key and value once (AVX2/FMA when the CPU has it, plain loops otherwise),
// parallel over (row, head) with at::parallel_for. On a CUDA device the same maths runs as a
// CUDA kernel (cuda/paged_attention.hpp), with the layer's score scale and softcap. Elsewhere,
// or with engine_kwargs.tessera.decode_attention=gather, the step model gathers the blocks and
// uses the models' attention (step_model.cpp).
//
// Thread-safety: re-entrant.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "proto/status.hpp"

namespace tessera::rollout::internal {

/// Whether paged_decode_attention handles pools like `pool` (fp32, contiguous, on the CPU).
bool paged_decode_attention_supported(const at::Tensor& pool);

/// q [B, H, D] fp32 contiguous; key_pool/value_pool [blocks, block_size, KV, D] (H % KV == 0);
/// block_tables [B, M] and context_lens [B] int64 on the CPU (any strides); window 0 = none.
/// Returns [B, H * D] fp32. REQUIRES: paged_decode_attention_supported(key_pool),
/// 1 <= context_lens[b] <= M * block_size.
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& key_pool, const at::Tensor& value_pool,
                                  const at::Tensor& block_tables, const at::Tensor& context_lens, int64_t window);

/// Whether the CUDA kernel handles pools like `pool` (CUDA, fp32/fp16/bf16, contiguous,
/// head_dim <= 256). False in a build without CUDA.
bool paged_decode_attention_cuda_supported(const at::Tensor& pool);

/// Whether the tiled CUDA kernel (engine_kwargs.tessera.decode_attention=tiled) takes a model
/// with these heads (cuda/paged_attention.hpp). False in a build without CUDA.
bool tiled_decode_attention_supported(int64_t heads, int64_t kv_heads, int64_t head_dim);

/// The CUDA kernel: q [B, H, D] (any strides) in the pools' dtype; block_tables [B, M] and
/// context_lens [B] int64 on the pools' device. Returns [B, H * D] in the pools' dtype, on the
/// current stream, with no host synchronisation. softcap 0 = none. `tiled`: the tiled kernel
/// (one block per row and KV head) instead of the heads kernel.
/// REQUIRES: paged_decode_attention_cuda_supported(key_pool); with tiled,
/// tiled_decode_attention_supported(H, KV, D).
at::Tensor paged_decode_attention_cuda(const at::Tensor& q, const at::Tensor& key_pool, const at::Tensor& value_pool,
                                       const at::Tensor& block_tables, const at::Tensor& context_lens, int64_t window,
                                       double scale, double softcap, bool tiled = false);

/// Note [Kernel self-check]: before its first use in a process on a (device, dtype), the CUDA
/// kernel is run on a small random problem (GQA, a window, a softcap, partial blocks) and compared
/// with the same attention computed by torch ops in fp32. A disagreement is an error naming the
/// switch that avoids the kernel; the result is remembered. Costs a few milliseconds once.
/// Each kernel (`tiled` or not) is checked on its own.
Status check_paged_decode_attention_cuda(c10::Device device, c10::ScalarType dtype, bool tiled = false);

}  // namespace tessera::rollout::internal
