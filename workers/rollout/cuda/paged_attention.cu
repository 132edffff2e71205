// paged_attention.cu: see paged_attention.hpp. Two kernels compute the same attention.
//
// The heads kernel: one thread block of kThreads per (row, KV head, group of up to G <= 4 query
// heads). The query heads that share a KV head share its key and value loads: each position's key
// and value are read from memory once per block rather than once per query head. A position's
// head vector is split into chunks of kVec elements (16 bytes for 16-bit types), one per lane, and
// the L lanes that hold one position (L = head_dim / kVec rounded up to a power of two) form a
// token slot: a warp holds 32 / L slots, the block kThreads / L. Each slot walks every
// (kThreads / L)-th position of the row, the next position's loads in flight while one is
// computed (Note [Decode loads in flight]), keeping per query head an online softmax (running
// max, sum, and weighted value chunk) in fp32; a position's score is the L lanes' partial dot
// products summed by shuffles. At the end the slots of a warp merge by shuffles, the warps
// through shared memory, and the block writes its heads.
//
// The tiled kernel: Note [Tiled decode attention] below.
//
// What decode attention must move is the key and value bytes of the rows' contexts, read once
// each, which is what the kernels aim at (Note [Decode loads in flight]); every row and KV head
// is its own block, so a batch of B rows is B * kv_heads blocks (and a few rows with long
// contexts are split over more: Note [Split decode attention]).
#include "workers/rollout/cuda/paged_attention.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "proto/cuda/element.cuh"

#include <algorithm>
#include <atomic>

namespace tessera::rollout::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kVec = 8;                        ///< Head elements per lane and position.
constexpr int kMaxChunks = static_cast<int>(kMaxHeadDim) / kVec;  // 32: one warp spans a head
static_assert(kMaxChunks <= 32, "a token slot must fit in a warp");
constexpr unsigned kFullMask = 0xffffffffu;
// kMaxHeadsPerBlock (paged_attention.hpp) is 4: on an H100, Qwen2.5-0.5B's groups of 7 decoded
// at 512 rows ran at 67.9k tok/s with blocks of 4 (+3), 62.7k with one block of 8 (219 registers
// a thread, two blocks per SM) and 61.4k with blocks of 2.

using proto::cuda::from_float;
using proto::cuda::to_float;

// Elements [d0, d0 + kVec) of p as floats, one element at a time; past `dim` reads as 0 (the
// plain walk, for chunks that cannot move in 16-byte loads).
template <class T>
__device__ __forceinline__ void load_chunk(const T* p, int64_t d0, int64_t dim, float (&out)[kVec]) {
#pragma unroll
  for (int i = 0; i < kVec; ++i) out[i] = d0 + i < dim ? to_float(p[d0 + i]) : 0.f;
}

// One lane's kVec elements of a position's key or value as loaded, in 16-byte words, as the heads
// kernel's pipeline keeps them: ptxas allocates these words better than the elements (at 128
// registers the 4-head bf16 variant spills 36 bytes rather than 78).
template <class T>
struct PackedChunk {
  static constexpr int kWords = kVec * static_cast<int>(sizeof(T)) / 16;
  uint4 w[kWords];
};

// This lane's chunk at p + d0, 16-byte aligned.
template <class T>
__device__ __forceinline__ void load_packed(const T* p, PackedChunk<T>& out) {
#pragma unroll
  for (int i = 0; i < PackedChunk<T>::kWords; ++i) out.w[i] = reinterpret_cast<const uint4*>(p)[i];
}

// Element i of a chunk, as a float.
template <class T>
__device__ __forceinline__ float element(const PackedChunk<T>& c, int i) {
  return to_float(reinterpret_cast<const T*>(c.w)[i]);
}
__device__ __forceinline__ float element(const float (&c)[kVec], int i) { return c[i]; }

// The first position a row of `len` positions attends to.
__device__ __forceinline__ int64_t first_attended(const PagedDecodeArgs& a, int64_t len) {
  return a.window > 0 && len > a.window ? len - a.window : 0;
}

