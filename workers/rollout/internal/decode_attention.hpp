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

/// How a CUDA decode-attention launch cuts each row's attended positions (Note [Split decode
/// attention] in cuda/paged_attention.cu): `splits` parts of `split_len` positions; 1 part: not cut.
struct DecodeSplit {
  int64_t splits = 1;
  int64_t split_len = 0;
};

/// The split for a launch over `batch` rows of `heads` query heads on `kv_heads` KV heads, rows
/// holding up to `capacity` positions (the block table's width x block size), attending to the last
/// `window` of them (0: all), on a device of `sm_count` multiprocessors: the rows' positions are
/// cut into parts of at least kMinSplitLen until the launch has about two blocks per
/// multiprocessor (at most kMaxSplits parts); one part where the batch alone fills the device.
/// From shapes alone, so a graph captured for a batch size keeps it for every replay.
inline constexpr int64_t kMinSplitLen = 256;
inline constexpr int64_t kMaxSplits = 64;
DecodeSplit choose_decode_split(int64_t batch, int64_t heads, int64_t kv_heads, int64_t capacity, int64_t window,
                                bool tiled, int64_t sm_count);

/// The CUDA kernel: q [B, H, D] (any strides) in the pools' dtype; block_tables [B, M] and
/// context_lens [B] int64 on the pools' device. Returns [B, H * D] in the pools' dtype, on the
/// current stream, with no host synchronisation. softcap 0 = none. `tiled`: the tiled kernel
/// (one block per row and KV head) instead of the heads kernel. `splits`: -1 as
/// choose_decode_split says for this device, 1 never cut, n > 1 exactly n parts (tests and
/// self-checks).
/// REQUIRES: paged_decode_attention_cuda_supported(key_pool); with tiled,
/// tiled_decode_attention_supported(H, KV, D); splits == -1 or 1 <= splits <= kMaxSplits.
at::Tensor paged_decode_attention_cuda(const at::Tensor& q, const at::Tensor& key_pool, const at::Tensor& value_pool,
                                       const at::Tensor& block_tables, const at::Tensor& context_lens, int64_t window,
                                       double scale, double softcap, bool tiled = false, int64_t splits = -1);

/// Note [Kernel self-check]: before its first use in a process on a (device, dtype), the CUDA
/// kernel is run on a small random problem (GQA, a window, a softcap, partial blocks) and compared
/// with the same attention computed by torch ops in fp32. A disagreement is an error naming the
/// switch that avoids the kernel; the result is remembered. Costs a few milliseconds once.
/// Each kernel (`tiled` or not) is checked on its own; with `split`, also cut into parts (Note
/// [Split decode attention]), a disagreement there naming engine_kwargs.tessera.split_decode_attention.
Status check_paged_decode_attention_cuda(c10::Device device, c10::ScalarType dtype, bool tiled = false,
                                         bool split = true);

}  // namespace tessera::rollout::internal
