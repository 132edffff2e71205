// param_count.hpp: how many weights a decoder's matrix products use, for FLOP and byte counts
// (verl's flops_counter, the rollout's prefill FLOPs, the decode benchmarks).
#pragma once

#include <cstdint>

#include "workers/models/config.hpp"

namespace tessera::models {

/// Weights one token meets in decoder layer `index`: q, k, v and o, and the MLP's gate, up and
/// down; on a sparse layer (MoE) the router, the num_experts_per_tok experts it picks and the
/// shared expert with its gate (as verl's flops_counter counts Qwen3-MoE). Norms and biases are
/// left out (they cost no matrix product).
inline double layer_matmul_params(const ModelConfig& c, int64_t index = 0) {
  const double h = static_cast<double>(c.hidden_size);
  const double head_dim = static_cast<double>(c.head_dim > 0 ? c.head_dim : c.hidden_size / c.num_attention_heads);
  const double q = static_cast<double>(c.num_attention_heads) * head_dim;
  const double kv = static_cast<double>(c.num_key_value_heads) * head_dim;
  const double attention = h * (q + 2 * kv) + q * h;
  if (!c.layer_is_sparse(index)) return attention + 3 * h * static_cast<double>(c.intermediate_size);
  const MoeConfig& m = c.moe;
  const double experts = 3 * h * static_cast<double>(m.moe_intermediate_size) * static_cast<double>(m.num_experts_per_tok);
  const double shared = m.shared_expert_intermediate_size > 0
                            ? 3 * h * static_cast<double>(m.shared_expert_intermediate_size) + h
                            : 0.0;
  return attention + h * static_cast<double>(m.num_experts) + experts + shared;
}

/// Every weight of the model: embeddings, each layer's matrices (all experts of a MoE layer) and
/// the LM head when it is not tied (norms and biases left out), or with `per_token` the ones one
/// token meets (a MoE layer's num_experts_per_tok experts).
inline double model_params(const ModelConfig& c, bool per_token) {
  double total = static_cast<double>(c.vocab_size) * static_cast<double>(c.hidden_size) * (c.tie_word_embeddings ? 1 : 2);
  ModelConfig every = c;
  if (!per_token) every.moe.num_experts_per_tok = c.moe.num_experts;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) total += layer_matmul_params(every, i);
  return total;
}

/// layer_matmul_params summed over every layer.
inline double decoder_matmul_params(const ModelConfig& c) {
  double total = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) total += layer_matmul_params(c, i);
  return total;
}

}  // namespace tessera::models