// What a block reads for row b and KV head kv: the pools at the head's offset, whether their
// chunks move in 16-byte loads (dim % kVec == 0 and every token row 16-byte aligned), the
// positions [begin, end) it attends to (the row's [first, len), or part z of it: Note [Split
// decode attention]) and the row's block table. begin >= end: a part past the row's end.
template <class T>
struct RowView {
  const T* keys;
  const T* values;
  int64_t token_stride;
  bool aligned;
  int64_t begin, end;
  const int64_t* table;
};

template <class T>
__device__ __forceinline__ RowView<T> row_view(const PagedDecodeArgs& a, int64_t b, int64_t kv, int64_t z) {
  RowView<T> r;
  r.token_stride = a.kv_heads * a.head_dim;
  r.keys = static_cast<const T*>(a.key_pool) + kv * a.head_dim;
  r.values = static_cast<const T*>(a.value_pool) + kv * a.head_dim;
  r.aligned = a.head_dim % kVec == 0 && (r.token_stride * static_cast<int64_t>(sizeof(T))) % 16 == 0 &&
              reinterpret_cast<uintptr_t>(r.keys) % 16 == 0 && reinterpret_cast<uintptr_t>(r.values) % 16 == 0;
  const int64_t len = a.context_lens[b * a.len_stride], first = first_attended(a, len);
  r.begin = a.splits > 1 ? first + z * a.split_len : first;
  r.end = a.splits > 1 ? min(len, r.begin + a.split_len) : len;
  r.table = a.block_tables + b * a.table_row_stride;
  return r;
}

// Where the block of (row b, query head h, part z) leaves its result: with one part the
// normalised output in `out`; with several (Note [Split decode attention]) the unnormalised sums
// o, their max m and the sum of weights l in `partials`, for merge_parts_kernel.
template <class T>
__device__ __forceinline__ void write_result(const PagedDecodeArgs& a, int64_t b, int64_t h, int64_t d, float m,
                                             float l, float o) {
  if (a.splits <= 1) {
    static_cast<T*>(a.out)[(b * a.heads + h) * a.head_dim + d] = from_float<T>(l > 0.f ? o / l : 0.f);
    return;
  }
  float* part = a.partials + ((b * a.heads + h) * a.splits + blockIdx.z) * (a.head_dim + 2);
  part[d] = o;
  if (d == 0) {
    part[a.head_dim] = m;
    part[a.head_dim + 1] = l;
  }
}

// The online-softmax state of one token slot for G query heads (this lane's chunk of each).
template <int G>
struct Partial {
  float m[G], l[G], acc[G][kVec];
};

// Folds position (k, v) into `st` for every head: score = q . k (q carries the scale), reduced
// over the slot's L lanes. `valid` false: the lanes still shuffle (the whole warp must) but the
// state is unchanged. The chunks are floats or as loaded (PackedChunk), each element converted
// where it is used, one at a time (which keeps the registers of the heads kernel's pipeline).
template <int G, class Elems>
__device__ __forceinline__ void attend(Partial<G>& st, const float (&q)[G][kVec], const Elems& k, const Elems& v,
                                       bool valid, int L, float softcap) {
  float score[G];
#pragma unroll
  for (int g = 0; g < G; ++g) score[g] = 0.f;
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    const float ki = element(k, i);
#pragma unroll
    for (int g = 0; g < G; ++g) score[g] += q[g][i] * ki;
  }
  for (int offset = L / 2; offset > 0; offset /= 2) {
#pragma unroll
    for (int g = 0; g < G; ++g) score[g] += __shfl_xor_sync(kFullMask, score[g], offset);
  }
  if (!valid) return;
  float keep[G], p[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float s = score[g];
    if (softcap > 0.f) s = tanhf(s / softcap) * softcap;
    const float m_new = fmaxf(st.m[g], s);
    keep[g] = __expf(st.m[g] - m_new);  // 0 at m = -inf
    p[g] = __expf(s - m_new);
    st.l[g] = st.l[g] * keep[g] + p[g];
    st.m[g] = m_new;
  }
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    const float vi = element(v, i);
#pragma unroll
    for (int g = 0; g < G; ++g) st.acc[g][i] = st.acc[g][i] * keep[g] + p[g] * vi;
  }
}

