// sampling.cpp: vLLM-compatible token selection. See sampling.hpp for the rules.
#include "workers/rollout/sampling.hpp"

#include <cmath>
#include <limits>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "proto/cuda/launch.hpp"
#include "proto/host_transfer.hpp"
#include "workers/rollout/cuda/fused_sampling.hpp"

namespace tessera::rollout {
namespace {

#if TESSERA_WITH_CUDA
constexpr bool kWithCuda = true;
#else
constexpr bool kWithCuda = false;
#endif

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
  // Note [Unsampleable rows]: a NaN total (a NaN or inf logit) or a zero one (all -inf).
  return at::where(total.squeeze(1) > 0, idx.squeeze(1).clamp_max(filtered_logits.size(1) - 1), -1);
}

// log_softmax(scaled) at `tokens`; an unsampleable row's -1 reads column 0 (its log-softmax is
// NaN there too), so that the gather never indexes outside the row.
at::Tensor logprobs_at(const at::Tensor& scaled, const at::Tensor& tokens) {
  return at::log_softmax(scaled, 1).gather(1, tokens.clamp_min(0).unsqueeze(1)).squeeze(1);
}

// The fused kernel's draw (Note [Fused sampling]); fused_sampling_applies(logits, ...) holds.
SampledTokens fused_sample(const at::Tensor& logits, double temperature, const std::vector<double>& uniforms,
                           bool want_logprobs) {
  SampledTokens out;
#if TESSERA_WITH_CUDA
  const at::Tensor x = logits.contiguous();
  const int64_t n = x.size(0);
  const at::Tensor u = proto::upload(uniforms, x.device());
  out.tokens = at::empty({n}, x.options().dtype(at::kLong));
  if (want_logprobs) out.logprobs = at::empty({n}, x.options().dtype(at::kFloat));
  cuda::FusedSamplingArgs args;
  args.logits = x.data_ptr();
  args.dtype = proto::cuda::element_type_of(x, "fused sampling");
  args.row_stride = x.stride(0);
  args.uniforms = u.data_ptr<double>();
  args.tokens = out.tokens.data_ptr<int64_t>();
  args.logprobs = want_logprobs ? out.logprobs.data_ptr<float>() : nullptr;
  args.rows = n;
  args.vocab = x.size(1);
  args.temperature = static_cast<float>(temperature);
  proto::cuda::check_launch("fused sampling", cuda::launch_fused_sampling(args, proto::cuda::stream_of(x)));
#else
  (void)logits, (void)temperature, (void)uniforms, (void)want_logprobs;
  TORCH_CHECK(false, "fused sampling: this build has no CUDA");
#endif
  return out;
}

constexpr const char* kFusedSampling = "rollout: the fused sampling kernel";
constexpr const char* kFusedSamplingFix = "set actor_rollout_ref.rollout.engine_kwargs.tessera.sampler=torch";

// The kernel's draws against the float64 CDF (Note [Kernel self-check] in internal/decode_attention.hpp):
// each token must have positive probability and sit where u falls in the exact CDF of the logits
// as `dtype` holds them, up to the rounding of fp32 sums; its log-prob must be log p.
Status compare_fused_sampling(c10::Device device, c10::ScalarType dtype) {
  at::Generator gen = at::detail::createCPUGenerator(20261126);
  const int64_t rows = 8, vocab = 5003;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  at::Tensor logits = at::randn({rows, vocab}, gen) * 3;
  logits.index_put_({0, at::indexing::Slice(0, 100)}, -inf);
  logits.index_put_({1, at::indexing::Slice(vocab - 7, vocab)}, -inf);
  logits.index_put_({2, 17}, 40.0f);  // one token holds almost all the mass
  // Note [Unsampleable rows]: a NaN whose thread of the block sees only -inf logits in a row whose
  // one finite logit is another warp's (the kernel's partial sums must keep it), and a NaN among
  // finite logits.
  logits.index_put_({6}, -inf);
  logits.index_put_({6, 0}, 1.0f);
  logits.index_put_({6, 64 + 1024 * 4}, nan);
  logits.index_put_({7, 4000}, nan);
  logits = logits.to(dtype).to(at::kFloat);  // the values the kernel reads
  const std::vector<double> uniforms = {0.0, 0.999999, 0.5, 0.25, 0.731, 0.999999999, 0.5, 0.5};
  SamplingParams params;
  params.temperature = 0.7;
  params.fused = true;
  const at::Tensor on_device = logits.to(dtype).to(device);
  if (!fused_sampling_applies(on_device, params)) return Status();
  SampledTokens got = fused_sample(on_device, params.temperature, uniforms, /*want_logprobs=*/true);
  // Host boundary, deliberate: a one-time check per process, device and dtype, before any
  // generation; the draws are compared on the host with the float64 CDF.
  const at::Tensor tokens = got.tokens.cpu(), logprobs = got.logprobs.cpu();
  const at::Tensor p = at::softmax(logits.to(at::kDouble) / params.temperature, 1), cdf = p.cumsum(1);
  const auto tok = tokens.accessor<int64_t, 1>();
  const auto lp = logprobs.accessor<float, 1>();
  const auto prob = p.accessor<double, 2>(), cum = cdf.accessor<double, 2>();
  for (int64_t r : {6, 7}) {
    if (tok[r] != -1 || !std::isnan(lp[r])) {
      return make_error(ErrorCode::internal, "{} on {} drew token {} (log-prob {}) from a row with a NaN logit, where it "
                                             "must give -1 and NaN; {}",
                        kFusedSampling, device.str(), tok[r], lp[r], kFusedSamplingFix);
    }
  }
  for (int64_t r = 0; r < 6; ++r) {
    const int64_t t = tok[r];
    const double u = uniforms[static_cast<size_t>(r)];
    const bool in_vocab = t >= 0 && t < vocab;
    const double lo = in_vocab && t > 0 ? cum[r][t - 1] : 0.0, hi = in_vocab ? cum[r][t] : -1.0;
    const double pt = in_vocab ? prob[r][t] : 0.0;
    const bool placed = pt > 0 && lo <= u + 1e-5 && hi >= u - 1e-5;
    const double lp_err = placed ? std::abs(std::log(pt) - lp[r]) : 0.0;
    if (!placed || !(lp_err < 1e-3)) {
      return make_error(ErrorCode::internal,
                        "{} on {} drew token {} for u={} (probability {:.3g}, CDF [{:.6f}, {:.6f}], log-prob error "
                        "{:.3g}); {}",
                        kFusedSampling, device.str(), t, u, pt, lo, hi, lp_err, kFusedSamplingFix);
    }
  }
  return Status();
}

}  // namespace

