// token_log_probs against the unchunked functions (logprobs_from_logits, entropy_from_logits) and
// their autograd gradients: values and gradients per row, over chunk sizes that do and do not
// divide the rows, each output alone and both together, fp64 / fp32 / bf16 logits.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "workers/algos/torch_functional.hpp"

namespace tessera::algos {
namespace {

struct Grads {
  torch::Tensor log_probs, entropy, grad;
};

// The reference: the whole block at once, through autograd. Weights g_lp / g_ent define the loss
// sum(lp * g_lp) + sum(ent * g_ent); an undefined weight leaves that output out.
Grads reference(const torch::Tensor& logits, const torch::Tensor& labels, double t, const torch::Tensor& g_lp,
                const torch::Tensor& g_ent) {
  torch::Tensor x = logits.detach().clone().requires_grad_(true);
  torch::Tensor scaled = x.to(logits.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat) / t;
  Grads r;
  r.log_probs = *logprobs_from_logits(scaled, labels);
  r.entropy = *entropy_from_logits(scaled);
  torch::Tensor loss = torch::zeros({}, scaled.options());
  if (g_lp.defined()) loss = loss + (r.log_probs * g_lp).sum();
  if (g_ent.defined()) loss = loss + (r.entropy * g_ent).sum();
  loss.backward();
  r.grad = x.grad();
  return r;
}

Grads chunked(const torch::Tensor& logits, const torch::Tensor& labels, double t, const torch::Tensor& g_lp,
              const torch::Tensor& g_ent, int64_t chunk) {
  torch::Tensor x = logits.detach().clone().requires_grad_(true);
  auto out = token_log_probs(x, labels, t, /*with_entropy=*/g_ent.defined(), chunk);
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  Grads r;
  r.log_probs = out->log_probs;
  r.entropy = out->entropy;
  torch::Tensor loss = torch::zeros({}, out->log_probs.options());
  if (g_lp.defined()) loss = loss + (out->log_probs * g_lp).sum();
  if (g_ent.defined()) loss = loss + (out->entropy * g_ent).sum();
  loss.backward();
  r.grad = x.grad();
  return r;
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

TEST(TokenLogProbs, MatchesTheUnchunkedFunctionsAndTheirGradients) {
  torch::manual_seed(11);
  const int64_t B = 3, R = 7, V = 50;
  for (auto dtype : {torch::kDouble, torch::kFloat}) {
    // A few units in the last place of the largest value compared: the chunked and whole-block
    // paths sum in different orders, and how the fp32 sums are vectorised differs between CPUs.
    const double eps = dtype == torch::kDouble ? 1e-12 : 2e-6;
    auto scale = [](const torch::Tensor& want) { return std::max(1.0, want.abs().max().item<double>()); };
    torch::Tensor logits = torch::randn({B, R, V}, dtype) * 3;
    torch::Tensor labels = torch::randint(0, V, {B, R}, torch::kLong);
    const auto f = torch::TensorOptions().dtype(dtype == torch::kDouble ? torch::kDouble : torch::kFloat);
    torch::Tensor g_lp = torch::randn({B, R}, f), g_ent = torch::randn({B, R}, f);
    for (double t : {1.0, 0.7}) {
      for (int64_t chunk : {int64_t{0}, int64_t{1}, int64_t{4}, int64_t{21}, int64_t{100}}) {
        for (int which = 0; which < 3; ++which) {  // log-probs only, entropy only, both
          torch::Tensor gl = which == 1 ? torch::Tensor() : g_lp;
          torch::Tensor ge = which == 0 ? torch::Tensor() : g_ent;
          // Entropy alone still computes the log-probs (no gradient flows through them).
          Grads want = reference(logits, labels, t, gl, ge);
          Grads got = chunked(logits, labels, t, gl, ge.defined() ? ge : torch::Tensor(), chunk);
          SCOPED_TRACE(testing::Message() << "dtype " << dtype << " t " << t << " chunk " << chunk << " which " << which);
          EXPECT_EQ(got.log_probs.sizes(), labels.sizes());
          EXPECT_EQ(got.log_probs.scalar_type(), want.log_probs.scalar_type());
          EXPECT_LE(max_diff(got.log_probs, want.log_probs), eps * scale(want.log_probs));
          if (ge.defined()) EXPECT_LE(max_diff(got.entropy, want.entropy), eps * scale(want.entropy));
          else EXPECT_FALSE(got.entropy.defined());
          ASSERT_TRUE(got.grad.defined());
          EXPECT_EQ(got.grad.scalar_type(), dtype);
          EXPECT_LE(max_diff(got.grad, want.grad), eps * scale(want.grad));
        }
      }
    }
  }
}

// bf16 logits (the compute dtype under mixed precision): the maths runs in fp32 on the upcast
// values, so the results equal the fp32 functions applied to logits.float(); the gradient comes
// back in bf16 (the fp32 gradient, rounded).
TEST(TokenLogProbs, Bf16LogitsAreReducedInFp32) {
  torch::manual_seed(5);
  torch::Tensor logits = (torch::randn({4, 9, 33}) * 2).to(torch::kBFloat16);
  torch::Tensor labels = torch::randint(0, 33, {4, 9}, torch::kLong);
  torch::Tensor g_lp = torch::randn({4, 9}), g_ent = torch::randn({4, 9});
  Grads want = reference(logits.to(torch::kFloat), labels, 0.9, g_lp, g_ent);
  Grads got = chunked(logits, labels, 0.9, g_lp, g_ent, 5);
  EXPECT_EQ(got.log_probs.scalar_type(), torch::kFloat);
  EXPECT_LE(max_diff(got.log_probs, want.log_probs), 1e-6);
  EXPECT_LE(max_diff(got.entropy, want.entropy), 1e-6);
  EXPECT_EQ(got.grad.scalar_type(), torch::kBFloat16);
  // bf16 keeps 8 bits: the two fp32 gradients agree to ~1e-7, their roundings to one bf16 ulp.
  EXPECT_LE(max_diff(got.grad, want.grad), 8e-3 * want.grad.abs().max().item<double>());
}

// The fused CUDA kernels (Note [Fused token log-probs]) against the same maths in fp64 on the CPU,
// on the same values: Qwen's 151936-row vocabulary, a vocabulary whose rows are not 16-byte
// aligned, rows with a stride (a narrowed tensor), temperature 1 and not, each output alone and
// both. The entropy's loss alone is a plain sum, so its gradient reaches backward expanded
// (stride 0); beside the log-probs it is weighted per row.
// The reference is fp64 because at this vocabulary the fp32 chunked path is itself ~5e-4 off in
// the entropy (lse - sum p x cancels two values of ~15), while the kernel's online sums stay
// within ~2e-5.
TEST(TokenLogProbs, OnCudaFusedKernelsMatchFp64) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU here";
  const torch::Device cuda("cuda:0");
  torch::manual_seed(17);
  struct Shape {
    int64_t rows, vocab, pad;
  };
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (Shape s : {Shape{37, 151936, 0}, Shape{5, 1001, 0}, Shape{6, 4099, 3}}) {
      torch::Tensor wide = (torch::randn({s.rows, s.vocab + s.pad}) * 4).to(dtype);
      torch::Tensor labels = torch::randint(0, s.vocab, {s.rows}, torch::kLong);
      torch::Tensor g_lp = torch::randn({s.rows}), g_ent = torch::randn({s.rows});
      for (double t : {1.0, 0.7}) {
        for (int which = 0; which < 3; ++which) {  // log-probs only, entropy only, both
          SCOPED_TRACE(testing::Message() << "dtype " << dtype << " rows " << s.rows << " vocab " << s.vocab << " pad "
                                          << s.pad << " t " << t << " which " << which);
          const bool with_entropy = which != 0;
          Grads r[2];
          for (int on_gpu = 0; on_gpu < 2; ++on_gpu) {
            // On the GPU, the strided rows themselves; on the CPU, a contiguous fp64 copy.
            torch::Tensor x = on_gpu ? wide.to(cuda).narrow(1, 0, s.vocab)
                                     : wide.narrow(1, 0, s.vocab).to(torch::kDouble).contiguous();
            x.requires_grad_(true);
            torch::Tensor ids = on_gpu ? labels.to(cuda) : labels;
            auto out = token_log_probs(x, ids, t, with_entropy);
            ASSERT_TRUE(out.ok()) << out.status().to_string();
            torch::Tensor loss = torch::zeros({}, out->log_probs.options());
            if (which != 1) loss = loss + (out->log_probs * g_lp.to(loss.options())).sum();
            if (which == 1) loss = loss + out->entropy.sum();
            if (which == 2) loss = loss + (out->entropy * g_ent.to(loss.options())).sum();
            loss.backward();
            r[on_gpu] = {out->log_probs.cpu(), with_entropy ? out->entropy.cpu() : torch::Tensor(), x.grad().cpu()};
          }
          EXPECT_LE(max_diff(r[1].log_probs, r[0].log_probs), 1e-4);
          if (with_entropy) {
            EXPECT_LE(max_diff(r[1].entropy, r[0].entropy), 1e-4);
          }
          EXPECT_EQ(r[1].grad.scalar_type(), dtype);
          // fp32: the entropy's error times p; 16-bit types: one rounding of each element.
          const double rel = dtype == torch::kFloat ? 0.0 : dtype == torch::kHalf ? 1e-3 : 8e-3;
          EXPECT_LE(max_diff(r[1].grad, r[0].grad), rel * r[0].grad.abs().max().item<double>() + 1e-4);
        }
      }
    }
  }
}

// A NaN logit makes its row's log-prob and entropy NaN, as torch's log_softmax does, wherever it
// falls (a thread's first element, a row too short for vector loads); the other rows keep their
// values.
TEST(TokenLogProbs, OnCudaANanLogitMakesItsRowNan) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU here";
  const torch::Device cuda("cuda:0");
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    for (int64_t vocab : {int64_t{3}, int64_t{4099}}) {
      SCOPED_TRACE(testing::Message() << "dtype " << dtype << " vocab " << vocab);
      torch::Tensor x = torch::randn({3, vocab});
      x[1][1] = nan;
      x[2][0] = nan;
      torch::Tensor labels = torch::zeros({3}, torch::kLong);
      auto got = token_log_probs(x.to(dtype).to(cuda), labels.to(cuda), 1.0, /*with_entropy=*/true);
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      auto want = token_log_probs(x.to(dtype).to(torch::kFloat), labels, 1.0, /*with_entropy=*/true);
      ASSERT_TRUE(want.ok()) << want.status().to_string();
      const torch::Tensor lp = got->log_probs.cpu(), ent = got->entropy.cpu();
      EXPECT_NEAR(lp[0].item<double>(), want->log_probs[0].item<double>(), 1e-4);
      EXPECT_NEAR(ent[0].item<double>(), want->entropy[0].item<double>(), 1e-4);
      for (int r : {1, 2}) {
        EXPECT_TRUE(std::isnan(lp[r].item<double>())) << "row " << r;
        EXPECT_TRUE(std::isnan(ent[r].item<double>())) << "row " << r;
      }
    }
  }
}

