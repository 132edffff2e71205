// Validation metrics (driver/metrics.hpp), after verl/trainer/ppo/metric_utils.py
// process_validation_metrics / bootstrap_metric / calc_maj_val and RayPPOTrainer._validate.
#include <algorithm>
#include <cmath>
#include <random>

#include "driver/metrics.hpp"

namespace tessera::driver {
namespace {

// Note [numpy's legacy randint]: np.random.seed(s) seeds MT19937 with init_genrand(s), exactly
// std::mt19937(s). RandomState.choice(n, size, replace=True) is randint(0, n), which draws
// 32-bit outputs and rejects `out & mask > n - 1`, mask = the smallest 2^k - 1 >= n - 1.
class NumpyLegacyRandom {
 public:
  explicit NumpyLegacyRandom(uint32_t seed) : mt_(seed) {}
  size_t randint(size_t n) {
    const uint32_t rng = static_cast<uint32_t>(n - 1);
    if (rng == 0) return 0;
    uint32_t mask = rng;
    for (int s = 1; s < 32; s <<= 1) mask |= mask >> s;
    uint32_t v;
    do {
      v = static_cast<uint32_t>(mt_()) & mask;
    } while (v > rng);
    return v;
  }

 private:
  std::mt19937 mt_;
};

std::pair<double, double> mean_std(const std::vector<double>& v) {  // np.mean, np.std (ddof 0)
  double sum = 0, sq = 0;
  for (double x : v) sum += x;
  const double mean = sum / static_cast<double>(v.size());
  for (double x : v) sq += (x - mean) * (x - mean);
  return {mean, std::sqrt(sq / static_cast<double>(v.size()))};
}

double as_number(const nlohmann::json& v) {
  if (v.is_boolean()) return v.get<bool>() ? 1.0 : 0.0;
  if (v.is_number()) return v.get<double>();
  return std::nan("");
}

// verl's calc_maj_val: the value of the first sample voting for the most frequent prediction
// (ties: the prediction seen first).
double majority_value(const std::vector<size_t>& idxs, const std::vector<double>& vals,
                      const std::vector<nlohmann::json>& preds) {
  std::vector<std::pair<nlohmann::json, std::pair<int, double>>> votes;  // pred -> (count, first val)
  for (size_t i : idxs) {
    auto it = std::find_if(votes.begin(), votes.end(), [&](const auto& p) { return p.first == preds[i]; });
    if (it == votes.end()) {
      votes.push_back({preds[i], {1, vals[i]}});
    } else {
      ++it->second.first;
    }
  }
  auto best = votes.begin();
  for (auto it = votes.begin(); it != votes.end(); ++it) {
    if (it->second.first > best->second.first) best = it;
  }
  return best->second.second;
}

// verl's per-prompt metric dict for one variable.
std::map<std::string, double> prompt_metrics(const std::vector<double>& vals, const std::vector<nlohmann::json>* preds,
                                             uint32_t seed) {
  std::map<std::string, double> m;
  const size_t n = vals.size();
  auto [mean, sd] = mean_std(vals);
  m[fmt::format("mean@{}", n)] = mean;
  if (n <= 1) return m;
  m[fmt::format("std@{}", n)] = sd;
  std::vector<size_t> ns;
  for (size_t k = 2; k < n; k *= 2) ns.push_back(k);
  ns.push_back(n);
  ReduceFn max_fn = [&](const std::vector<size_t>& idxs) {
    double best = -INFINITY;
    for (size_t i : idxs) best = std::max(best, vals[i]);
    return best;
  };
  ReduceFn min_fn = [&](const std::vector<size_t>& idxs) {
    double worst = INFINITY;
    for (size_t i : idxs) worst = std::min(worst, vals[i]);
    return worst;
  };
  for (size_t k : ns) {
    auto bw = bootstrap_metric(n, k, {max_fn, min_fn}, 1000, seed);
    m[fmt::format("best@{}/mean", k)] = bw[0].first;
    m[fmt::format("best@{}/std", k)] = bw[0].second;
    m[fmt::format("worst@{}/mean", k)] = bw[1].first;
    m[fmt::format("worst@{}/std", k)] = bw[1].second;
    if (preds != nullptr) {
      ReduceFn maj = [&](const std::vector<size_t>& idxs) { return majority_value(idxs, vals, *preds); };
      auto mj = bootstrap_metric(n, k, {maj}, 1000, seed);
      m[fmt::format("maj@{}/mean", k)] = mj[0].first;
      m[fmt::format("maj@{}/std", k)] = mj[0].second;
    }
  }
  return m;
}

// N of "mean@N", "best@N/mean", ... (verl: int(name.split("@")[-1].split("/")[0])).
int64_t metric_n(const std::string& name) {
  size_t at = name.rfind('@');
  if (at == std::string::npos) return 0;
  return std::strtoll(name.c_str() + at + 1, nullptr, 10);
}

}  // namespace

std::vector<std::pair<double, double>> bootstrap_metric(size_t data_size, size_t subset_size,
                                                        const std::vector<ReduceFn>& reduce_fns, int64_t n_bootstrap,
                                                        uint32_t seed) {
  NumpyLegacyRandom rng(seed);
  std::vector<std::vector<double>> results(reduce_fns.size());
  std::vector<size_t> idxs(subset_size);
  for (int64_t b = 0; b < n_bootstrap; ++b) {
    for (auto& i : idxs) i = rng.randint(data_size);
    for (size_t f = 0; f < reduce_fns.size(); ++f) results[f].push_back(reduce_fns[f](idxs));
  }
  std::vector<std::pair<double, double>> out;
  for (const auto& r : results) out.push_back(mean_std(r));
  return out;
}

Result<ValidationMetrics> process_validation_metrics(const std::vector<std::string>& data_sources,
                                                     const std::vector<std::string>& sample_inputs,
                                                     const std::map<std::string, std::vector<nlohmann::json>>& infos,
                                                     uint32_t seed) {
  const size_t n = data_sources.size();
  if (sample_inputs.size() != n) {
    return make_error(ErrorCode::invalid_argument, "validation: {} sample inputs for {} data sources",
                      sample_inputs.size(), n);
  }
  for (const auto& [var, vals] : infos) {
    if (vals.size() != n) {
      return make_error(ErrorCode::invalid_argument, "validation: variable '{}' has {} values for {} samples", var,
                        vals.size(), n);
    }
  }
  // data source -> prompts in first-seen order -> sample indices
  std::map<std::string, std::vector<std::pair<std::string, std::vector<size_t>>>> groups;
  for (size_t i = 0; i < n; ++i) {
    auto& prompts = groups[data_sources[i]];
    auto it = std::find_if(prompts.begin(), prompts.end(), [&](const auto& p) { return p.first == sample_inputs[i]; });
    if (it == prompts.end()) prompts.push_back({sample_inputs[i], {i}});
    else it->second.push_back(i);
  }
  ValidationMetrics out;
  for (const auto& [ds, prompts] : groups) {
    std::map<std::string, std::map<std::string, std::vector<double>>> per_prompt;  // var -> metric -> values
    for (const auto& [prompt, idxs] : prompts) {
      for (const auto& [var, all] : infos) {
        if (all[idxs.front()].is_string()) continue;
        std::vector<double> vals;
        std::vector<nlohmann::json> preds;
        for (size_t i : idxs) vals.push_back(as_number(all[i]));
        auto pred_it = infos.find("pred");
        if (pred_it != infos.end()) {
          for (size_t i : idxs) preds.push_back(pred_it->second[i]);
        }
        for (const auto& [name, v] : prompt_metrics(vals, pred_it != infos.end() ? &preds : nullptr, seed)) {
          per_prompt[var][name].push_back(v);
        }
      }
    }
    for (const auto& [var, metrics] : per_prompt) {
      for (const auto& [name, vals] : metrics) out[ds][var][name] = mean_std(vals).first;
    }
  }
  return out;
}

Metrics validation_metric_dict(const ValidationMetrics& metrics) {
  Metrics out;
  for (const auto& [ds, vars] : metrics) {
    const std::string core = vars.count("acc") ? "acc" : "reward";
    for (const auto& [var, m] : vars) {
      int64_t n_max = 0;
      for (const auto& [name, v] : m) n_max = std::max(n_max, metric_n(name));
      const std::string tag = fmt::format("@{}", n_max);
      for (const auto& [name, v] : m) {
        bool core_metric = var == core && name.find(tag) != std::string::npos &&
                           (name.rfind("mean", 0) == 0 || name.rfind("maj", 0) == 0 || name.rfind("best", 0) == 0);
        out[fmt::format("{}/{}/{}/{}", core_metric ? "val-core" : "val-aux", ds, var, name)] = v;
      }
    }
  }
  return out;
}

}  // namespace tessera::driver