// Note [Decode loads in flight]
// The heads kernel's walk is latency-bound unless loads overlap: a position's key and value wait
// for its block-table entry (two dependent memory trips), and the plain walk (still the one for
// unaligned rows) waits for each pair of positions' loads, behind their table reads, before
// computing the pair. On an H200 it ran at about a ninth of the bandwidth. So each slot's walk is
// a pipeline over its positions, two buffers deep: a buffer's key and value (kept as loaded, 16
// bytes a lane in 16-bit types, converted where they are used) are refilled with the position two
// ahead as soon as it has been attended to, so the next position's loads are in flight while one
// is computed (up to four 16-byte loads per lane in 16-bit types), and the table entry of that
// position is read before the computation that hides it. No condition sits between a load and
// its use: a slot past the end of the row (or of its part) reads the last position again and
// drops the result. Positions fit 32 bits, so the table lookup divides in 32 bits. Each
// position's arithmetic is attend()'s. Rows whose chunks cannot move in 16-byte loads (head sizes
// no multiple of kVec, unaligned pools or strides) keep the plain walk. At 128 registers the
// 4-head variant spills 36 bytes in 16-bit types (ptxas, sm_90).
template <class T, int G>
__device__ __forceinline__ void walk_row(const PagedDecodeArgs& a, const RowView<T>& view, const float (&q)[G][kVec],
                                         Partial<G>& st, int slot, int slots, int64_t d0, bool active, int L) {
  if (view.begin >= view.end) return;
  // Positions, cache rows and the walk's counters in 32 bits (a row's context and the pool's
  // tokens stay far below 2^31); addresses in 64.
  const int begin = static_cast<int>(view.begin), end = static_cast<int>(view.end), step = 2 * slots;
  const unsigned block_size = static_cast<unsigned>(a.block_size);
  // The cache row of this slot's position s, clamped into the row's positions.
  auto cache_row = [&](int s) -> unsigned {
    const unsigned p = static_cast<unsigned>(min(s, end - 1));
    return static_cast<unsigned>(view.table[static_cast<int64_t>(p / block_size) * a.table_entry_stride]) * block_size +
           p % block_size;
  };
  auto load = [&](unsigned row, PackedChunk<T>& k, PackedChunk<T>& v) {
    if (!active) return;  // a lane past the head's end: its chunks stay 0
    const int64_t at = static_cast<int64_t>(row) * view.token_stride + d0;
    load_packed(view.keys + at, k);
    load_packed(view.values + at, v);
  };
  PackedChunk<T> ka{}, va{}, kb{}, vb{};  // zeros; buffer a: the slot's even positions, b: its odd ones
  load(cache_row(begin + slot), ka, va);
  load(cache_row(begin + slot + slots), kb, vb);
  for (int base = begin; base < end; base += step) {
    const int sa = base + slot, sb = sa + slots;
    // Refills past the row's end (the last iteration) read its last position again: no branch.
    const unsigned next_a = cache_row(sa + step);
    attend<G>(st, q, ka, va, sa < end, L, a.softcap);
    load(next_a, ka, va);
    const unsigned next_b = cache_row(sb + step);
    attend<G>(st, q, kb, vb, sb < end, L, a.softcap);
    load(next_b, kb, vb);
  }
}

// exp(m - m_total) as a merge weight; 0 for a part that saw no position.
__device__ __forceinline__ float part_weight(float m, float m_total) {
  return m == -INFINITY ? 0.f : __expf(m - m_total);
}

