// tiny_config.hpp: the small HF decoder config the models, PPO and rollout tests build on. No
// gtest here, so any test or bench may include it.
#pragma once

#include <cstdint>
#include <string>

#include "workers/models/config.hpp"

namespace tessera::models::testing {

/// A small config: 2 layers, hidden 32 (MLP 48), 4 heads of dim 8 over `kv_heads` KV heads, 128
/// positions, bos 1 / eos 2; qwen2 gets q/k/v biases. mistral gets a sliding window of 3; gemma2
/// HF Gemma2's shape (GeGLU, tied embeddings, window 3 on even layers) with small softcaps (5 on
/// the scores, 10 on the logits) and query_pre_attn_scalar 6, so each of them shows. qwen3_moe: 4
/// experts of width 16, top 2 renormalised; qwen2_moe: 4 experts, top 2 as they come, a shared
/// expert of width 24, q/k/v biases. gemma3_text: Gemma2's shape without softcaps, q/k norms, a
/// sliding layer (window 3, RoPE base 1e4) then a full one (base 1e6).
inline ModelConfig tiny_config(const std::string& model_type, int64_t kv_heads = 4, bool tied = false,
                               int64_t vocab = 64) {
  ModelConfig c;
  c.model_type = model_type;
  c.vocab_size = vocab;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = kv_heads;
  c.head_dim = 8;
  c.max_position_embeddings = 128;
  c.tie_word_embeddings = tied;
  c.attention_bias = model_type == "qwen2" || model_type == "qwen2_moe";
  if (model_type == "qwen3_moe" || model_type == "qwen2_moe") {
    c.moe.num_experts = 4;
    c.moe.num_experts_per_tok = 2;
    c.moe.moe_intermediate_size = 16;
    c.moe.norm_topk_prob = model_type == "qwen3_moe";
    if (model_type == "qwen2_moe") c.moe.shared_expert_intermediate_size = 24;
  }
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  if (model_type == "mistral" || model_type == "gemma2" || model_type == "gemma3_text") c.sliding_window = 3;
  if (model_type == "gemma2" || model_type == "gemma3_text") {
    c.hidden_act = "gelu_pytorch_tanh";
    c.tie_word_embeddings = true;
    c.query_pre_attn_scalar = 6.0;
  }
  if (model_type == "gemma2") {
    c.attn_logit_softcapping = 5.0;
    c.final_logit_softcapping = 10.0;
  }
  if (model_type == "gemma3_text") {  // RoPE bases far apart, so a swapped table shows
    c.layer_types = {"sliding_attention", "full_attention"};
    c.rope_theta = 1e6;
    c.rope_local_theta = 1e4;
  }
  return c;
}

}  // namespace tessera::models::testing
