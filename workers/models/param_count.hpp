// param_count.hpp: how many weights a decoder's matrix products use, for FLOP and byte counts
// (verl's flops_counter, the rollout's prefill FLOPs, the decode benchmarks).
#pragma once

#include "workers/models/config.hpp"

namespace tessera::models {

/// Weights of one decoder layer's projections: q, k, v and o, and the MLP's gate, up and down.
/// Norms and biases are left out (they cost no matrix product).
inline double layer_matmul_params(const ModelConfig& c) {
  const double h = static_cast<double>(c.hidden_size);
  const double head_dim = static_cast<double>(c.head_dim > 0 ? c.head_dim : c.hidden_size / c.num_attention_heads);
  const double q = static_cast<double>(c.num_attention_heads) * head_dim;
  const double kv = static_cast<double>(c.num_key_value_heads) * head_dim;
  return h * (q + 2 * kv) + q * h + 3 * h * static_cast<double>(c.intermediate_size);
}

}  // namespace tessera::models
