// KV-cache decoding gives the full forward's logits, step by step, for left-padded batches of
// mixed lengths (Llama, Qwen2, Qwen3, Mistral and Gemma2 with a sliding window of 3, and the position-independent RoPE scalings linear and
// llama3; dynamic RoPE depends on each call's positions, so its decode is checked against HF in
// model_hf_parity_test); slot reuse (reset_row) behaves like a fresh cache for that row.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tests/workers/models/model_test_util.hpp"
#include "workers/models/kv_cache.hpp"
#include "workers/models/model.hpp"

namespace tessera::models {
namespace {

constexpr double kTolerance = 1e-5;

std::shared_ptr<CausalLM> make_model(const std::string& type, int64_t kv_heads, uint64_t seed,
                                     const std::string& rope = "default") {
  ModelConfig c = testing::tiny_config(type, kv_heads);
  c.rope_scaling.rope_type = rope;
  if (rope != "default") c.rope_scaling.factor = 4.0;
  if (rope == "llama3") c.rope_scaling.original_max_position_embeddings = 16;
  if (type == "qwen3") c.head_dim = 16;
  auto model = CausalLM::create(c, ModelInit{at::kFloat, seed});
  EXPECT_TRUE(model.ok()) << model.status().to_string();
  testing::randomise(**model, seed);
  return *model;
}

KVCache make_cache(const CausalLM& model, int64_t batch, int64_t capacity) {
  auto cache = KVCache::create(model.config(), {batch, capacity, at::kFloat, at::kCPU});
  EXPECT_TRUE(cache.ok()) << cache.status().to_string();
  return std::move(*cache);
}

// Feeds columns [0, prefill) at once, then one column per step; returns logits [B, T, V].
at::Tensor decode_stepwise(CausalLM& model, const testing::Batch& b, int64_t prefill) {
  const int64_t B = b.input_ids.size(0), T = b.input_ids.size(1);
  KVCache cache = make_cache(model, B, T + 3);
  std::vector<at::Tensor> pieces;
  for (int64_t start = 0; start < T;) {
    int64_t n = start == 0 ? prefill : 1;
    pieces.push_back(model.forward_step(b.input_ids.narrow(1, start, n), b.position_ids.narrow(1, start, n), cache,
                                        b.attention_mask));  // wider than needed: only the first columns count
    start += n;
    EXPECT_EQ(cache.length(), start);
  }
  return at::cat(pieces, 1);
}

struct Case {
  std::string type;
  int64_t kv_heads;
  std::string rope = "default";
};

class KVCacheEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(KVCacheEquivalence, StepwiseEqualsFullForward) {
  auto model = make_model(GetParam().type, GetParam().kv_heads, 7, GetParam().rope);
  // Mixed prompt lengths, left-padded to a common width, then 6 "generated" columns for all rows.
  testing::Batch b = testing::left_padded_batch({9, 4, 1, 7}, /*T=*/9, 64, 11);
  testing::Batch gen = testing::left_padded_batch({6, 6, 6, 6}, 6, 64, 12);
  testing::Batch full{at::cat({b.input_ids, gen.input_ids}, 1), at::cat({b.attention_mask, gen.attention_mask}, 1),
                      at::Tensor()};
  full.position_ids = (full.attention_mask.cumsum(1) - 1).clamp_min(0);
  torch::NoGradGuard no_grad;
  at::Tensor expected = model->forward(full.input_ids, full.attention_mask, full.position_ids);
  for (int64_t prefill : {1, 9}) {
    at::Tensor got = decode_stepwise(*model, full, prefill);
    double diff = testing::masked_max_diff(got, expected, full.attention_mask);
    std::printf("[kv-cache %s kv=%ld rope=%s prefill=%ld] max |step - full| = %.3g\n", GetParam().type.c_str(),
                GetParam().kv_heads, GetParam().rope.c_str(), prefill, diff);
    EXPECT_LT(diff, kTolerance);
    EXPECT_FALSE(got.isnan().any().item<bool>());
  }
}

INSTANTIATE_TEST_SUITE_P(Families, KVCacheEquivalence,
                         ::testing::Values(Case{"qwen2", 2}, Case{"llama", 4}, Case{"llama", 1}, Case{"qwen3", 2},
                                           Case{"llama", 2, "linear"}, Case{"llama", 2, "llama3"},
                                           Case{"mistral", 2}, Case{"gemma2", 2}, Case{"gemma2", 1},
                                           Case{"gemma3_text", 2}),
                         [](const auto& info) {
                           const Case& c = info.param;
                           return c.type + "_kv" + std::to_string(c.kv_heads) + (c.rope == "default" ? "" : "_" + c.rope);
                         });

TEST(KVCache, SlotReuseMatchesAFreshSequence) {
  auto model = make_model("qwen2", 2, 3);
  torch::NoGradGuard no_grad;
  testing::Batch first = testing::left_padded_batch({5, 3}, 5, 64, 21);
  KVCache cache = make_cache(*model, 2, 32);
  at::Tensor mask = at::zeros({2, 32}, at::kLong);
  mask.narrow(1, 0, 5).copy_(first.attention_mask);
  model->forward_step(first.input_ids, first.position_ids, cache, mask);
  // Row 0 finishes; a new 4-token sequence takes its slot while row 1 decodes 4 more tokens.
  ASSERT_TRUE(cache.reset_row(0).ok());
  mask[0].zero_();
  testing::Batch fresh = testing::left_padded_batch({4}, 4, 64, 22);
  testing::Batch cont = testing::left_padded_batch({4}, 4, 64, 23);
  at::Tensor ids = at::cat({fresh.input_ids, cont.input_ids}, 0);
  at::Tensor pos = at::stack({at::arange(0, 4, at::kLong), at::arange(3, 7, at::kLong)});
  mask.narrow(1, 5, 4).fill_(1);
  at::Tensor got = model->forward_step(ids, pos, cache, mask);
  at::Tensor alone = model->forward(fresh.input_ids, fresh.attention_mask, fresh.position_ids);
  double diff = (got[0] - alone[0]).abs().max().item<double>();
  std::printf("[kv-cache slot reuse] max |reused row - fresh| = %.3g\n", diff);
  EXPECT_LT(diff, kTolerance);
  // Row 1 is unaffected: equal to its own full forward over 5 prompt + 4 new columns.
  at::Tensor row_ids = at::cat({first.input_ids[1], cont.input_ids[0]}).unsqueeze(0);
  at::Tensor row_mask = at::cat({first.attention_mask[1], at::ones({4}, at::kLong)}).unsqueeze(0);
  at::Tensor row_pos = (row_mask.cumsum(1) - 1).clamp_min(0);
  at::Tensor row_full = model->forward(row_ids, row_mask, row_pos);
  EXPECT_LT((got[1] - row_full[0].narrow(0, 5, 4)).abs().max().item<double>(), kTolerance);
}

TEST(KVCache, RejectsBadSizesAndRows) {
  ModelConfig c = testing::tiny_config("llama");
  EXPECT_FALSE(KVCache::create(c, {0, 8}).ok());
  EXPECT_FALSE(KVCache::create(c, {2, 0}).ok());
  auto cache = KVCache::create(c, {2, 8});
  ASSERT_TRUE(cache.ok());
  EXPECT_EQ(cache->key(1).sizes(), (std::vector<int64_t>{2, 4, 8, 8}));
  Status st = cache->reset_row(2);
  EXPECT_EQ(st.code(), ErrorCode::out_of_range);
  EXPECT_NE(st.message().find("row 2"), std::string::npos);
}

TEST(KVCache, OverflowIsRefused) {
  auto model = make_model("llama", 4, 5);
  KVCache cache = make_cache(*model, 1, 4);
  at::Tensor ids = at::ones({1, 5}, at::kLong);
  EXPECT_THROW(model->forward_step(ids, ids, cache, at::ones({1, 5}, at::kLong)), c10::Error);
  EXPECT_EQ(cache.length(), 0);
}

}  // namespace
}  // namespace tessera::models
