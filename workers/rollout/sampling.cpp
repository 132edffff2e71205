// sampling.cpp: vLLM-compatible token selection. See sampling.hpp for the rules.
#include "workers/rollout/sampling.hpp"

#include <cmath>
#include <limits>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "proto/host_transfer.hpp"

namespace tessera::rollout {
namespace {

// vLLM's _SAMPLING_EPS: a temperature below it is greedy decoding.
constexpr double kSamplingEps = 1e-5;

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Keeps logits >= the k-th largest of their row (ties at the threshold survive, as in vLLM).
at::Tensor apply_top_k(const at::Tensor& logits, int64_t top_k) {
  if (top_k <= 0 || top_k >= logits.size(1)) return logits;
  at::Tensor kth = std::get<0>(logits.topk(top_k, /*dim=*/1)).narrow(1, top_k - 1, 1);
  return logits.masked_fill(logits.lt(kth), -std::numeric_limits<float>::infinity());
}

// Keeps the descending prefix whose exclusive cumulative probability is < top_p (the token that
// crosses top_p stays; the top token always stays).
at::Tensor apply_top_p(const at::Tensor& logits, double top_p) {
  if (top_p >= 1.0) return logits;
  auto [sorted, order] = logits.sort(/*dim=*/1, /*descending=*/true);
  at::Tensor probs = at::softmax(sorted, 1);
  at::Tensor exclusive = probs.cumsum(1) - probs;
  at::Tensor removed = exclusive.ge(top_p);
  removed.narrow(1, 0, 1).fill_(false);
  at::Tensor filtered_sorted = sorted.masked_fill(removed, -std::numeric_limits<float>::infinity());
  return at::empty_like(logits).scatter_(1, order, filtered_sorted);
}

// Inverse-CDF draw: the first token whose cumulative probability exceeds u * total. The CDF is
// monotone (a cumulative sum of non-negative terms, rounded monotonically) and a zero-probability
// token repeats its predecessor's value exactly; with the target kept strictly below the total,
// searchsorted(right) therefore always lands on a token of positive probability.
at::Tensor inverse_cdf(const at::Tensor& filtered_logits, const std::vector<double>& uniforms) {
  const int64_t n = filtered_logits.size(0);
  at::Tensor cdf = at::softmax(filtered_logits, 1, at::kFloat).cumsum(1);
  at::Tensor total = cdf.narrow(1, cdf.size(1) - 1, 1);
  // On the logits' device, with the host's rounding: float(u * double(total)), kept strictly
  // below the total. The uniforms come from the host's per-row generators, so a GPU draws the
  // same tokens as the CPU from the same seed.
  // Through pinned memory: a pageable upload would wait for the step's forward to finish
  // (Note [Host transfers]).
  at::Tensor u = proto::upload(uniforms, cdf.device()).view({n, 1});
  at::Tensor scaled = (u * total.to(at::kDouble)).to(at::kFloat);
  at::Tensor target = at::minimum(scaled, at::nextafter(total, at::zeros_like(total)));
  at::Tensor idx = at::searchsorted(cdf, target, /*out_int32=*/false, /*right=*/true);
  return idx.squeeze(1).clamp_max(filtered_logits.size(1) - 1);
}

}  // namespace

SamplingParams resolve_sampling(const RolloutConfig& config, bool do_sample, bool validate) {
  SamplingParams p;
  if (!do_sample) {
    p.greedy = true;
    p.temperature = 0.0;
    return p;
  }
  const SamplingConfig& s = validate ? config.val_kwargs
                                     : SamplingConfig{config.temperature, config.top_k, config.top_p, 1, true};
  p.temperature = s.temperature;
  p.top_k = s.top_k;
  p.top_p = s.top_p;
  p.greedy = s.temperature < kSamplingEps;
  return p;
}

RowRng::RowRng(uint64_t seed) : generator_(at::detail::createCPUGenerator(seed)) {}

double RowRng::next_uniform() {
  auto* impl = at::check_generator<at::CPUGeneratorImpl>(generator_);
  return static_cast<double>(impl->random64() >> 11) * 0x1.0p-53;
}

uint64_t row_seed(uint64_t call_seed, int64_t row) {
  return splitmix64(call_seed ^ splitmix64(static_cast<uint64_t>(row)));
}

at::Tensor apply_top_k_top_p(const at::Tensor& logits, int64_t top_k, double top_p) {
  return apply_top_p(apply_top_k(logits, top_k), top_p);
}

SampledTokens sample_tokens(const at::Tensor& logits, const SamplingParams& params,
                            const std::vector<double>& uniforms, bool want_logprobs) {
  at::NoGradGuard no_grad;
  SampledTokens out;
  if (params.greedy) {
    out.tokens = logits.argmax(1);
    if (want_logprobs) out.logprobs = at::log_softmax(logits, 1).gather(1, out.tokens.unsqueeze(1)).squeeze(1);
    return out;
  }
  at::Tensor scaled = params.temperature == 1.0 ? logits : logits / params.temperature;
  out.tokens = inverse_cdf(apply_top_k_top_p(scaled, params.top_k, params.top_p), uniforms);
  if (want_logprobs) out.logprobs = at::log_softmax(scaled, 1).gather(1, out.tokens.unsqueeze(1)).squeeze(1);
  return out;
}

}  // namespace tessera::rollout