// At most 128 registers a thread (4 blocks an SM); the pipelined walk then spills 36 bytes in the
// 16-bit 4-head variant (Note [Decode loads in flight]).
template <class T, int G>
__global__ void __launch_bounds__(kThreads, 4) paged_decode_kernel(PagedDecodeArgs a, int lanes_per_slot) {
  const int L = lanes_per_slot;
  const int slots = kThreads / L;
  const int slot = static_cast<int>(threadIdx.x) / L, lane_in_slot = static_cast<int>(threadIdx.x) % L;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t D = a.head_dim, group = a.heads / a.kv_heads, chunks = (group + G - 1) / G;
  const int64_t kv = blockIdx.x / chunks, b = blockIdx.y;
  const int64_t first_in_group = (blockIdx.x % chunks) * G;
  const int heads_here = static_cast<int>(min(static_cast<int64_t>(G), group - first_in_group));
  const int64_t h0 = kv * group + first_in_group;
  const int64_t d0 = static_cast<int64_t>(lane_in_slot) * kVec;
  const bool active = d0 < D;

  float q[G][kVec];
  const T* qp = static_cast<const T*>(a.q) + (b * a.heads + h0) * D;
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      q[g][i] = g < heads_here && d0 + i < D ? to_float(qp[g * D + d0 + i]) * a.scale : 0.f;
    }
  }

  const RowView<T> view = row_view<T>(a, b, kv, blockIdx.z);
  if (a.splits > 1 && view.begin >= view.end) return;  // a part past the row's end: the whole block

  Partial<G> st;
#pragma unroll
  for (int g = 0; g < G; ++g) {
    st.m[g] = -INFINITY;
    st.l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < kVec; ++i) st.acc[g][i] = 0.f;
  }
  // Every thread runs the same iterations (the shuffles need the whole warp); a slot past the
  // row's end changes nothing (Note [Decode loads in flight]).
  if (view.aligned) {
    walk_row<T, G>(a, view, q, st, slot, slots, d0, active, L);
  } else {  // head sizes that are no multiple of kVec, or unaligned pools: element loads, no pipeline
    for (int64_t base = view.begin; base < view.end; base += 2 * slots) {
      const int64_t s0 = base + slot, s1 = s0 + slots;
      const bool valid0 = s0 < view.end, valid1 = s1 < view.end;
      float k0[kVec] = {}, v0[kVec] = {}, k1[kVec] = {}, v1[kVec] = {};
      if (valid0 && active) {
        const int64_t row = view.table[(s0 / a.block_size) * a.table_entry_stride] * a.block_size + s0 % a.block_size;
        load_chunk(view.keys + row * view.token_stride, d0, D, k0);
        load_chunk(view.values + row * view.token_stride, d0, D, v0);
      }
      if (valid1 && active) {
        const int64_t row = view.table[(s1 / a.block_size) * a.table_entry_stride] * a.block_size + s1 % a.block_size;
        load_chunk(view.keys + row * view.token_stride, d0, D, k1);
        load_chunk(view.values + row * view.token_stride, d0, D, v1);
      }
      attend(st, q, k0, v0, valid0, L, a.softcap);
      attend(st, q, k1, v1, valid1, L, a.softcap);
    }
  }

  // Merge the slots of each warp (lanes L, 2L, ... apart hold the same chunk of other slots).
  for (int offset = L; offset < 32; offset *= 2) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float m_other = __shfl_xor_sync(kFullMask, st.m[g], offset);
      const float l_other = __shfl_xor_sync(kFullMask, st.l[g], offset);
      const float m_total = fmaxf(st.m[g], m_other);
      const float w_mine = part_weight(st.m[g], m_total), w_other = part_weight(m_other, m_total);
      st.l[g] = st.l[g] * w_mine + l_other * w_other;
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        st.acc[g][i] = st.acc[g][i] * w_mine + __shfl_xor_sync(kFullMask, st.acc[g][i], offset) * w_other;
      }
      st.m[g] = m_total;
    }
  }
  // Then the warps, through shared memory: lanes [0, L) of each warp hold its merged state.
  __shared__ float warp_m[kWarps][G], warp_l[kWarps][G];
  __shared__ float warp_acc[kWarps][G][kMaxHeadDim];
  if (lane < L) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      if (lane == 0) {
        warp_m[warp][g] = st.m[g];
        warp_l[warp][g] = st.l[g];
      }
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        if (d0 + i < D) warp_acc[warp][g][d0 + i] = st.acc[g][i];
      }
    }
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < heads_here * D; e += kThreads) {
    const int64_t g = e / D, d = e % D;
    float m_total = -INFINITY;
    for (int w = 0; w < kWarps; ++w) m_total = fmaxf(m_total, warp_m[w][g]);
    float total = 0.f, o = 0.f;
    for (int w = 0; w < kWarps; ++w) {
      const float weight = part_weight(warp_m[w][g], m_total);
      total += warp_l[w][g] * weight;
      o += warp_acc[w][g][d] * weight;
    }
    write_result<T>(a, b, h0 + g, d, m_total, total, o);
  }
}

