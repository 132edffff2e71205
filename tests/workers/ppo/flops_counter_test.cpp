// verl's FlopsCounter (verl/utils/flops_counter.py, _estimate_qwen2_flops) for a small qwen2
// shape, its terms worked out by hand below, and the MFU figure's edge cases.
#include <gtest/gtest.h>

#include "proto/device.hpp"
#include "workers/ppo/flops_counter.hpp"

namespace tessera::ppo {
namespace {

models::ModelConfig small_qwen2() {
  models::ModelConfig c;
  c.vocab_size = 100;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  return c;
}

TEST(FlopsCounter, MatchesVerlsEstimateTermByTerm) {
  // mlp 64*96*3 = 18432; attention linears 64*(64+32+32+64) = 12288; embedding and head
  // 100*64*2 = 12800; dense (18432+12288)*2 + 12800 = 74240; 6 * 74240 * (3+5) tokens = 3563520.
  // Attention 12 * (9+25) * 16 * 4 * 2 = 52224.
  EXPECT_DOUBLE_EQ(training_flops(small_qwen2(), {3, 5}), 3563520.0 + 52224.0);
  EXPECT_DOUBLE_EQ(training_flops(small_qwen2(), {}), 0.0);
}

// verl's _estimate_gemma3_flops: a sliding layer's tokens attend to at most the window.
TEST(FlopsCounter, Gemma3SlidingLayersCountTheWindow) {
  models::ModelConfig c = small_qwen2();
  c.model_type = "gemma3_text";
  c.sliding_window = 4;
  c.layer_types = {"sliding_attention", "full_attention"};
  // Attention: layer 0 (window 4) 3*3 + 5*4 = 29, layer 1 9 + 25 = 34: 12 * 63 * 16 * 4 = 48384.
  EXPECT_DOUBLE_EQ(training_flops(c, {3, 5}), 3563520.0 + 48384.0);
  c.model_type = "gemma2";  // verl has no Gemma-2 estimate (MFU 0); Tessera counts its windows as full attention
  EXPECT_DOUBLE_EQ(training_flops(c, {3, 5}), 3563520.0 + 52224.0);
}

TEST(FlopsCounter, MfuIsZeroWhereThePeakOrTheTokensAreUnknown) {
  const nlohmann::json meta{{"global_token_num", {3, 5}}};
  const c10::Device cpu(c10::DeviceType::CPU);
  EXPECT_EQ(model_flops_utilization(small_qwen2(), meta, 1, 1.0, cpu, 1), 0.0);  // no peak for a CPU
  if (proto::cuda_device_count() > 0) {
    const c10::Device gpu(c10::DeviceType::CUDA, 0);
    const double peak = proto::device_peak_flops(gpu);
    if (peak > 0) {
      EXPECT_DOUBLE_EQ(model_flops_utilization(small_qwen2(), meta, 2, 0.5, gpu, 2),
                       training_flops(small_qwen2(), {3, 5}) * 2 / 0.5 / peak / 2);
    }
    EXPECT_EQ(model_flops_utilization(small_qwen2(), nlohmann::json::object(), 1, 1.0, gpu, 1), 0.0);
  }
}

}  // namespace
}  // namespace tessera::ppo
