// kv_engine.hpp: Tessera's generation engine: batched autoregressive decoding over a paged KV
// cache (paged_kv.hpp), with continuous batching and, on a CUDA device, CUDA-graph decode steps.
//
// How a call runs (internal/generation_loop.cpp has the details):
//  - The prompts (left pads stripped) queue up; up to `max_num_seqs` sequences are in flight,
//    each holding KV blocks. Newly admitted prompts are prefilled together (the samples of one
//    prompt once, Note [Shared prompt prefill]; at most max_num_batched_tokens padded prompt
//    tokens per forward, a longer prefill in chunks when enable_chunked_prefill), then every
//    in-flight row advances one token per batched decode step.
//  - A row finishes at its first EOS (unless ignore_eos) or after response_length tokens. Its
//    blocks are freed at once: with continuous batching its place is refilled from the pending
//    prompts before the next step; with static batching ("waves") only when the whole wave is
//    done. Finished rows cost no compute: a decode step and the vocabulary head run for the live
//    rows only (rounded up to a graph's batch-size bucket with enforce_eager=false, Note [Decode
//    graphs] in internal/decode_runner.hpp).
//  - Sampling follows sampling.hpp (vLLM rules, a per-row torch CPU generator). Each call draws
//    its seed from the engine's generator (seeded by EngineOptions::seed), so consecutive calls
//    differ, the same seed replays the same sequence of calls, and results do not depend on the
//    slot count or the batching mode. A call whose meta_info holds the trainer's `global_steps`
//    is seeded from (EngineOptions::seed, global_steps, validate) instead, so a resumed run
//    samples exactly like an uninterrupted one.
//  - `n` is not used: as in verl v0.5, the trainer repeats the prompts, and the engine generates
//    once per row (repeated rows draw from different row streams).
//
// Weights are never copied: the engine computes with a models::CausalLM it shares with its
// creator, and load_weights_by_reference() re-points every parameter at the given tensors
// (models' Note [Swapping parameters]); data_ptr identity holds afterwards.
//
// Thread-safety: one thread at a time per engine; the model must not run elsewhere meanwhile.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

#include <ATen/core/Generator.h>

#include "proto/data_proto.hpp"
#include "proto/status.hpp"
#include "workers/models/config.hpp"
#include "workers/models/model.hpp"
#include "workers/rollout/config.hpp"
#include "workers/rollout/engine.hpp"
#include "workers/rollout/step_model.hpp"

namespace tessera::rollout {

namespace internal {
struct PrefixSession;
}  // namespace internal

/// Per-rank settings that are not part of verl's rollout config.
struct EngineOptions {
  /// Seed of the engine's torch CPU generator. Workers pass verl's per-dp-rank seed
  /// (dp_rank + 1000, plus rollout.seed if set) so TP peers sample alike.
  uint64_t seed = 0;
  /// Rollout TP: the smallest of the peers' values (collective; every peer calls it in the same
  /// order). The KV cache's block cap, read from each device's free memory, must be the same on
  /// every peer, or their schedules (admissions, preemption, evictions) and so their collectives
  /// would part. Unset: one rank.
  std::function<int64_t(int64_t)> agree_min = nullptr;
};

/// The KV-cache RolloutEngine. See the header comment.
class KVCacheEngine final : public RolloutEngine {
 public:
  /// An engine over `model` (shared, no copy). Checks the config (tensor_model_parallel_size must
  /// be the step model's TP size: 1 here), that config.dtype matches the model's dtype (unless "auto"), and that
  /// prompt_length + response_length fits max_position_embeddings. Sets the model's fused-layer
  /// switches to engine_kwargs.tessera.fused_layers (StepModel::set_fused_layers).
  static Result<std::unique_ptr<KVCacheEngine>> create(std::shared_ptr<models::CausalLM> model, RolloutConfig config,
                                                       const EngineOptions& options = {});
  /// An engine over a model built on `tensors` by reference (models::CausalLM::from_parameters).
  static Result<std::unique_ptr<KVCacheEngine>> create_from_tensors(models::ModelConfig model_config,
                                                                    const models::TensorMap& tensors,
                                                                    RolloutConfig config,
                                                                    const EngineOptions& options = {});
  /// An engine over any StepModel (a tensor-parallel one, a fake). REQUIRES: model != nullptr.
  static Result<std::unique_ptr<KVCacheEngine>> create(std::unique_ptr<StepModel> model, RolloutConfig config,
                                                       const EngineOptions& options = {});

  ~KVCacheEngine() override;
  Result<proto::DataProto> generate_sequences(const proto::DataProto& prompts) override;
  Result<std::vector<GeneratedRow>> generate_tokens(const TokenRequests& requests) override;
  uint64_t call_seed(const nlohmann::json& meta) override;
  Status load_weights_by_reference(const models::TensorMap& tensors) override;
  const GenerationStats& last_stats() const override { return stats_; }
  /// With rollout.enable_prefix_caching (Note [Prefix cache]); otherwise no effect.
  void begin_session(int64_t rows) override;
  void end_session() override;

  const RolloutConfig& config() const { return config_; }
  StepModel& step_model() const { return *model_; }

 private:
  KVCacheEngine(std::unique_ptr<StepModel> model, RolloutConfig config, const EngineOptions& options);
  Status check_prompts(const std::vector<std::vector<int64_t>>& prompts, const std::vector<int64_t>& max_tokens) const;
  /// Runs the generation loop over `requests`, converting model failures to errors; sets stats_.
  Result<std::vector<GeneratedRow>> run(const TokenRequests& requests, std::chrono::steady_clock::time_point start);

  std::unique_ptr<StepModel> model_;
  RolloutConfig config_;
  at::Generator generator_;  ///< Draws one seed per call.
  GenerationStats stats_;
  std::unique_ptr<internal::PrefixSession> session_;  ///< Between begin_session and end_session.
  std::function<int64_t(int64_t)> agree_min_;         ///< EngineOptions::agree_min.
};

}  // namespace tessera::rollout