// Note [Split decode attention]
// A decode batch is B rows x kv_heads blocks (x the heads kernel's blocks per KV group). Hundreds
// of rows fill the device; the few rows left at the end of a rollout with long-tailed response
// lengths do not: 4 rows of Qwen2.5-7B are 32 blocks on a 132-SM H100, each walking the row's
// whole context alone, and that tail can be most of a long-reasoning rollout's decode steps. Such
// launches cut each row's attended positions into parts of split_len positions (vLLM's paged
// attention v2, "flash decoding"): part z is a block of its own over [first + z * split_len, ...),
// leaving its value sums o (relative to its own max m) and its sum of weights l in fp32; then
// merge_parts_kernel combines a row's parts exactly as the blocks combine their warps (weights
// exp(m_z - max m)). The split is chosen on the host from shapes alone (choose_decode_split in
// internal/decode_attention.cpp), with the row's capacity (the block table's width) standing
// for its length, so a graph captured for a batch size stays right for every replay: parts past
// a row's actual end return at once, and the merge reads only the row's used parts.
template <class T>
__global__ void __launch_bounds__(kThreads) merge_parts_kernel(PagedDecodeArgs a) {
  const int64_t bh = blockIdx.x, b = bh / a.heads, D = a.head_dim;
  const int64_t len = a.context_lens[b * a.len_stride];
  const int64_t used = min(a.splits, (len - first_attended(a, len) + a.split_len - 1) / a.split_len);
  const float* parts = a.partials + bh * a.splits * (D + 2);
  float m_total = -INFINITY;
  for (int64_t z = 0; z < used; ++z) m_total = fmaxf(m_total, parts[z * (D + 2) + D]);
  T* out = static_cast<T*>(a.out) + bh * D;
  for (int64_t d = threadIdx.x; d < D; d += kThreads) {
    float total = 0.f, o = 0.f;
    for (int64_t z = 0; z < used; ++z) {
      const float* part = parts + z * (D + 2);
      const float weight = part_weight(part[D], m_total);
      total += part[D + 1] * weight;
      o += part[d] * weight;
    }
    out[d] = from_float<T>(total > 0.f ? o / total : 0.f);
  }
}

// Note [Tiled decode attention]
// One thread block of kThreads per (row, KV head), whatever the size G of the KV group, so each key
// and value byte of the row is read from memory exactly once. The block walks the row's context in
// tiles of P positions: every thread loads kChunksPerThread 8-element chunks of the tile's keys and
// values into registers (P x L chunks each, L = lanes per position as above, so P = kTileChunks /
// L: 64 positions at head_dim 64), stores them to shared memory, and issues the next tile's loads
// before computing on this one, so the key and value reads of tile i + 1 overlap the arithmetic of
// tile i. For the arithmetic the block's threads form teams of L lanes, a lane holding kVec
// elements of one query head; the kThreads / L teams are dealt to the G heads R = teams / G at a
// time (R >= 1 is what the kernel requires), and the R teams of a head take every R-th position of
// the tile. A team keeps an online softmax in fp32 (running max, sum, weighted value chunk; it
// rescales only when the max grows), its score being the L lanes' partial dot products summed by
// shuffles. At the end the R teams of each head merge through shared memory. The row's block-table
// entries (up to kTableCache of them) are read into shared memory once, before the first tile.
// Registers: the q and accumulator chunks of one head plus the staged chunks, so occupancy does not
// fall with G as it does for the heads kernel: in 16-bit types the launch bounds ask for 6 blocks
// of 128 threads an SM (74 registers, no spills on sm_90; 8 blocks would spill). Like the heads
// kernel it cuts the contexts of a few long rows into parts (Note [Split decode attention]).
constexpr int kTileChunks = 512;  ///< 8-element chunks of keys (and of values) a tile stages.
constexpr int kChunksPerThread = kTileChunks / kThreads;
constexpr int kTableCache = 128;  ///< Block-table entries a block keeps in shared memory.
static_assert(kTileChunks % kThreads == 0, "every thread stages the same number of chunks");

