// Note [Packed sequences]: a padding-free forward (every row's real tokens end to end in one row)
// equals the padded batch's forward on the real tokens, for plain causal attention (qwen2), a
// sliding window (mistral) and softcapped, alternating-window attention (gemma2), in values and in
// the gradients of the parameters, for the LM head and the value head.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "tests/workers/models/model_test_util.hpp"
#include "workers/models/model.hpp"

namespace tessera::models {
namespace {

struct Packed {
  at::Tensor ids, pos, rows;  // rows: every packed token
  at::Tensor valid;           // [B, T] bool
  std::shared_ptr<PackedSegments> segments;
};

Packed pack(const testing::Batch& b) {
  Packed p;
  p.valid = b.attention_mask.ne(0);
  p.segments = std::make_shared<PackedSegments>();
  p.segments->starts.push_back(0);
  for (int64_t r = 0; r < b.input_ids.size(0); ++r) {
    p.segments->starts.push_back(p.segments->starts.back() + p.valid[r].sum().item<int64_t>());
  }
  p.ids = b.input_ids.masked_select(p.valid).unsqueeze(0);
  p.pos = b.position_ids.masked_select(p.valid).unsqueeze(0);
  p.rows = at::arange(p.ids.size(1), at::TensorOptions(at::kLong).device(b.input_ids.device()));
  return p;
}

double max_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

// `tol` bounds |packed - padded| relative to the largest padded value (absolute below 1).
template <class Model>
void expect_packed_equals_padded(Model& model, const testing::Batch& b, double tol = 2e-5) {
  Packed p = pack(b);
  model.zero_grad();
  at::Tensor padded = model.forward_head(b.input_ids, b.attention_mask, b.position_ids, HeadRows::all());
  at::Tensor want = padded.dim() == 3 ? padded.index({p.valid}) : padded.masked_select(p.valid);
  at::Tensor weights = at::randn(want.sizes()).to(want.options());
  (want * weights).sum().backward();
  std::vector<at::Tensor> want_grads;
  for (const auto& param : model.parameters()) want_grads.push_back(param.grad().clone());
  model.zero_grad();
  at::Tensor got = model.forward_packed_head(p.ids, p.pos, p.segments, p.rows);
  ASSERT_EQ(got.sizes(), want.sizes());
  auto scale = [](const at::Tensor& t) { return std::max(1.0, t.abs().max().item<double>()); };
  EXPECT_LT(max_diff(got, want), tol * scale(want));
  (got * weights).sum().backward();
  size_t i = 0;
  for (const auto& param : model.parameters()) {
    EXPECT_LT(max_diff(param.grad(), want_grads[i]), tol * scale(want_grads[i])) << "parameter " << i;
    ++i;
  }
}

TEST(ModelPacked, PackedForwardEqualsPaddedOnTheRealTokens) {
  for (const char* type : {"qwen2", "mistral", "gemma2", "gemma3_text", "qwen3_moe", "qwen2_moe"}) {
    SCOPED_TRACE(type);
    auto lm = CausalLM::create(testing::tiny_config(type, 2), ModelInit{at::kFloat, 7});
    ASSERT_TRUE(lm.ok()) << lm.status().to_string();
    testing::Batch b = testing::left_padded_batch({8, 5, 1, 7}, 8, 64, 11);
    expect_packed_equals_padded(**lm, b);
    auto critic = ValueModel::create(testing::tiny_config(type, 2), ModelInit{at::kFloat, 8});
    if (std::string(type) == "gemma3_text") {  // transformers has no Gemma3ForTokenClassification
      ASSERT_FALSE(critic.ok());
      EXPECT_NE(critic.status().message().find("no value model"), std::string::npos) << critic.status().message();
      continue;
    }
    ASSERT_TRUE(critic.ok()) << critic.status().to_string();
    expect_packed_equals_padded(**critic, b);
  }
}

// On a GPU in bf16 the packed forward is one varlen flash-attention call (no softcap: qwen2's
// causal attention, mistral's window); it matches the padded SDPA forward to bf16 precision.
// Skipped without a GPU (bench/gpu_check.sh runs it where there is one).
TEST(ModelPacked, OnCudaVarlenFlashEqualsPaddedInBf16) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU here";
  const at::Device cuda("cuda:0");
  for (const char* type : {"qwen2", "mistral"}) {
    SCOPED_TRACE(type);
    auto lm = CausalLM::create(testing::tiny_config(type, 2), ModelInit{at::kBFloat16, 7});  // head_dim 8
    ASSERT_TRUE(lm.ok()) << lm.status().to_string();
    (*lm)->to(cuda);
    testing::Batch b = testing::left_padded_batch({8, 5, 1, 7}, 8, 64, 11);
    b.input_ids = b.input_ids.to(cuda);
    b.attention_mask = b.attention_mask.to(cuda);
    b.position_ids = b.position_ids.to(cuda);
    expect_packed_equals_padded(**lm, b, /*tol=*/3e-2);
  }
}

TEST(ModelPacked, OffsetsThatDoNotCoverTheRowAreRefused) {
  auto lm = CausalLM::create(testing::tiny_config("qwen2", 2), ModelInit{at::kFloat, 7});
  ASSERT_TRUE(lm.ok());
  auto segments = std::make_shared<PackedSegments>();
  segments->starts = {0, 3};
  at::Tensor ids = at::ones({1, 5}, at::kLong);
  EXPECT_THROW((*lm)->forward_packed_head(ids, ids, segments, at::arange(5)), c10::Error);
}

}  // namespace
}  // namespace tessera::models
