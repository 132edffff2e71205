// metrics.hpp: verl's per-step metrics (verl/trainer/ppo/metric_utils.py) and validation
// metrics, with verl's names (reference/verl-fsdp.md §7.6):
//   compute_data_metrics       critic/score|rewards|advantages|returns|values/{mean,max,min},
//                              critic/vf_explained_var, response_length/* and prompt_length/*
//                              {mean,max,min,clip_ratio}
//   compute_timing_metrics     timing_s/<name>, timing_per_token_ms/{gen,ref,values,adv,
//                              update_critic,update_actor}
//   compute_throughout_metrics perf/total_num_tokens, perf/time_per_step, perf/throughput
//   process_validation_metrics mean@N, std@N, best@k/{mean,std}, worst@k/..., maj@k/... by
//                              verl's bootstrap (numpy's legacy MT19937 stream, reproduced
//                              exactly), then val-core/{data_source}/{var}/... or val-aux/...
// torch.var is the unbiased variance and np.std the population one, as in verl.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "proto/data_proto.hpp"
#include "proto/status.hpp"

namespace tessera::driver {

/// Metric name -> value (ordered, so logs are stable).
using Metrics = std::map<std::string, double>;
/// Section name -> seconds (verl's timing_raw).
using TimingRaw = std::map<std::string, double>;

/// verl's _compute_response_info: per-row prompt and response lengths (float) from
/// attention_mask and the responses width.
struct ResponseInfo {
  at::Tensor prompt_length;    ///< float [B]
  at::Tensor response_length;  ///< float [B]
  at::Tensor response_mask;    ///< attention_mask[:, -R:] as bool [B, R]
};
Result<ResponseInfo> compute_response_info(const proto::DataProto& batch);

/// verl's compute_data_metrics. Needs token_level_scores, token_level_rewards, advantages,
/// returns, responses, attention_mask (+ values with use_critic). The response mask is
/// `response_mask` when present, else attention_mask[:, -R:].
Result<Metrics> compute_data_metrics(const proto::DataProto& batch, bool use_critic);

/// verl's compute_timing_metrics.
Result<Metrics> compute_timing_metrics(const proto::DataProto& batch, const TimingRaw& timing_raw);

/// verl's compute_throughout_metrics: needs meta_info.global_token_num (list of ints) and
/// timing_raw["step"]. perf/throughput = total tokens / (step time * n_gpus).
Result<Metrics> compute_throughout_metrics(const proto::DataProto& batch, const TimingRaw& timing_raw,
                                           int64_t n_gpus);

/// verl's reduce_metrics: the mean of each list (an empty list gives NaN, as np.mean).
Metrics reduce_metrics(const std::map<std::string, std::vector<double>>& metrics);

/// Adds metrics reported by workers as JSON ({"actor/pg_loss": [..] or x, ...}) into `out`,
/// averaging lists. Non-numeric values are an error naming the key.
Status merge_worker_metrics(const nlohmann::json& worker_metrics, Metrics& out);

/// Folds the metrics and timings of a step's further generation batch (dynamic sampling) into the
/// step's, `folded` batches being in them already: the rollout's counters (rollout/*) add up,
/// rollout/kv_cache_gb is the largest, its per-row means (rollout/*_mean) average over the
/// batches; timings add up (the agent loops' per-row min, max and mean combine as such, their
/// slowest row is the latest batch's); any other metric is the latest batch's.
void fold_generation_metrics(const Metrics& more, const TimingRaw& more_timing, int64_t folded, Metrics& metrics,
                             TimingRaw& timing);

/// Measures one section into timing_raw[name] on destruction (verl's _timer / marked_timer),
/// adding to an existing entry: a section entered twice in a step counts both.
class MarkedTimer {
 public:
  MarkedTimer(std::string name, TimingRaw& timing_raw);
  ~MarkedTimer();
  MarkedTimer(const MarkedTimer&) = delete;
  MarkedTimer& operator=(const MarkedTimer&) = delete;

 private:
  std::string name_;
  TimingRaw& timing_raw_;
  std::chrono::steady_clock::time_point start_;
};

/// verl's bootstrap_metric: for each reduce fn, (mean, std) over n_bootstrap resamples of
/// `subset_size` indices drawn with replacement by numpy's legacy RandomState(seed).
/// The values are grouped per sample; reduce fns see the resampled values.
using ReduceFn = std::function<double(const std::vector<size_t>& idxs)>;
std::vector<std::pair<double, double>> bootstrap_metric(size_t data_size, size_t subset_size,
                                                        const std::vector<ReduceFn>& reduce_fns,
                                                        int64_t n_bootstrap = 1000, uint32_t seed = 42);

/// data_source -> variable -> metric name ("mean@4", "best@2/std", ...) -> value.
using ValidationMetrics = std::map<std::string, std::map<std::string, std::map<std::string, double>>>;

/// verl's process_validation_metrics. `infos` maps a variable ("reward", "acc", "pred", ...) to
/// one value per sample; string-valued variables are skipped as metrics, and "pred" (if present)
/// is the vote for maj@k. Errors: a variable whose length differs from data_sources.
Result<ValidationMetrics> process_validation_metrics(const std::vector<std::string>& data_sources,
                                                     const std::vector<std::string>& sample_inputs,
                                                     const std::map<std::string, std::vector<nlohmann::json>>& infos,
                                                     uint32_t seed = 42);

/// verl _validate's naming: the core variable ("acc" if present, else "reward") with mean/maj/
/// best at the largest N goes to val-core/{ds}/{var}/{metric}; everything else to val-aux/...
Metrics validation_metric_dict(const ValidationMetrics& metrics);

}  // namespace tessera::driver
