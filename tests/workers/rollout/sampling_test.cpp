// The sampler against independent maths: over many draws on fixed logits, token frequencies match
// the temperature / top-k / top-p distribution computed here in double (chi-square), and nothing
// outside the top-k / nucleus is ever drawn. Plus greedy, resolve_sampling and the row streams.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "workers/rollout/sampling.hpp"

namespace tessera::rollout {
namespace {

const std::vector<double> kLogits = {2.0, 1.2, 3.1, -0.5, 0.7, 2.6, -2.0, 1.9};

// vLLM's rule written out plainly: softmax(l / T); keep the k largest; renormalise; walk down in
// probability order keeping tokens while the mass before them is < top_p; renormalise.
std::vector<double> expected_distribution(double temperature, int64_t top_k, double top_p) {
  const size_t V = kLogits.size();
  std::vector<size_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [](size_t a, size_t b) { return kLogits[a] > kLogits[b]; });
  std::vector<double> p(V, 0.0);
  const size_t keep_k = top_k > 0 ? std::min<size_t>(static_cast<size_t>(top_k), V) : V;
  double z = 0;
  for (size_t i = 0; i < keep_k; ++i) z += std::exp(kLogits[order[i]] / temperature);
  double before = 0;
  for (size_t i = 0; i < keep_k; ++i) {
    double q = std::exp(kLogits[order[i]] / temperature) / z;
    if (i > 0 && before >= top_p) break;
    p[order[i]] = q;
    before += q;
  }
  double mass = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& x : p) x /= mass;
  return p;
}

// Draws `n` tokens from kLogits with one RowRng; returns the counts per token.
std::vector<int64_t> draw(const SamplingParams& params, int64_t n, uint64_t seed) {
  at::Tensor logits = at::tensor(kLogits, at::kDouble).to(at::kFloat).unsqueeze(0).expand({n, -1}).contiguous();
  RowRng rng(seed);
  std::vector<double> u(static_cast<size_t>(n));
  for (double& x : u) x = rng.next_uniform();
  at::Tensor tokens = sample_tokens(logits, params, u, /*want_logprobs=*/false).tokens;
  std::vector<int64_t> counts(kLogits.size(), 0);
  for (int64_t i = 0; i < n; ++i) counts[static_cast<size_t>(tokens[i].item<int64_t>())] += 1;
  return counts;
}

struct Case {
  const char* name;
  double temperature;
  int64_t top_k;
  double top_p;
};

class SamplerDistribution : public ::testing::TestWithParam<Case> {};

TEST_P(SamplerDistribution, MatchesTheFilteredSoftmax) {
  const Case c = GetParam();
  const int64_t n = 40000;
  std::vector<double> p = expected_distribution(c.temperature, c.top_k, c.top_p);
  std::vector<int64_t> counts = draw({false, c.temperature, c.top_k, c.top_p}, n, 1234);
  double chi2 = 0;
  int64_t support = 0;
  for (size_t v = 0; v < p.size(); ++v) {
    if (p[v] == 0.0) {
      EXPECT_EQ(counts[v], 0) << "token " << v << " is outside the top-k / nucleus but was drawn";
      continue;
    }
    ++support;
    double e = p[v] * static_cast<double>(n);
    chi2 += (static_cast<double>(counts[v]) - e) * (static_cast<double>(counts[v]) - e) / e;
  }
  // 99.99th percentile of chi-square with support - 1 <= 7 degrees of freedom is < 29.9.
  std::printf("[sampler %s] support %ld, chi2 %.2f (df %ld)\n", c.name, support, chi2, support - 1);
  EXPECT_LT(chi2, 29.9);
}

