// Per-step metrics (driver/metrics.hpp), after verl/trainer/ppo/metric_utils.py.
#include <algorithm>
#include <cmath>
#include <limits>

#include <torch/torch.h>

#include "driver/metrics.hpp"

namespace tessera::driver {
namespace {

double item(const at::Tensor& t) { return t.to(torch::kFloat64).item<double>(); }

// mean/max/min of a float tensor under `prefix` (NaN for an empty selection, like torch).
void add_stats(Metrics& m, const std::string& prefix, const at::Tensor& t) {
  at::Tensor d = t.to(torch::kFloat64);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  m[prefix + "/mean"] = d.numel() ? item(d.mean()) : nan;
  m[prefix + "/max"] = d.numel() ? item(d.max()) : nan;
  m[prefix + "/min"] = d.numel() ? item(d.min()) : nan;
}

}  // namespace

Result<ResponseInfo> compute_response_info(const proto::DataProto& batch) {
  TESSERA_ASSIGN_OR_RETURN(at::Tensor responses, batch.tensor("responses"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor attention_mask, batch.tensor("attention_mask"));
  const int64_t r = responses.size(-1);
  if (attention_mask.dim() != 2 || attention_mask.size(1) < r) {
    return make_error(ErrorCode::invalid_argument, "metrics: attention_mask {} is narrower than responses width {}",
                      c10::str(attention_mask.sizes()), r);
  }
  ResponseInfo info;
  info.response_mask = attention_mask.slice(1, attention_mask.size(1) - r).to(torch::kBool);
  info.prompt_length = attention_mask.slice(1, 0, attention_mask.size(1) - r).sum(-1).to(torch::kFloat32);
  info.response_length = attention_mask.slice(1, attention_mask.size(1) - r).sum(-1).to(torch::kFloat32);
  return info;
}

Result<Metrics> compute_data_metrics(const proto::DataProto& batch, bool use_critic) {
  try {
    TESSERA_ASSIGN_OR_RETURN(at::Tensor scores, batch.tensor("token_level_scores"));
    TESSERA_ASSIGN_OR_RETURN(at::Tensor rewards, batch.tensor("token_level_rewards"));
    TESSERA_ASSIGN_OR_RETURN(at::Tensor advantages, batch.tensor("advantages"));
    TESSERA_ASSIGN_OR_RETURN(at::Tensor returns, batch.tensor("returns"));
    TESSERA_ASSIGN_OR_RETURN(ResponseInfo info, compute_response_info(batch));
    TESSERA_ASSIGN_OR_RETURN(at::Tensor attention_mask, batch.tensor("attention_mask"));
    at::Tensor response_mask = info.response_mask;
    if (auto rm = batch.tensor("response_mask"); rm.ok()) response_mask = rm->to(torch::kBool);
    const int64_t max_response_length = response_mask.size(-1);
    const int64_t max_prompt_length = attention_mask.size(1) - max_response_length;
    Metrics m;
    add_stats(m, "critic/score", scores.sum(-1));
    add_stats(m, "critic/rewards", rewards.sum(-1));
    add_stats(m, "critic/advantages", torch::masked_select(advantages, response_mask));
    at::Tensor valid_returns = torch::masked_select(returns, response_mask);
    add_stats(m, "critic/returns", valid_returns);
    if (use_critic) {
      TESSERA_ASSIGN_OR_RETURN(at::Tensor values, batch.tensor("values"));
      at::Tensor valid_values = torch::masked_select(values, response_mask);
      add_stats(m, "critic/values", valid_values);
      const double diff_var = item(torch::var(valid_returns - valid_values));  // unbiased, as torch.var
      const double ret_var = item(torch::var(valid_returns));
      m["critic/vf_explained_var"] = 1.0 - diff_var / (ret_var + 1e-5);
    }
    add_stats(m, "response_length", info.response_length);
    m["response_length/clip_ratio"] = item(torch::eq(info.response_length, max_response_length).to(torch::kFloat64).mean());
    add_stats(m, "prompt_length", info.prompt_length);
    m["prompt_length/clip_ratio"] = item(torch::eq(info.prompt_length, max_prompt_length).to(torch::kFloat64).mean());
    // A multi-turn rollout's turns per sequence (verl: __num_turns__).
    if (auto turns = batch.column("__num_turns__"); turns.ok() && turns->type() == proto::ColumnType::int64 &&
                                                    turns->size() > 0) {
      std::vector<double> v;
      for (int64_t i = 0; i < turns->size(); ++i) v.push_back(static_cast<double>(turns->i64(i)));
      add_stats(m, "num_turns", torch::tensor(v, torch::kFloat64));
    }
    return m;
  } catch (const c10::Error& e) {
    return make_error(ErrorCode::invalid_argument, "compute_data_metrics: {}", e.what_without_backtrace());
  }
}

Result<Metrics> compute_timing_metrics(const proto::DataProto& batch, const TimingRaw& timing_raw) {
  TESSERA_ASSIGN_OR_RETURN(ResponseInfo info, compute_response_info(batch));
  const double prompt_tokens = item(info.prompt_length.sum());
  const double response_tokens = item(info.response_length.sum());
  const std::map<std::string, double> tokens_of_section = {
      {"gen", response_tokens},
      {"ref", prompt_tokens + response_tokens},
      {"values", prompt_tokens + response_tokens},
      {"adv", prompt_tokens + response_tokens},
      {"update_critic", prompt_tokens + response_tokens},
      {"update_actor", prompt_tokens + response_tokens},
  };
  Metrics m;
  for (const auto& [name, seconds] : timing_raw) {
    m["timing_s/" + name] = seconds;
    auto it = tokens_of_section.find(name);
    if (it != tokens_of_section.end()) m["timing_per_token_ms/" + name] = seconds * 1000.0 / it->second;
  }
  return m;
}

Result<Metrics> compute_throughout_metrics(const proto::DataProto& batch, const TimingRaw& timing_raw, int64_t n_gpus) {
  const auto& tokens = batch.meta_info().find("global_token_num");
  if (tokens == batch.meta_info().end() || !tokens->is_array()) {
    return make_error(ErrorCode::invalid_argument, "compute_throughout_metrics: meta_info.global_token_num is missing");
  }
  auto step = timing_raw.find("step");
  if (step == timing_raw.end()) {
    return make_error(ErrorCode::invalid_argument, "compute_throughout_metrics: timing_raw has no 'step'");
  }
  if (n_gpus < 1) return make_error(ErrorCode::invalid_argument, "compute_throughout_metrics: n_gpus = {}", n_gpus);
  double total = 0;
  for (const auto& t : *tokens) {
    if (!t.is_number()) return make_error(ErrorCode::invalid_argument, "meta_info.global_token_num holds {}", t.dump());
    total += t.get<double>();
  }
  return Metrics{{"perf/total_num_tokens", total},
                 {"perf/time_per_step", step->second},
                 {"perf/throughput", total / (step->second * static_cast<double>(n_gpus))}};
}

Metrics reduce_metrics(const std::map<std::string, std::vector<double>>& metrics) {
  Metrics out;
  for (const auto& [k, v] : metrics) {
    double sum = 0;
    for (double x : v) sum += x;
    out[k] = v.empty() ? std::numeric_limits<double>::quiet_NaN() : sum / static_cast<double>(v.size());
  }
  return out;
}

Status merge_worker_metrics(const nlohmann::json& worker_metrics, Metrics& out) {
  if (worker_metrics.is_null()) return Status();
  if (!worker_metrics.is_object()) {
    return make_error(ErrorCode::invalid_argument, "worker metrics must be an object, got {}", worker_metrics.dump());
  }
  for (const auto& [k, v] : worker_metrics.items()) {
    std::vector<double> values;
    auto take = [&](const nlohmann::json& x) -> Status {
      if (x.is_array()) {
        for (const auto& y : x) {
          if (!y.is_number()) return make_error(ErrorCode::invalid_argument, "worker metric '{}' holds {}", k, y.dump());
          values.push_back(y.get<double>());
        }
        return Status();
      }
      if (!x.is_number()) return make_error(ErrorCode::invalid_argument, "worker metric '{}' holds {}", k, x.dump());
      values.push_back(x.get<double>());
      return Status();
    };
    TESSERA_RETURN_IF_ERROR(take(v));
    out[k] = reduce_metrics({{k, values}})[k];
  }
  return Status();
}

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void fold_generation_metrics(const Metrics& more, const TimingRaw& more_timing, int64_t folded, Metrics& metrics,
                             TimingRaw& timing) {
  const auto average = [folded](double mine, double other) {
    return (mine * static_cast<double>(folded) + other) / static_cast<double>(folded + 1);
  };
  for (const auto& [key, value] : more) {
    auto it = metrics.find(key);
    if (it == metrics.end() || key.rfind("rollout/", 0) != 0) {
      metrics[key] = value;
    } else if (key == "rollout/kv_cache_gb") {
      it->second = std::max(it->second, value);
    } else if (ends_with(key, "_mean")) {
      it->second = average(it->second, value);
    } else {
      it->second += value;
    }
  }
  // Phases add up; the agent loops' per-row statistics combine as what they are (their slowest
  // row is the latest batch's).
  for (const auto& [key, value] : more_timing) {
    auto it = timing.find(key);
    if (it == timing.end() || key.rfind("agent_loop/slowest/", 0) == 0) {
      timing[key] = value;
    } else if (ends_with(key, "/min")) {
      it->second = std::min(it->second, value);
    } else if (ends_with(key, "/max")) {
      it->second = std::max(it->second, value);
    } else if (ends_with(key, "/mean")) {
      it->second = average(it->second, value);
    } else {
      it->second += value;
    }
  }
}

MarkedTimer::MarkedTimer(std::string name, TimingRaw& timing_raw)
    : name_(std::move(name)), timing_raw_(timing_raw), start_(std::chrono::steady_clock::now()) {}

MarkedTimer::~MarkedTimer() {
  // verl's _timer adds: a phase entered twice in a step (dynamic sampling's gen) counts both.
  timing_raw_[name_] += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

}  // namespace tessera::driver
