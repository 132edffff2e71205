// paged_attention.hpp: the CUDA kernels of single-token attention over the paged KV cache (Note
// [Paged KV cache] in ../paged_kv.hpp), behind a plain C++ interface: raw device pointers and a
// stream, no LibTorch types, so its translation unit compiles with nvcc alone (no ATen headers).
//
// Maths: for each row b and query head h, over positions s in [max(0, len - window), len) of
// the row (len = context_lens[b]; window 0 = none), with kv = h / (heads / kv_heads):
//   score_s = (q[b, h] . K[s, kv]) * scale, then tanh(score / softcap) * softcap if softcap > 0
//   out[b, h] = sum_s softmax(score)_s V[s, kv]
// in fp32 (online softmax), written in the element type of q. Context lengths stay below 2^31
// and the pool's token rows below 2^32: the heads kernel walks positions in 32 bits.
//
// Thread-safety: re-entrant; the launch is asynchronous on `stream` and can be graph-captured.
#pragma once

#include <cstdint>

#include "proto/cuda/element.hpp"

namespace tessera::rollout::cuda {

using ElementType = proto::cuda::ElementType;

struct PagedDecodeArgs {
  const void* q = nullptr;           ///< [B, heads, D] contiguous.
  const void* key_pool = nullptr;    ///< [blocks, block_size, kv_heads, D] contiguous.
  const void* value_pool = nullptr;  ///< Same shape as key_pool.
  const int64_t* block_tables = nullptr;  ///< [B, M] with the strides below.
  int64_t table_row_stride = 0, table_entry_stride = 1;
  const int64_t* context_lens = nullptr;  ///< [B] with len_stride.
  int64_t len_stride = 1;
  void* out = nullptr;               ///< [B, heads, D] contiguous, element type of q.
  int64_t batch = 0, heads = 0, kv_heads = 0, head_dim = 0, block_size = 0;
  int64_t window = 0;
  float scale = 1.f;
  float softcap = 0.f;
  ElementType dtype = ElementType::f32;
  /// The tiled kernel (one block per row and KV head, Note [Tiled decode attention] in the .cu)
  /// instead of the heads kernel (one block per row, KV head and up to 4 of its query heads).
  /// REQUIRES for tiled: tiled_decode_attention_supported(heads, kv_heads, head_dim).
  bool tiled = false;
  /// Note [Split decode attention]: with splits > 1, each row's attended positions [first, len)
  /// are cut into parts of split_len positions, part z being [first + z * split_len, ...); each
  /// part is a thread block of its own that writes its unnormalised result (the weighted value sum
  /// [head_dim], then the running max and the sum of weights) to `partials`, and a second kernel
  /// merges a row's parts into `out`. Parts past a row's end do nothing.
  /// REQUIRES with splits > 1: split_len >= 1, splits * split_len >= every row's len - first,
  /// partials holds decode_split_partial_floats(batch, heads, head_dim, splits) floats.
  int64_t splits = 1;
  int64_t split_len = 0;
  float* partials = nullptr;
};

/// Query heads per thread block of the heads kernel, at most: a KV group of G query heads takes
/// ceil(G / min(G, kMaxHeadsPerBlock)) blocks per row and KV head.
constexpr int64_t kMaxHeadsPerBlock = 4;

/// Floats of `partials` a split launch needs: [batch, heads, splits, head_dim + 2].
constexpr int64_t decode_split_partial_floats(int64_t batch, int64_t heads, int64_t head_dim, int64_t splits) {
  return batch * heads * splits * (head_dim + 2);
}

/// Largest head_dim the kernel handles.
constexpr int64_t kMaxHeadDim = 256;

/// Whether the tiled kernel takes this shape: a KV group of at most 128 / L query heads, L the
/// lanes a head's row takes (head_dim / 8 rounded up to a power of two): 16 at head_dim 64, 8 at
/// 128, 4 at 256.
bool tiled_decode_attention_supported(int64_t heads, int64_t kv_heads, int64_t head_dim);

/// The number of multiprocessors of CUDA device `device` (asked once per device, then remembered);
/// 0 if the runtime cannot say.
int64_t multiprocessor_count(int device);

/// Launches the kernel on `stream` (a cudaStream_t). Returns nullptr on success, else the CUDA
/// error string. REQUIRES: head_dim <= kMaxHeadDim, heads % kv_heads == 0, 1 <= len <= M * block_size.
const char* launch_paged_decode_attention(const PagedDecodeArgs& args, void* stream);

}  // namespace tessera::rollout::cuda