INSTANTIATE_TEST_SUITE_P(
    Rules, SamplerDistribution,
    ::testing::Values(Case{"plain", 1.0, -1, 1.0}, Case{"temperature", 0.6, -1, 1.0}, Case{"hot", 2.5, 0, 1.0},
                      Case{"top_k", 1.0, 3, 1.0}, Case{"top_p", 1.0, -1, 0.85}, Case{"top_k_top_p", 0.8, 5, 0.75},
                      Case{"tiny_top_p", 1.0, -1, 0.05}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(Sampler, TopKKeepsTiesAtTheThreshold) {
  at::Tensor logits = at::tensor({1.0f, 3.0f, 1.0f, 0.0f, 1.0f}).unsqueeze(0);
  at::Tensor kept = apply_top_k_top_p(logits, /*top_k=*/2, /*top_p=*/1.0);
  EXPECT_TRUE(at::isfinite(kept).equal(at::tensor({1, 1, 1, 0, 1}).to(at::kBool).unsqueeze(0)));
}

TEST(Sampler, ExtremeUniformsNeverPickZeroProbabilityTokens) {
  const float inf = std::numeric_limits<float>::infinity();
  at::Tensor row = at::tensor({-inf, 1.0f, -inf, 2.0f, -inf, -inf});
  std::vector<double> u = {0.0, 1e-300, 0.5, 1.0 - 0x1.0p-53, 0.9999999};
  at::Tensor logits = row.unsqueeze(0).expand({static_cast<int64_t>(u.size()), -1}).contiguous();
  at::Tensor tokens = sample_tokens(logits, {false, 1.0, -1, 1.0}, u, false).tokens;
  EXPECT_EQ(tokens[0].item<int64_t>(), 1);
  EXPECT_EQ(tokens[3].item<int64_t>(), 3);
  for (int64_t i = 0; i < tokens.size(0); ++i) {
    const int64_t t = tokens[i].item<int64_t>();
    EXPECT_TRUE(t == 1 || t == 3) << "u=" << u[static_cast<size_t>(i)] << " drew " << t;
  }
}

// The fused flag only selects the CUDA kernel: on the CPU the draws and log-probs are the torch
// path's, bit for bit.
TEST(Sampler, FusedFlagChangesNothingOnTheCpu) {
  at::Generator gen = at::detail::createCPUGenerator(3);
  at::Tensor logits = at::randn({16, 50}, gen) * 2;
  std::vector<double> u(16);
  RowRng rng(9);
  for (double& x : u) x = rng.next_uniform();
  SamplingParams plain{false, 0.8, -1, 1.0}, fused = plain;
  fused.fused = true;
  EXPECT_FALSE(fused_sampling_applies(logits, fused));
  SampledTokens a = sample_tokens(logits, plain, u, true), b = sample_tokens(logits, fused, u, true);
  EXPECT_TRUE(a.tokens.equal(b.tokens));
  EXPECT_TRUE(a.logprobs.equal(b.logprobs));
}

// Logits in the model's dtype (the engine hands them over uncast) sample as their fp32 values:
// the same tokens and log-probs, bit for bit, greedy and sampled.
TEST(Sampler, Bf16LogitsSampleAsTheirFp32Values) {
  at::Generator gen = at::detail::createCPUGenerator(4);
  const at::Tensor logits = (at::randn({16, 50}, gen) * 2).to(at::kBFloat16);
  std::vector<double> u(16);
  RowRng rng(10);
  for (double& x : u) x = rng.next_uniform();
  for (const SamplingParams& params : {SamplingParams{true, 0.0, -1, 1.0}, SamplingParams{false, 0.8, -1, 1.0},
                                       SamplingParams{false, 1.0, 5, 0.9}}) {
    SampledTokens a = sample_tokens(logits, params, u, true), b = sample_tokens(logits.to(at::kFloat), params, u, true);
    EXPECT_TRUE(a.tokens.equal(b.tokens));
    EXPECT_TRUE(a.logprobs.equal(b.logprobs));
    EXPECT_EQ(a.logprobs.scalar_type(), at::kFloat);
  }
}

// Note [Fused sampling]: the CUDA kernel passes its self-check; over many draws its frequencies
// match the softmax (chi-square, as above); at Qwen's vocabulary every token it draws sits where
// its uniform falls in the float64 CDF (up to fp32 summation) with the log-prob of log_softmax;
// extreme uniforms never draw a zero-probability token.
TEST(Sampler, OnCudaFusedKernelDrawsFromTheSoftmax) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU here";
  const c10::Device cuda("cuda:0");
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    Status st = check_fused_sampling_cuda(cuda, dtype);
    ASSERT_TRUE(st.ok()) << st.to_string();
  }
  for (double temperature : {1.0, 0.6}) {
    const int64_t n = 40000;
    std::vector<double> p = expected_distribution(temperature, -1, 1.0);
    at::Tensor logits = at::tensor(kLogits, at::kDouble).to(at::kFloat).unsqueeze(0).expand({n, -1}).contiguous().to(cuda);
    RowRng rng(77);
    std::vector<double> u(static_cast<size_t>(n));
    for (double& x : u) x = rng.next_uniform();
    SamplingParams params{false, temperature, -1, 1.0};
    params.fused = true;
    ASSERT_TRUE(fused_sampling_applies(logits, params));
    at::Tensor tokens = sample_tokens(logits, params, u, false).tokens.cpu();
    std::vector<int64_t> counts(kLogits.size(), 0);
    for (int64_t i = 0; i < n; ++i) counts[static_cast<size_t>(tokens[i].item<int64_t>())] += 1;
    double chi2 = 0;
    for (size_t v = 0; v < p.size(); ++v) {
      const double e = p[v] * static_cast<double>(n);
      chi2 += (static_cast<double>(counts[v]) - e) * (static_cast<double>(counts[v]) - e) / e;
    }
    std::printf("[fused sampler T=%.1f] chi2 %.2f (df 7)\n", temperature, chi2);
    EXPECT_LT(chi2, 29.9);
  }
  for (auto dtype : {at::kFloat, at::kBFloat16}) {  // bf16: the kernel widens the logits as it reads them
    at::Generator gen = at::detail::createCPUGenerator(11);
    const int64_t rows = 64, vocab = 151936;
    const at::Tensor logits = (at::randn({rows, vocab}, gen) * 4).to(dtype).to(at::kFloat);
    std::vector<double> u(static_cast<size_t>(rows));
    RowRng rng(5);
    for (double& x : u) x = rng.next_uniform();
    SamplingParams params{false, 0.9, -1, 1.0};
    params.fused = true;
    ASSERT_TRUE(fused_sampling_applies(logits.to(dtype).to(cuda), params));
    SampledTokens got = sample_tokens(logits.to(dtype).to(cuda), params, u, true);
    ASSERT_EQ(got.logprobs.scalar_type(), at::kFloat);
    const at::Tensor tokens = got.tokens.cpu(), lp = got.logprobs.cpu();
    const at::Tensor prob = at::softmax(logits.to(at::kDouble) / 0.9, 1), cdf = prob.cumsum(1);
    const at::Tensor want_lp = at::log_softmax(logits / 0.9, 1);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t t = tokens[r].item<int64_t>();
      ASSERT_TRUE(t >= 0 && t < vocab) << "row " << r;
      const double lo = t > 0 ? cdf[r][t - 1].item<double>() : 0.0, hi = cdf[r][t].item<double>();
      const double ur = u[static_cast<size_t>(r)];
      EXPECT_TRUE(lo <= ur + 1e-5 && hi >= ur - 1e-5) << "row " << r << " u " << ur << " CDF [" << lo << ", " << hi << "]";
      EXPECT_NEAR(lp[r].item<double>(), want_lp[r][t].item<double>(), 1e-4) << "row " << r;
    }
  }
  {
    const float inf = std::numeric_limits<float>::infinity();
    at::Tensor row = at::tensor({-inf, 1.0f, -inf, 2.0f, -inf, -inf});
    std::vector<double> u = {0.0, 1e-300, 0.5, 1.0 - 0x1.0p-53, 0.9999999};
    at::Tensor logits = row.unsqueeze(0).expand({static_cast<int64_t>(u.size()), -1}).contiguous().to(cuda);
    SamplingParams params{false, 1.0, -1, 1.0};
    params.fused = true;
    at::Tensor tokens = sample_tokens(logits, params, u, false).tokens.cpu();
    EXPECT_EQ(tokens[0].item<int64_t>(), 1);
    EXPECT_EQ(tokens[3].item<int64_t>(), 3);
    for (int64_t i = 0; i < tokens.size(0); ++i) {
      const int64_t t = tokens[i].item<int64_t>();
      EXPECT_TRUE(t == 1 || t == 3) << "u=" << u[static_cast<size_t>(i)] << " drew " << t;
    }
  }
}