TEST(TokenLogProbs, BadArgumentsAreErrors) {
  torch::Tensor logits = torch::randn({2, 4});
  EXPECT_FALSE(token_log_probs(logits, torch::tensor({0, 1, 2}), 1.0, false).ok());
  EXPECT_FALSE(token_log_probs(logits, torch::tensor({0.0, 1.0}), 1.0, false).ok());
  EXPECT_FALSE(token_log_probs(logits, torch::tensor({0, 1}), 0.0, false).ok());
  EXPECT_FALSE(token_log_probs(torch::tensor({1, 2}), torch::tensor(0), 1.0, false).ok());
  EXPECT_TRUE(check_labels_in_vocab("f", "responses", torch::tensor({0, 3}), 4).ok());
  Status high = check_labels_in_vocab("compute_log_prob", "responses", torch::tensor({0, 4}), 4);
  EXPECT_EQ(high.code(), ErrorCode::out_of_range);
  EXPECT_NE(high.message().find("'responses' holds token id 4 outside the vocabulary [0, 4)"), std::string::npos)
      << high.message();
  EXPECT_EQ(check_labels_in_vocab("f", "responses", torch::tensor({-1, 0}), 4).code(), ErrorCode::out_of_range);
}

}  // namespace
}  // namespace tessera::algos
