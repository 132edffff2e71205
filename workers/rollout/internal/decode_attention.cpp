// decode_attention.cpp: the single-token paged attention kernel. One (row, head) pair at a time:
// scores over the row's positions, a max-subtracted softmax in fp32, then the weighted sum of
// values. The AVX2 variant is compiled with a target attribute and chosen at run time, so the
// build needs no -march flag (which would break the shared precompiled header).
#include "workers/rollout/internal/decode_attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/torch.h>

#include "proto/cuda/launch.hpp"
#include "workers/rollout/cuda/paged_attention.hpp"

namespace tessera::rollout::internal {
namespace {

/// One (row, head): q [D]; position s's key/value row at keys/values + offset(s); writes out [D].
struct HeadTask {
  const float* q;
  const float* keys;    ///< Pool base plus this head's offset.
  const float* values;
  const int64_t* table;  ///< The row's block table.
  int64_t table_stride;  ///< Elements between consecutive table entries.
  int64_t block_size;
  int64_t token_stride;  ///< Elements between consecutive rows of the pool (KV * D).
  int64_t begin, end;    ///< Positions attended: [begin, end).
  float* out;
  int64_t dim;
  float scale;

  int64_t offset(int64_t s) const {
    return (table[(s / block_size) * table_stride] * block_size + s % block_size) * token_stride;
  }
};

// Turns the raw scores p[0 .. end-begin) into normalised weights in place.
void softmax(const HeadTask& t, float* p, float max_score) {
  float sum = 0.f;
  const int64_t n = t.end - t.begin;
  for (int64_t i = 0; i < n; ++i) {
    p[i] = std::exp(p[i] - max_score);
    sum += p[i];
  }
  const float inv = 1.f / sum;
  for (int64_t i = 0; i < n; ++i) p[i] *= inv;
}

void head_scalar(const HeadTask& t, float* p) {
  float max_score = -INFINITY;
  for (int64_t s = t.begin; s < t.end; ++s) {
    const float* k = t.keys + t.offset(s);
    float acc = 0.f;
    for (int64_t d = 0; d < t.dim; ++d) acc += t.q[d] * k[d];
    p[s - t.begin] = acc * t.scale;
    max_score = std::max(max_score, p[s - t.begin]);
  }
  softmax(t, p, max_score);
  std::fill(t.out, t.out + t.dim, 0.f);
  for (int64_t s = t.begin; s < t.end; ++s) {
    const float w = p[s - t.begin];
    const float* v = t.values + t.offset(s);
    for (int64_t d = 0; d < t.dim; ++d) t.out[d] += w * v[d];
  }
}

__attribute__((target("avx2,fma"))) float dot_avx2(const float* a, const float* b, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t d = 0; d < n; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc);
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  x = _mm_hadd_ps(x, x);
  x = _mm_hadd_ps(x, x);
  return _mm_cvtss_f32(x);
}

// REQUIRES: dim % 8 == 0. Accumulates 64 output lanes at a time in registers.
__attribute__((target("avx2,fma"))) void head_avx2(const HeadTask& t, float* p) {
  float max_score = -INFINITY;
  for (int64_t s = t.begin; s < t.end; ++s) {
    p[s - t.begin] = dot_avx2(t.q, t.keys + t.offset(s), t.dim) * t.scale;
    max_score = std::max(max_score, p[s - t.begin]);
  }
  softmax(t, p, max_score);
  for (int64_t d0 = 0; d0 < t.dim; d0 += 64) {
    const int64_t lanes = std::min<int64_t>(64, t.dim - d0) / 8;
    __m256 acc[8];
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t s = t.begin; s < t.end; ++s) {
      const __m256 w = _mm256_set1_ps(p[s - t.begin]);
      const float* v = t.values + t.offset(s) + d0;
      for (int64_t i = 0; i < lanes; ++i) acc[i] = _mm256_fmadd_ps(w, _mm256_loadu_ps(v + 8 * i), acc[i]);
    }
    for (int64_t i = 0; i < lanes; ++i) _mm256_storeu_ps(t.out + d0 + 8 * i, acc[i]);
  }
}

bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

}  // namespace