// Note [Unsampleable rows]: a row with a NaN or +inf logit, or only -inf ones, draws -1 with a NaN
// log-prob under every rule; the rows beside it draw as they would alone.
at::Tensor rows_with_unsampleable_ones(const c10::Device& device, at::ScalarType dtype) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  at::Tensor logits = at::tensor(kLogits, at::kDouble).to(at::kFloat).unsqueeze(0).repeat({5, 1});
  logits.index_put_({1, 3}, nan);
  logits.index_put_({2, 6}, inf);
  logits.index_put_({3}, -inf);
  return logits.to(dtype).to(device);
}

void expect_unsampleable_rows_marked(const at::Tensor& logits, const SamplingParams& params) {
  const std::vector<double> u = {0.3, 0.3, 0.3, 0.3, 0.3};
  SampledTokens got = sample_tokens(logits, params, u, /*want_logprobs=*/true);
  const at::Tensor tokens = got.tokens.cpu(), lp = got.logprobs.cpu();
  const std::string rule = params.greedy ? "greedy" : "T=" + std::to_string(params.temperature) +
                                                          " top_k=" + std::to_string(params.top_k) +
                                                          " top_p=" + std::to_string(params.top_p);
  for (int64_t r : {1, 2, 3}) {
    EXPECT_EQ(tokens[r].item<int64_t>(), -1) << rule << ", row " << r;
    EXPECT_TRUE(std::isnan(lp[r].item<float>())) << rule << ", row " << r;
  }
  SampledTokens alone = sample_tokens(logits.narrow(0, 0, 1), params, {0.3}, true);
  for (int64_t r : {0, 4}) {
    EXPECT_EQ(tokens[r].item<int64_t>(), alone.tokens[0].item<int64_t>()) << rule << ", row " << r;
    EXPECT_FLOAT_EQ(lp[r].item<float>(), alone.logprobs[0].item<float>()) << rule << ", row " << r;
  }
}

