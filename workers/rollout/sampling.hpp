// sampling.hpp: how the engine turns one step's logits into tokens, with vLLM's semantics.
//
//  - Greedy (do_sample=false, or temperature 0): argmax of the raw logits.
//  - Otherwise: logits / temperature, then top-k (keep every logit >= the k-th largest; -1 or 0
//    disables), then top-p on the renormalised top-k distribution (keep the smallest prefix of the
//    descending-probability order whose mass reaches top_p; the top token is always kept), then
//    one draw from the remaining distribution.
//  - The draw is inverse-CDF sampling with one uniform per row taken from that row's own torch
//    CPU generator (RowRng). Because every row owns its random stream, a row's tokens do not
//    depend on which other rows share its batch, on the slot it lands in, or on the batching mode:
//    continuous and static batching sample identically for the same seed.
//  - Log-probs (calculate_log_probs) are log_softmax(logits / temperature) at the chosen token,
//    before top-k/top-p filtering (what the actor recomputes); greedy rows use temperature 1.
//  - On a GPU, with top-k and top-p off and SamplingParams::fused (engine_kwargs.tessera.sampler=
//    fused, the default), one CUDA kernel makes the draw and the log-prob (Note [Fused sampling]
//    in cuda/fused_sampling.hpp): the same rule summed in another order.
//
// Thread-safety: the free functions are re-entrant; a RowRng is used by one thread at a time.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include "proto/status.hpp"
#include "workers/rollout/config.hpp"

namespace tessera::rollout {

/// Temperatures below it sample greedily (vLLM's _SAMPLING_EPS).
inline constexpr double kSamplingEps = 1e-5;

/// The sampling rule of one generate_sequences call.
struct SamplingParams {
  bool greedy = false;
  double temperature = 1.0;
  int64_t top_k = -1;
  double top_p = 1.0;
  bool fused = false;  ///< Draw with the fused CUDA kernel where it applies (see the file comment).
};

/// verl's vLLM rollout rules: do_sample=false -> greedy; else validate -> val_kwargs; else the
/// config's temperature/top_k/top_p. A temperature of 0 means greedy.
SamplingParams resolve_sampling(const RolloutConfig& config, bool do_sample, bool validate);

/// One row's random stream: a torch CPU generator (mt19937) seeded once.
class RowRng {
 public:
  explicit RowRng(uint64_t seed);
  /// A uniform double in [0, 1) from 53 random bits.
  double next_uniform();

 private:
  at::Generator generator_;
};

/// The seed of row `row` for a call whose seed is `call_seed` (splitmix64 of both).
uint64_t row_seed(uint64_t call_seed, int64_t row);

/// `logits` [N, V] (already divided by the temperature) with entries outside the top-k and then
/// the nucleus set to -inf. REQUIRES: logits is floating, 2-D; top_p in (0, 1].
at::Tensor apply_top_k_top_p(const at::Tensor& logits, int64_t top_k, double top_p);

/// Tokens [N] (int64) and, when requested, their log-probs [N] (fp32). A row that has no
/// distribution to draw from (Note [Unsampleable rows]) gets token -1 and a NaN log-prob.
struct SampledTokens {
  at::Tensor tokens;
  at::Tensor logprobs;  ///< Undefined unless want_logprobs.
};

/// Picks one token per row of `logits` [N, V] (fp32, bf16 or fp16: the rules above apply to the
/// values widened to fp32). `uniforms` holds N draws in [0, 1) and is ignored (may be empty) when
/// params.greedy.
///
/// Note [Unsampleable rows]
/// A diverged policy (NaN weights or activations) gives NaN logits, and an inf logit makes the
/// softmax NaN too: such a row has no distribution, and a sampler that draws from it anyway
/// (vLLM's does) returns arbitrary tokens that the trainer goes on learning from. Here a row with
/// a NaN or +inf logit, or with every logit -inf (greedy: whose maximum is not finite), gets
/// token -1, marked where the draw happens (in the fused kernel, or beside the torch ops) at no
/// extra pass over the logits; the engine stops the call with one line naming the row when it
/// reads the token, and feeds token 0 to the step it launched before reading.
/// REQUIRES: uniforms.size() == N unless greedy.
SampledTokens sample_tokens(const at::Tensor& logits, const SamplingParams& params,
                            const std::vector<double>& uniforms, bool want_logprobs);

/// Whether sample_tokens draws `logits` with the fused kernel under `params`.
bool fused_sampling_applies(const at::Tensor& logits, const SamplingParams& params);

/// The fused kernel on logits of `dtype` against the exact (float64) inverse CDF on a small
/// random problem, once per process, device and dtype; the error names
/// engine_kwargs.tessera.sampler=torch.
Status check_fused_sampling_cuda(c10::Device device, c10::ScalarType dtype);

}  // namespace tessera::rollout