bool paged_decode_attention_supported(const at::Tensor& pool) {
  return pool.scalar_type() == at::kFloat && pool.device().is_cpu() && pool.is_contiguous() && pool.dim() == 4;
}

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& key_pool, const at::Tensor& value_pool,
                                  const at::Tensor& block_tables, const at::Tensor& context_lens, int64_t window) {
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t block_size = key_pool.size(1), KV = key_pool.size(2), groups = H / KV;
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && context_lens.scalar_type() == at::kLong &&
                  block_tables.device().is_cpu() && context_lens.device().is_cpu(),
              "paged_decode_attention: block tables and context lengths must be int64 on the CPU");
  at::Tensor out = at::empty({B, H * D}, q.options());
  const float* qd = q.data_ptr<float>();
  const float* kd = key_pool.data_ptr<float>();
  const float* vd = value_pool.data_ptr<float>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = context_lens.data_ptr<int64_t>();
  const int64_t row_stride = block_tables.stride(0), entry_stride = block_tables.stride(1);
  const int64_t len_stride = context_lens.stride(0);
  float* od = out.data_ptr<float>();
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  const bool simd = cpu_has_avx2() && D % 8 == 0;
  int64_t longest = 1;
  for (int64_t b = 0; b < B; ++b) longest = std::max(longest, lens[b * len_stride]);
  at::parallel_for(0, B * H, /*grain_size=*/1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(static_cast<size_t>(longest));
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, kv = bh % H / groups, len = lens[b * len_stride];
      const int64_t first = window > 0 ? std::max<int64_t>(0, len - window) : 0;
      HeadTask task{qd + bh * D, kd + kv * D, vd + kv * D, tables + b * row_stride, entry_stride, block_size,
                    KV * D, first, len, od + bh * D, D, scale};
      if (simd) {
        head_avx2(task, scores.data());
      } else {
        head_scalar(task, scores.data());
      }
    }
  });
  return out;
}

namespace {

// The most positions a row attends to: its capacity, or the window when that is shorter.
int64_t attended_span(int64_t capacity, int64_t window) { return window > 0 ? std::min(capacity, window) : capacity; }

}  // namespace

DecodeSplit choose_decode_split(int64_t batch, int64_t heads, int64_t kv_heads, int64_t capacity, int64_t window,
                                bool tiled, int64_t sm_count) {
  const int64_t span = attended_span(capacity, window);
  if (batch < 1 || kv_heads < 1 || heads < kv_heads || sm_count < 1 || span < 2 * kMinSplitLen) return {};
  const auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  const int64_t group = heads / kv_heads;
  const int64_t blocks = batch * kv_heads * (tiled ? 1 : ceil_div(group, std::min(group, cuda::kMaxHeadsPerBlock)));
  const int64_t splits = std::min({ceil_div(2 * sm_count, blocks), span / kMinSplitLen, kMaxSplits});
  if (splits <= 1) return {};
  const int64_t split_len = ceil_div(span, splits);
  return {ceil_div(span, split_len), split_len};
}

namespace {

// The attention paged_decode_attention_cuda computes, by torch ops in fp32 on the pools' device.
at::Tensor torch_paged_attention(const at::Tensor& q, const at::Tensor& key_pool, const at::Tensor& value_pool,
                                 const at::Tensor& tables, const at::Tensor& lens, int64_t window, double scale,
                                 double softcap) {
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), KV = key_pool.size(2);
  const int64_t L = tables.size(1) * key_pool.size(1);
  auto gather = [&](const at::Tensor& pool) {
    return pool.index_select(0, tables.reshape({-1})).view({B, L, KV, D}).transpose(1, 2).to(at::kFloat)
        .repeat_interleave(H / KV, 1);  // [B, H, L, D]
  };
  at::Tensor scores = at::matmul(q.to(at::kFloat).unsqueeze(2), gather(key_pool).transpose(-1, -2)).squeeze(2) * scale;
  if (softcap > 0) scores = at::tanh(scores / softcap) * softcap;
  const at::Tensor pos = at::arange(L, lens.options()).unsqueeze(0), len = lens.unsqueeze(1);
  at::Tensor visible = pos < len;
  if (window > 0) visible = visible.logical_and(pos >= len - window);
  scores = scores.masked_fill(visible.unsqueeze(1).logical_not(), -std::numeric_limits<float>::infinity());
  return at::matmul(at::softmax(scores, -1).unsqueeze(2), gather(value_pool)).squeeze(2).reshape({B, H * D});
}