TEST(Sampler, UnsampleableRowsDrawMinusOne) {
  const c10::Device cpu(c10::DeviceType::CPU);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor logits = rows_with_unsampleable_ones(cpu, dtype);
    expect_unsampleable_rows_marked(logits, {true, 0.0, -1, 1.0});
    expect_unsampleable_rows_marked(logits, {false, 1.0, -1, 1.0});
    expect_unsampleable_rows_marked(logits, {false, 0.7, 3, 0.9});
  }
}

TEST(Sampler, OnCudaUnsampleableRowsDrawMinusOne) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU here";
  const c10::Device cuda("cuda:0");
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    const at::Tensor logits = rows_with_unsampleable_ones(cuda, dtype);
    SamplingParams fused{false, 0.8, -1, 1.0};
    fused.fused = true;
    ASSERT_TRUE(fused_sampling_applies(logits, fused));
    expect_unsampleable_rows_marked(logits, fused);
    expect_unsampleable_rows_marked(logits, {false, 0.8, -1, 1.0});  // the torch ops on the device
    expect_unsampleable_rows_marked(logits, {true, 0.0, -1, 1.0});
  }
  // At Qwen's vocabulary: a NaN whose thread sees only -inf logits (columns 64 + 1024 k of a row
  // that is -inf but for column 0, another warp's), which the kernel's partial sums must carry to
  // the total, and a NaN among finite logits, each in its own row.
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  at::Tensor wide = at::randn({3, 151936}, at::detail::createCPUGenerator(4));
  wide.index_put_({0}, -inf);
  wide.index_put_({0, 0}, 1.0f);
  wide.index_put_({0, 64 + 1024 * 5}, nan);
  wide.index_put_({1, 123456}, nan);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    SamplingParams fused{false, 1.0, -1, 1.0};
    fused.fused = true;
    SampledTokens got = sample_tokens(wide.to(dtype).to(cuda), fused, {0.5, 0.5, 0.5}, true);
    const at::Tensor tokens = got.tokens.cpu();
    EXPECT_EQ(tokens[0].item<int64_t>(), -1);
    EXPECT_EQ(tokens[1].item<int64_t>(), -1);
    EXPECT_GE(tokens[2].item<int64_t>(), 0);
  }
}