template <class T>
struct alignas(16) Chunk {
  T e[kVec];
};

// Elements [d0, d0 + kVec) of p as stored; past `dim` as 0. `aligned`: dim % kVec == 0 and
// p + d0 is 16-byte aligned, so the chunk moves in 16-byte loads.
template <class T>
__device__ __forceinline__ Chunk<T> load_raw(const T* p, int64_t d0, int64_t dim, bool aligned) {
  Chunk<T> c;
  if (aligned) {
    constexpr int kLoads = static_cast<int>(sizeof(Chunk<T>)) / 16;
#pragma unroll
    for (int i = 0; i < kLoads; ++i) reinterpret_cast<uint4*>(&c)[i] = reinterpret_cast<const uint4*>(p + d0)[i];
  } else {
#pragma unroll
    for (int i = 0; i < kVec; ++i) c.e[i] = d0 + i < dim ? p[d0 + i] : from_float<T>(0.f);
  }
  return c;
}

template <class T>
__device__ __forceinline__ Chunk<T> zero_chunk() {
  Chunk<T> c;
#pragma unroll
  for (int i = 0; i < kVec; ++i) c.e[i] = from_float<T>(0.f);
  return c;
}

// kLanesLog2: log2 of the lanes per position, a template argument so that the shuffle reduction
// and the tile's index arithmetic unroll.
template <class T, int kLanesLog2>
__global__ void __launch_bounds__(kThreads, sizeof(T) == 2 ? 6 : 1) paged_decode_tiled_kernel(PagedDecodeArgs a) {
  constexpr int lanes_log2 = kLanesLog2, L = 1 << kLanesLog2, P = kTileChunks >> kLanesLog2;
  const int lane = static_cast<int>(threadIdx.x) & (L - 1), team = static_cast<int>(threadIdx.x) >> lanes_log2;
  const int64_t D = a.head_dim, G = a.heads / a.kv_heads;
  const int R = static_cast<int>((kThreads >> lanes_log2) / G);  // teams per head, >= 1
  const int g = team / R, r = team % R;
  const bool active = g < G;  // the teams past G * R compute nothing but join every shuffle and barrier
  const int64_t kv = blockIdx.x, b = blockIdx.y;
  const int64_t d0 = static_cast<int64_t>(lane) * kVec;

  __shared__ Chunk<T> k_tile[kTileChunks], v_tile[kTileChunks];  // [P][L] chunks
  __shared__ float team_m[kThreads], team_l[kThreads];
  __shared__ float team_acc[kThreads * kVec];  // [team][L * kVec]: a team's value sums by element

  float q[kVec];
  const T* qp = static_cast<const T*>(a.q) + (b * a.heads + kv * G + (active ? g : 0)) * D;
#pragma unroll
  for (int i = 0; i < kVec; ++i) q[i] = active && d0 + i < D ? to_float(qp[d0 + i]) * a.scale : 0.f;

  const RowView<T> view = row_view<T>(a, b, kv, blockIdx.z);
  if (a.splits > 1 && view.begin >= view.end) return;  // a part past the row's end: the whole block
  // The row's first kTableCache block-table entries from `begin` on, read once, so that the
  // tiles' lookups after the first cost a shared-memory read instead of a memory round trip.
  __shared__ int64_t table_cache[kTableCache];
  const int bs = static_cast<int>(a.block_size);  // positions fit in 32 bits: 32-bit divisions below
  const int first_block = static_cast<int>(view.begin) / bs;
  const int cached = min(kTableCache, static_cast<int>(view.end - 1) / bs - first_block + 1);
  for (int i = static_cast<int>(threadIdx.x); i < cached; i += kThreads) {
    table_cache[i] = view.table[static_cast<int64_t>(first_block + i) * a.table_entry_stride];
  }
  __syncthreads();

  // Chunk c of a tile is piece c % L of position c / L; positions past the row's end stage zeros.
  Chunk<T> staged_k[kChunksPerThread], staged_v[kChunksPerThread];
  auto fetch = [&](int64_t base) {
#pragma unroll
    for (int j = 0; j < kChunksPerThread; ++j) {
      const int c = static_cast<int>(threadIdx.x) + j * kThreads;
      const int64_t s = base + (c >> lanes_log2), e0 = static_cast<int64_t>(c & (L - 1)) * kVec;
      if (s < view.end && e0 < D) {
        const int si = static_cast<int>(s), block = si / bs - first_block;
        const int64_t entry = block < kTableCache ? table_cache[block]
                                                  : view.table[static_cast<int64_t>(si / bs) * a.table_entry_stride];
        const int64_t row = entry * a.block_size + si % bs;
        staged_k[j] = load_raw(view.keys + row * view.token_stride, e0, D, view.aligned);
        staged_v[j] = load_raw(view.values + row * view.token_stride, e0, D, view.aligned);
      } else {
        staged_k[j] = staged_v[j] = zero_chunk<T>();
      }
    }
  };

  float m = -INFINITY, l = 0.f, acc[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) acc[i] = 0.f;
  fetch(view.begin);
  for (int64_t base = view.begin; base < view.end; base += P) {  // the same iterations in every thread
    __syncthreads();  // the previous tile's readers are done with the shared tile
#pragma unroll
    for (int j = 0; j < kChunksPerThread; ++j) {
      k_tile[threadIdx.x + j * kThreads] = staged_k[j];
      v_tile[threadIdx.x + j * kThreads] = staged_v[j];
    }
    __syncthreads();
    if (base + P < view.end) fetch(base + P);  // in flight while this tile is computed
    const int n = static_cast<int>(min(static_cast<int64_t>(P), view.end - base));
    const int iters = (n + R - 1) / R;
    for (int i = 0; i < iters; ++i) {
      const int t = r + i * R;
      const bool valid = active && t < n;
      float dot = 0.f;
      if (valid) {
        const Chunk<T> k = k_tile[(t << lanes_log2) + lane];
#pragma unroll
        for (int e = 0; e < kVec; ++e) dot += q[e] * to_float(k.e[e]);
      }
#pragma unroll
      for (int offset = L / 2; offset > 0; offset /= 2) dot += __shfl_xor_sync(kFullMask, dot, offset);
      if (!valid) continue;
      float s = dot;
      if (a.softcap > 0.f) s = tanhf(s / a.softcap) * a.softcap;
      if (s > m) {  // a new max: rescale what was summed under the old one (exp(-inf) = 0 at the start)
        const float keep = __expf(m - s);
        l *= keep;
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[e] *= keep;
        m = s;
      }
      const float p = __expf(s - m);
      l += p;
      const Chunk<T> v = v_tile[(t << lanes_log2) + lane];
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[e] += p * to_float(v.e[e]);
    }
  }

  if (lane == 0) {
    team_m[team] = m;
    team_l[team] = l;
  }
#pragma unroll
  for (int e = 0; e < kVec; ++e) team_acc[(team << lanes_log2) * kVec + d0 + e] = acc[e];
  __syncthreads();
  for (int64_t x = threadIdx.x; x < G * D; x += kThreads) {
    const int64_t head = x / D, d = x % D;
    const int first_team = static_cast<int>(head) * R;
    float m_total = -INFINITY;
    for (int k = 0; k < R; ++k) m_total = fmaxf(m_total, team_m[first_team + k]);
    float total = 0.f, o = 0.f;
    for (int k = 0; k < R; ++k) {
      const float weight = part_weight(team_m[first_team + k], m_total);
      total += team_l[first_team + k] * weight;
      o += team_acc[((first_team + k) << lanes_log2) * kVec + d] * weight;
    }
    write_result<T>(a, b, kv * G + head, d, m_total, total, o);
  }
}