constexpr const char* kPagedKernel = "rollout: the paged decode-attention CUDA kernel";
constexpr const char* kTiledKernel = "rollout: the tiled paged decode-attention CUDA kernel";
constexpr const char* kPagedSplit = "rollout: the paged decode-attention CUDA kernel, split into parts,";
constexpr const char* kTiledSplit = "rollout: the tiled paged decode-attention CUDA kernel, split into parts,";
constexpr const char* kPagedFix = "set actor_rollout_ref.rollout.engine_kwargs.tessera.decode_attention=gather";
constexpr const char* kTiledFix = "set actor_rollout_ref.rollout.engine_kwargs.tessera.decode_attention=heads";
constexpr const char* kSplitFix = "set actor_rollout_ref.rollout.engine_kwargs.tessera.split_decode_attention=false";

// The kernel against torch_paged_attention on a small random problem (Note [Kernel self-check]),
// each row's positions cut into `splits` parts (1: not cut; 3: parts of 4 positions, of 2 within
// the window, some of them past a row's end).
Status compare_paged_kernel_with_torch(c10::Device device, c10::ScalarType dtype, bool tiled, int64_t splits) {
  at::Generator gen = at::detail::createCPUGenerator(20261126);
  const auto on = [&](const at::Tensor& t) { return t.to(device); };
  const int64_t blocks = 9, bs = 4, KV = 2, H = 6, D = 80, B = 3, M = 3;
  const at::Tensor key_pool = on(at::randn({blocks, bs, KV, D}, gen).to(dtype));
  const at::Tensor value_pool = on(at::randn({blocks, bs, KV, D}, gen).to(dtype));
  const at::Tensor q = on(at::randn({B, H, D}, gen).to(dtype));
  const at::Tensor tables = on(at::tensor({3, 1, 7, 5, 2, 0, 8, 6, 4}, at::kLong).view({B, M}));
  const at::Tensor lens = on(at::tensor({11, 6, 12}, at::kLong));
  double worst = 0;
  for (auto [window, softcap] : {std::pair<int64_t, double>{0, 0.0}, {5, 0.0}, {0, 3.0}}) {
    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    at::Tensor got =
        paged_decode_attention_cuda(q, key_pool, value_pool, tables, lens, window, scale, softcap, tiled, splits);
    at::Tensor want = torch_paged_attention(q, key_pool, value_pool, tables, lens, window, scale, softcap);
    // Host boundary, deliberate: a one-time check per process and (device, dtype), before any
    // generation (never inside a step or a graph capture); its verdict must reach the host.
    worst = std::max(worst, (got.to(at::kFloat) - want).abs().max().item<double>());
  }
  const double tolerance = dtype == at::kFloat ? 1e-4 : 2e-2;
  if (worst <= tolerance) return Status();
  const char* what = splits > 1 ? (tiled ? kTiledSplit : kPagedSplit) : (tiled ? kTiledKernel : kPagedKernel);
  return make_error(ErrorCode::internal, "{} disagrees with torch on {} in {} (max diff {:.3g}); {}", what,
                    device.str(), c10::toString(dtype), worst, splits > 1 ? kSplitFix : (tiled ? kTiledFix : kPagedFix));
}

}  // namespace

Status check_paged_decode_attention_cuda(c10::Device device, c10::ScalarType dtype, bool tiled, bool split) {
  static proto::cuda::CheckOnce heads_verdicts, tiled_verdicts, heads_split_verdicts, tiled_split_verdicts;
  TESSERA_RETURN_IF_ERROR((tiled ? tiled_verdicts : heads_verdicts)
                              .get(device, dtype, tiled ? kTiledKernel : kPagedKernel, tiled ? kTiledFix : kPagedFix,
                                   [&] { return compare_paged_kernel_with_torch(device, dtype, tiled, 1); }));
  if (!split) return Status();
  return (tiled ? tiled_split_verdicts : heads_split_verdicts)
      .get(device, dtype, tiled ? kTiledSplit : kPagedSplit, kSplitFix,
           [&] { return compare_paged_kernel_with_torch(device, dtype, tiled, 3); });
}