TEST(Sampler, GreedyIsArgmaxAndLogProbsAreLogSoftmax) {
  at::Tensor logits = at::randn({5, 11}, at::detail::createCPUGenerator(3));
  SamplingParams greedy{true, 0.0, -1, 1.0};
  SampledTokens s = sample_tokens(logits, greedy, {}, /*want_logprobs=*/true);
  EXPECT_TRUE(s.tokens.equal(logits.argmax(1)));
  EXPECT_TRUE(s.logprobs.allclose(std::get<0>(at::log_softmax(logits, 1).max(1))));
  std::vector<double> u = {0.1, 0.5, 0.9, 0.0, 0.999999};
  SampledTokens t = sample_tokens(logits, {false, 0.5, -1, 1.0}, u, true);
  EXPECT_TRUE(t.logprobs.allclose(at::log_softmax(logits / 0.5, 1).gather(1, t.tokens.unsqueeze(1)).squeeze(1)));
}

TEST(Sampler, ResolveFollowsVerl) {
  RolloutConfig cfg;
  cfg.temperature = 0.9;
  cfg.top_k = 7;
  cfg.top_p = 0.8;
  SamplingParams train = resolve_sampling(cfg, /*do_sample=*/true, /*validate=*/false);
  EXPECT_FALSE(train.greedy);
  EXPECT_EQ(train.top_k, 7);
  EXPECT_DOUBLE_EQ(train.top_p, 0.8);
  EXPECT_TRUE(resolve_sampling(cfg, /*do_sample=*/false, /*validate=*/false).greedy);
  EXPECT_TRUE(resolve_sampling(cfg, true, /*validate=*/true).greedy);  // val_kwargs.temperature = 0
  cfg.val_kwargs.temperature = 0.5;
  cfg.val_kwargs.top_p = 0.3;
  SamplingParams val = resolve_sampling(cfg, true, true);
  EXPECT_FALSE(val.greedy);
  EXPECT_DOUBLE_EQ(val.top_p, 0.3);
  EXPECT_EQ(val.top_k, -1);
  cfg.temperature = 0.0;
  EXPECT_TRUE(resolve_sampling(cfg, true, false).greedy);
}

TEST(Sampler, RowStreamsAreSeededAndDistinct) {
  RowRng a(row_seed(7, 0)), b(row_seed(7, 0)), c(row_seed(7, 1)), d(row_seed(8, 0));
  int same_c = 0, same_d = 0;
  for (int i = 0; i < 100; ++i) {
    double x = a.next_uniform();
    EXPECT_EQ(x, b.next_uniform());
    EXPECT_GE(x, 0.0);
    EXPECT_LT(x, 1.0);
    same_c += x == c.next_uniform();
    same_d += x == d.next_uniform();
  }
  EXPECT_EQ(same_c, 0);
  EXPECT_EQ(same_d, 0);
}

}  // namespace
}  // namespace tessera::rollout