bool fused_sampling_applies(const at::Tensor& logits, const SamplingParams& params) {
  const auto dtype = logits.scalar_type();
  return kWithCuda && params.fused && !params.greedy && (params.top_k <= 0 || params.top_k >= logits.size(-1)) &&
         params.top_p >= 1.0 && logits.is_cuda() &&
         (dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf) && logits.dim() == 2 &&
         logits.size(1) < std::numeric_limits<int32_t>::max();
}

Status check_fused_sampling_cuda(c10::Device device, c10::ScalarType dtype) {
  static proto::cuda::CheckOnce verdicts;
  return verdicts.get(device, dtype, kFusedSampling, kFusedSamplingFix,
                      [&] { return compare_fused_sampling(device, dtype); });
}

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

SampledTokens sample_tokens(const at::Tensor& given, const SamplingParams& params,
                            const std::vector<double>& uniforms, bool want_logprobs) {
  at::NoGradGuard no_grad;
  if (fused_sampling_applies(given, params)) return fused_sample(given, params.temperature, uniforms, want_logprobs);
  // The torch ops compute in fp32; widening a bf16 or fp16 logit is exact.
  const at::Tensor logits = given.to(at::kFloat);
  SampledTokens out;
  if (params.greedy) {
    auto [best, argmax] = at::max(logits, 1);  // a NaN is the maximum of its row
    out.tokens = at::where(best.isfinite(), argmax, -1);  // Note [Unsampleable rows]
    if (want_logprobs) out.logprobs = logprobs_at(logits, out.tokens);
    return out;
  }
  at::Tensor scaled = params.temperature == 1.0 ? logits : logits / params.temperature;
  out.tokens = inverse_cdf(apply_top_k_top_p(scaled, params.top_k, params.top_p), uniforms);
  if (want_logprobs) out.logprobs = logprobs_at(scaled, out.tokens);
  return out;
}

}  // namespace tessera::rollout
