// model.use_liger's fused layer ops (Note [Fused layers]): on a GPU, RMSNorm (PyTorch's fused
// kernel), rotary and SwiGLU (Tessera's kernels) equal HF's op sequences run on the GPU, alone
// and through a whole Qwen2 / Qwen3 model, in values and gradients; on the CPU the switch
// changes nothing. The GPU tests are skipped without one (bench/gpu_check.sh runs them).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/workers/models/model_test_util.hpp"
#include "workers/models/decoder.hpp"
#include "workers/models/fused_layers.hpp"

namespace tessera::models {
namespace {

// HF's Qwen2RMSNorm, op for op.
at::Tensor hf_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  at::Tensor h = x.to(at::kFloat);
  h = h * at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * h.to(x.scalar_type());
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

double rel_diff(const at::Tensor& got, const at::Tensor& want) {
  return max_diff(got, want) / std::max(want.abs().max().item<double>(), 1e-30);
}

TEST(FusedLayers, OnCudaRmsNormEqualsHfOps) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU here";
  const at::Device cuda("cuda:0");
  at::manual_seed(3);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    RMSNorm norm(896, 1e-6, at::TensorOptions(dtype).device(cuda));
    norm.fused = true;
    norm.weight.data().copy_(at::rand({896}) + 0.5);
    const at::Tensor x0 = (at::randn({2, 37, 896}) * 3).to(dtype).to(cuda);
    const at::Tensor g = at::randn({2, 37, 896}).to(dtype).to(cuda);
    at::Tensor x = x0.clone().requires_grad_(true);
    at::Tensor got = norm.forward(x);
    (got * g).sum().backward();
    at::Tensor w = norm.weight.detach().clone().requires_grad_(true);
    at::Tensor xr = x0.clone().requires_grad_(true);
    at::Tensor want = hf_rms_norm(xr, w, 1e-6);
    (want * g).sum().backward();
    const double tol = dtype == at::kFloat ? 1e-5 : 2e-2;  // bf16: neighbouring roundings of x * rstd
    EXPECT_LE(rel_diff(got, want), tol);
    EXPECT_LE(rel_diff(x.grad(), xr.grad()), tol);
    EXPECT_LE(rel_diff(norm.weight.grad(), w.grad()), tol);
  }
}

TEST(FusedLayers, ResidualAddRmsNormOffTheGpuIsTheOpChain) {
  RMSNorm norm(24, 1e-6, at::TensorOptions(at::kFloat));
  norm.fused = true;
  at::manual_seed(5);
  norm.weight.data().copy_(at::rand({24}) + 0.5);
  const at::Tensor residual = at::randn({2, 3, 24}), x = at::randn({2, 3, 24});
  const at::NoGradGuard no_grad;
  const auto [sum, out] = norm.add_forward(residual, x);
  EXPECT_TRUE(at::equal(sum, residual + x));
  EXPECT_TRUE(at::equal(out, hf_rms_norm(residual + x, norm.weight, 1e-6)));
}

// The check passes, also when its first call comes from a no-grad forward (a rollout step, a
// log-prob pass): fp16 is first checked here, under NoGradGuard (the other tests check fp32 and
// bf16 with autograd on, and the verdicts are kept per process).
TEST(FusedLayers, OnCudaKernelsPassTheirCheck) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU here";
  {
    const at::NoGradGuard no_grad;
    Status st = check_fused_layers(at::Device("cuda:0"), at::kHalf);
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    Status st = check_fused_layers(at::Device("cuda:0"), dtype);
    EXPECT_TRUE(st.ok()) << st.to_string();
    st = check_fused_residual_norm(at::Device("cuda:0"), dtype);
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
}

// Note [Fused residual norm]: the rollout's residual add + RMSNorm kernel against HF's ops (the
// add in the dtype, then Qwen2RMSNorm), with and without the add, on decode-shaped [512, 1, H]
// and prefill-shaped [3, 37, H] activations: the sum bit for bit, the norm within the rounding of
// x * rstd; RMSNorm::add_forward takes it under no-grad.
TEST(FusedLayers, OnCudaResidualAddRmsNormEqualsHfOps) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU here";
  const at::Device cuda("cuda:0");
  const at::NoGradGuard no_grad;
  at::manual_seed(4);
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (const std::vector<int64_t>& shape : {std::vector<int64_t>{512, 1, 896}, std::vector<int64_t>{3, 37, 1000}}) {
      SCOPED_TRACE(::testing::Message() << c10::toString(dtype) << " " << shape.back());
      const int64_t H = shape.back();
      RMSNorm norm(H, 1e-6, at::TensorOptions(dtype).device(cuda));
      norm.fused = true;
      norm.weight.copy_(at::rand({H}) + 0.5);
      const at::Tensor residual = (at::randn(shape) * 3).to(dtype).to(cuda), x = at::randn(shape).to(dtype).to(cuda);
      const double tol = dtype == at::kFloat ? 1e-5 : 2e-2;
      const auto [sum, out] = norm.add_forward(residual, x);
      const at::Tensor want_sum = residual + x;
      EXPECT_TRUE(at::equal(sum, want_sum));
      EXPECT_LE(rel_diff(out, hf_rms_norm(want_sum, norm.weight, 1e-6)), tol);
      const auto [same, alone] = norm.add_forward(residual, at::Tensor());
      EXPECT_TRUE(same.is_same(residual));
      EXPECT_LE(rel_diff(alone, hf_rms_norm(residual, norm.weight, 1e-6)), tol);
      // The kernel itself (add_forward falls back to the same ops when it does not take the call).
      const auto [kernel_sum, kernel_out] = fused_add_rms_norm(residual, x, norm.weight, 1e-6);
      EXPECT_TRUE(at::equal(kernel_sum, want_sum));
      EXPECT_LE(rel_diff(kernel_out, hf_rms_norm(want_sum, norm.weight, 1e-6)), tol);
      EXPECT_TRUE(at::equal(kernel_out, out));
    }
  }
}