// Lanes per position: head_dim / kVec rounded up to a power of two (at most 32).
int lanes_log2_for(int64_t head_dim) {
  int log2 = 0;
  while ((int64_t{1} << log2) * kVec < head_dim) ++log2;
  return log2;
}

template <class T>
void launch_tiled(const PagedDecodeArgs& args, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(args.kv_heads), static_cast<unsigned>(args.batch),
                  static_cast<unsigned>(std::max<int64_t>(args.splits, 1)));
  switch (lanes_log2_for(args.head_dim)) {  // kMaxHeadDim / kVec = 32 lanes at most
    case 0: paged_decode_tiled_kernel<T, 0><<<grid, kThreads, 0, stream>>>(args); break;
    case 1: paged_decode_tiled_kernel<T, 1><<<grid, kThreads, 0, stream>>>(args); break;
    case 2: paged_decode_tiled_kernel<T, 2><<<grid, kThreads, 0, stream>>>(args); break;
    case 3: paged_decode_tiled_kernel<T, 3><<<grid, kThreads, 0, stream>>>(args); break;
    case 4: paged_decode_tiled_kernel<T, 4><<<grid, kThreads, 0, stream>>>(args); break;
    default: paged_decode_tiled_kernel<T, 5><<<grid, kThreads, 0, stream>>>(args); break;
  }
}

