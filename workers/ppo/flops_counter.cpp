// flops_counter.cpp: see flops_counter.hpp.
#include "workers/ppo/flops_counter.hpp"

#include <algorithm>

#include "proto/device.hpp"
#include "workers/models/param_count.hpp"

namespace tessera::ppo {

double training_flops(const models::ModelConfig& c, const std::vector<int64_t>& seqlens) {
  const double hidden = static_cast<double>(c.hidden_size);
  const double head_dim = static_cast<double>(c.head_dim > 0 ? c.head_dim : c.hidden_size / c.num_attention_heads);
  const double embed_and_head = static_cast<double>(c.vocab_size) * hidden * 2;
  const double dense = models::decoder_matmul_params(c) + embed_and_head;
  double tokens = 0, square_sum = 0;
  for (int64_t s : seqlens) {
    tokens += static_cast<double>(s);
    square_sum += static_cast<double>(s) * static_cast<double>(s);
  }
  double layer_square_sums = square_sum * static_cast<double>(c.num_hidden_layers);
  // verl's _estimate_gemma3_flops: a sliding layer's token sees at most the window (verl counts
  // every other family's windows as full attention).
  if (c.model_type == "gemma3_text" && c.sliding_window) {
    layer_square_sums = 0;
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      for (int64_t s : seqlens) {
        const int64_t seen = c.layer_slides(i) ? std::min(s, *c.sliding_window) : s;
        layer_square_sums += static_cast<double>(s) * static_cast<double>(seen);
      }
    }
  }
  const double attention = 12 * layer_square_sums * head_dim * static_cast<double>(c.num_attention_heads);
  return 6 * dense * tokens + attention;
}

double model_flops_utilization(const models::ModelConfig& config, const nlohmann::json& meta_info,
                               int64_t ppo_epochs, double seconds, const c10::Device& device, int world_size) {
  const double peak = proto::device_peak_flops(device);
  auto tokens = meta_info.find("global_token_num");
  if (peak <= 0 || seconds <= 0 || world_size < 1 || tokens == meta_info.end() || !tokens->is_array()) return 0.0;
  std::vector<int64_t> seqlens;
  for (const auto& t : *tokens) {
    if (!t.is_number_integer()) return 0.0;
    seqlens.push_back(t.get<int64_t>());
  }
  const double achieved = training_flops(config, seqlens) * static_cast<double>(ppo_epochs) / seconds;
  return achieved / peak / static_cast<double>(world_size);
}

}  // namespace tessera::ppo
