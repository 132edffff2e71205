// decode_attention.cpp: the single-token attention kernel. One (row, head) pair at a time:
// scores over the visible columns, a max-subtracted softmax in fp32, then the weighted sum of
// values. The AVX2 variant is compiled with a target attribute and chosen at run time, so the
// build needs no -march flag (which would break the shared precompiled header).
#include "workers/rollout/internal/decode_attention.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/torch.h>

namespace tessera::rollout::internal {
namespace {

/// One (row, head): q [D], keys/values [S, D] rows, visible [S]; writes out [D].
struct HeadTask {
  const float* q;
  const float* keys;
  const float* values;
  const bool* visible;
  float* out;
  int64_t columns;
  int64_t dim;
  float scale;
};

// Turns raw scores into normalised weights in place; returns false if nothing is visible.
bool softmax_visible(const HeadTask& t, float* p, float max_score) {
  if (max_score == -INFINITY) return false;
  float sum = 0.f;
  for (int64_t s = 0; s < t.columns; ++s) {
    p[s] = t.visible[s] ? std::exp(p[s] - max_score) : 0.f;
    sum += p[s];
  }
  const float inv = 1.f / sum;
  for (int64_t s = 0; s < t.columns; ++s) p[s] *= inv;
  return true;
}

void head_scalar(const HeadTask& t, float* p) {
  float max_score = -INFINITY;
  for (int64_t s = 0; s < t.columns; ++s) {
    if (!t.visible[s]) continue;
    const float* k = t.keys + s * t.dim;
    float acc = 0.f;
    for (int64_t d = 0; d < t.dim; ++d) acc += t.q[d] * k[d];
    p[s] = acc * t.scale;
    max_score = std::max(max_score, p[s]);
  }
  std::fill(t.out, t.out + t.dim, 0.f);
  if (!softmax_visible(t, p, max_score)) return;
  for (int64_t s = 0; s < t.columns; ++s) {
    if (p[s] == 0.f) continue;
    const float* v = t.values + s * t.dim;
    for (int64_t d = 0; d < t.dim; ++d) t.out[d] += p[s] * v[d];
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
  for (int64_t s = 0; s < t.columns; ++s) {
    if (!t.visible[s]) continue;
    p[s] = dot_avx2(t.q, t.keys + s * t.dim, t.dim) * t.scale;
    max_score = std::max(max_score, p[s]);
  }
  std::fill(t.out, t.out + t.dim, 0.f);
  if (!softmax_visible(t, p, max_score)) return;
  for (int64_t d0 = 0; d0 < t.dim; d0 += 64) {
    const int64_t lanes = std::min<int64_t>(64, t.dim - d0) / 8;
    __m256 acc[8];
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
    for (int64_t s = 0; s < t.columns; ++s) {
      if (p[s] == 0.f) continue;
      const __m256 w = _mm256_set1_ps(p[s]);
      const float* v = t.values + s * t.dim + d0;
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

bool decode_attention_supported(const at::Tensor& keys) {
  return keys.scalar_type() == at::kFloat && keys.device().is_cpu() && keys.is_contiguous() && keys.dim() == 4;
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                            const at::Tensor& visible, int64_t columns) {
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), KV = keys.size(1), capacity = keys.size(2);
  const int64_t groups = H / KV, mask_stride = visible.stride(0);
  at::Tensor out = at::empty({B, H * D}, q.options());
  const float* qd = q.data_ptr<float>();
  const float* kd = keys.data_ptr<float>();
  const float* vd = values.data_ptr<float>();
  const bool* md = visible.data_ptr<bool>();
  float* od = out.data_ptr<float>();
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  const bool simd = cpu_has_avx2() && D % 8 == 0;
  at::parallel_for(0, B * H, /*grain_size=*/1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(static_cast<size_t>(columns));
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, kv = bh % H / groups;
      const int64_t cache_offset = (b * KV + kv) * capacity * D;
      HeadTask task{qd + bh * D, kd + cache_offset, vd + cache_offset, md + b * mask_stride, od + bh * D, columns, D, scale};
      if (simd) {
        head_avx2(task, scores.data());
      } else {
        head_scalar(task, scores.data());
      }
    }
  });
  return out;
}

}  // namespace tessera::rollout::internal