bool tiled_decode_attention_supported(int64_t heads, int64_t kv_heads, int64_t head_dim) {
#if TESSERA_WITH_CUDA
  return cuda::tiled_decode_attention_supported(heads, kv_heads, head_dim);
#else
  (void)heads, (void)kv_heads, (void)head_dim;
  return false;
#endif
}

bool paged_decode_attention_cuda_supported(const at::Tensor& pool) {
#if TESSERA_WITH_CUDA
  const auto dtype = pool.scalar_type();
  return pool.is_cuda() && pool.is_contiguous() && pool.dim() == 4 && pool.size(3) <= cuda::kMaxHeadDim &&
         (dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16);
#else
  (void)pool;
  return false;
#endif
}

at::Tensor paged_decode_attention_cuda(const at::Tensor& q, const at::Tensor& key_pool, const at::Tensor& value_pool,
                                       const at::Tensor& block_tables, const at::Tensor& context_lens, int64_t window,
                                       double scale, double softcap, bool tiled, int64_t splits) {
#if TESSERA_WITH_CUDA
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2);
  TORCH_CHECK(splits == -1 || (splits >= 1 && splits <= kMaxSplits), "paged_decode_attention_cuda: splits=", splits);
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && context_lens.scalar_type() == at::kLong &&
                  block_tables.device() == key_pool.device() && context_lens.device() == key_pool.device(),
              "paged_decode_attention_cuda: block tables and context lengths must be int64 on ", key_pool.device());
  const at::Tensor query = q.to(key_pool.scalar_type()).contiguous();
  at::Tensor out = at::empty({B, H * D}, query.options());
  cuda::PagedDecodeArgs args;
  args.q = query.data_ptr();
  args.key_pool = key_pool.data_ptr();
  args.value_pool = value_pool.data_ptr();
  args.block_tables = block_tables.data_ptr<int64_t>();
  args.table_row_stride = block_tables.stride(0);
  args.table_entry_stride = block_tables.stride(1);
  args.context_lens = context_lens.data_ptr<int64_t>();
  args.len_stride = context_lens.stride(0);
  args.out = out.data_ptr();
  args.batch = B;
  args.heads = H;
  args.kv_heads = key_pool.size(2);
  args.head_dim = D;
  args.block_size = key_pool.size(1);
  args.window = window;
  args.scale = static_cast<float>(scale);
  args.softcap = static_cast<float>(softcap);
  args.dtype = proto::cuda::element_type_of(key_pool, "paged decode attention");
  args.tiled = tiled;
  // Note [Split decode attention]: the parts are chosen from shapes (the table's width stands for
  // the rows' lengths), never from the lengths on the device.
  const int64_t capacity = block_tables.size(1) * args.block_size;
  DecodeSplit split;
  if (splits == -1) {
    split = choose_decode_split(B, H, args.kv_heads, capacity, window, tiled,
                                cuda::multiprocessor_count(key_pool.device().index()));
  } else if (splits > 1) {
    split.split_len = std::max<int64_t>(1, (attended_span(capacity, window) + splits - 1) / splits);
    split.splits = splits;
  }
  at::Tensor partials;
  if (split.splits > 1) {
    partials = at::empty({cuda::decode_split_partial_floats(B, H, D, split.splits)}, query.options().dtype(at::kFloat));
    args.splits = split.splits;
    args.split_len = split.split_len;
    args.partials = partials.data_ptr<float>();
  }
  proto::cuda::check_launch("paged decode attention",
                            cuda::launch_paged_decode_attention(args, proto::cuda::stream_of(key_pool)));
  return out;
#else
  (void)q, (void)key_pool, (void)value_pool, (void)block_tables, (void)context_lens, (void)window, (void)scale,
      (void)softcap, (void)tiled, (void)splits;
  TORCH_CHECK(false, "paged_decode_attention_cuda: this build has no CUDA");
#endif
}

}  // namespace tessera::rollout::internal