// Query heads per block: the KV group's size rounded up to a power of two, at most
// kMaxHeadsPerBlock (larger groups take several blocks per KV head, each loading the KV rows
// again, mostly from L2).
template <class T>
void launch(const PagedDecodeArgs& args, cudaStream_t stream) {
  const int64_t group = args.heads / args.kv_heads, per_block = std::min(group, kMaxHeadsPerBlock);
  const int lanes = 1 << lanes_log2_for(args.head_dim);
  auto run = [&](auto kernel, int64_t g) {
    const dim3 grid(static_cast<unsigned>(args.kv_heads * ((group + g - 1) / g)), static_cast<unsigned>(args.batch),
                    static_cast<unsigned>(std::max<int64_t>(args.splits, 1)));
    kernel<<<grid, kThreads, 0, stream>>>(args, lanes);
  };
  if (per_block <= 1) {
    run(paged_decode_kernel<T, 1>, 1);
  } else if (per_block <= 2) {
    run(paged_decode_kernel<T, 2>, 2);
  } else {
    static_assert(kMaxHeadsPerBlock == 4, "add the kernels for larger groups");
    run(paged_decode_kernel<T, 4>, 4);
  }
}

}  // namespace

int64_t multiprocessor_count(int device) {
  constexpr int kDevices = 64;
  static std::atomic<int> known[kDevices] = {};  // 0: not asked yet
  if (device < 0 || device >= kDevices) return 0;
  int n = known[device].load(std::memory_order_relaxed);
  if (n == 0) {
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      n = 0;
      (void)cudaGetLastError();  // not left for the next launch's check to find
    }
    if (n > 0) known[device].store(n, std::memory_order_relaxed);
  }
  return n > 0 ? n : 0;
}

bool tiled_decode_attention_supported(int64_t heads, int64_t kv_heads, int64_t head_dim) {
  return head_dim >= 1 && head_dim <= kMaxHeadDim && kv_heads >= 1 && heads % kv_heads == 0 &&
         heads / kv_heads <= (kThreads >> lanes_log2_for(head_dim));
}

const char* launch_paged_decode_attention(const PagedDecodeArgs& args, void* stream) {
  if (args.batch == 0) return nullptr;
  auto s = static_cast<cudaStream_t>(stream);
  if (args.tiled && !tiled_decode_attention_supported(args.heads, args.kv_heads, args.head_dim)) {
    return "the tiled decode-attention kernel does not take this KV group and head size";
  }
  if (args.splits > 1 && (args.split_len < 1 || args.partials == nullptr || args.splits > 65535)) {
    return "a split decode-attention launch needs 1 <= splits <= 65535, split_len >= 1 and a partials buffer";
  }
  proto::cuda::with_element_type(args.dtype, [&](auto e) {
    using T = decltype(e);
    if (args.tiled) {
      launch_tiled<T>(args, s);
    } else {
      launch<T>(args, s);
    }
    if (args.splits > 1) {  // Note [Split decode attention]: one block per (row, query head) merges its parts
      merge_parts_kernel<T><<<static_cast<unsigned>(args.batch * args.heads), kThreads, 0, s>>>(args);
    }
  });
  return proto::cuda::last_launch_error();
}

}  // namespace tessera::rollout::cuda