// Rotary on the strided [B, H, T, D] view the attention gives it, and SwiGLU, against the op
// chains, forward and backward, fp32 and bf16. The rotary forward rounds where the chain rounds,
// so its values are the chain's bit for bit.
TEST(FusedLayers, OnCudaRotaryAndSwigluEqualTheOpChains) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU here";
  const at::Device cuda("cuda:0");
  at::manual_seed(5);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    const double tol = dtype == at::kFloat ? 1e-5 : 3e-2;
    const at::Tensor x0 = at::randn({3, 11, 6, 64}).to(dtype).to(cuda).transpose(1, 2);  // [B, H, T, D]
    const at::Tensor angles = at::randn({3, 1, 11, 32}).repeat({1, 1, 1, 2});
    const at::Tensor cos = angles.cos().to(dtype).to(cuda), sin = angles.sin().to(dtype).to(cuda);
    const at::Tensor g = at::randn({3, 6, 11, 64}).to(dtype).to(cuda);
    at::Tensor a = x0.detach().clone().requires_grad_(true), b = x0.detach().clone().requires_grad_(true);
    at::Tensor got = fused_rotary(a, cos, sin);
    const int64_t half = 32;
    at::Tensor want = b * cos + at::cat({-b.narrow(-1, half, half), b.narrow(-1, 0, half)}, -1) * sin;
    (got * g).sum().backward();
    (want * g).sum().backward();
    EXPECT_TRUE(got.equal(want)) << "max diff " << max_diff(got, want);
    EXPECT_LE(rel_diff(a.grad(), b.grad()), tol);

    const at::Tensor gate0 = (at::randn({5, 7, 48}) * 3).to(dtype).to(cuda), up0 = at::randn({5, 7, 48}).to(dtype).to(cuda);
    const at::Tensor gm = at::randn({5, 7, 48}).to(dtype).to(cuda);
    at::Tensor g1 = gate0.clone().requires_grad_(true), u1 = up0.clone().requires_grad_(true);
    at::Tensor g2 = gate0.clone().requires_grad_(true), u2 = up0.clone().requires_grad_(true);
    at::Tensor m1 = fused_swiglu(g1, u1), m2 = at::silu(g2) * u2;
    (m1 * gm).sum().backward();
    (m2 * gm).sum().backward();
    EXPECT_LE(rel_diff(m1, m2), tol);
    EXPECT_LE(rel_diff(g1.grad(), g2.grad()), tol);
    EXPECT_LE(rel_diff(u1.grad(), u2.grad()), tol);
  }
}

// A whole model with the switch on: logits and parameter gradients against the same model with
// it off, on the GPU (Qwen3 has per-head q/k norms too); on the CPU, bitwise equal.
void expect_switch_keeps_the_model(const char* type, const at::Device& device, at::ScalarType dtype, double tol,
                                   double grad_tol) {
  SCOPED_TRACE(std::string(type) + " on " + device.str() + " in " + c10::toString(dtype));
  testing::Batch batch = testing::left_padded_batch({6, 3, 8}, 8, 64, 9);
  at::Tensor logits[2];
  std::vector<at::Tensor> grads[2];
  for (int fused = 0; fused < 2; ++fused) {
    auto lm = CausalLM::create(testing::tiny_config(type, 2), ModelInit{dtype, 7});
    ASSERT_TRUE(lm.ok()) << lm.status().to_string();
    testing::randomise(**lm, 4);
    (*lm)->to(device);
    set_fused_layers(**lm, fused == 1);
    logits[fused] = (*lm)->forward(batch.input_ids.to(device), batch.attention_mask.to(device),
                                   batch.position_ids.to(device));
    (logits[fused] * batch.attention_mask.to(device).unsqueeze(-1)).sum().backward();
    for (const auto& p : (*lm)->parameters()) grads[fused].push_back(p.grad().to(at::kFloat).cpu());
  }
  if (tol == 0) {
    EXPECT_TRUE(logits[0].equal(logits[1]));
  } else {  // relative to the largest logit: a bf16 ulp at |logit| ~4 is 0.016-0.03
    const double scale = std::max(1.0, logits[0].abs().max().item<double>());
    EXPECT_LE(testing::masked_max_diff(logits[1].cpu(), logits[0].cpu(), batch.attention_mask), tol * scale);
  }
  for (size_t i = 0; i < grads[0].size(); ++i) {
    if (tol == 0) {
      EXPECT_TRUE(grads[0][i].equal(grads[1][i])) << "parameter " << i;
    } else {
      EXPECT_LE(rel_diff(grads[1][i], grads[0][i]), grad_tol) << "parameter " << i;
    }
  }
}

TEST(FusedLayers, OnTheCpuTheSwitchChangesNothing) {
  for (const char* type : {"qwen2", "qwen3"}) expect_switch_keeps_the_model(type, at::kCPU, at::kFloat, 0, 0);
}

TEST(FusedLayers, OnCudaAModelWithTheSwitchMatchesTheOpChains) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU here";
  for (const char* type : {"qwen2", "qwen3"}) {
    expect_switch_keeps_the_model(type, at::Device("cuda:0"), at::kFloat, 1e-4, 1e-4);
    // The rotary and SwiGLU forwards round as the chains do (fused_layers.cu); what differs is
    // the fused RMSNorm's fp32 reduction order, a bf16 ulp here and there.
    expect_switch_keeps_the_model(type, at::Device("cuda:0"), at::kBFloat16, 3e-2, 1e-1);
  }
}

}  // namespace
}  // namespace tessera::models
