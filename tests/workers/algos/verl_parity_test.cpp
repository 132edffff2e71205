// verl_parity_test.cpp: random-input parity against verl v0.5.0's OWN Python (pinned), beyond the
// fixed fixtures of shared/golden/core_algos.json.
//
// verl_parity.py (next to this file) runs under $TESSERA_PYTHON (the venv deploy/dev.sh makes, with
// verl==0.5.0 and the few packages its protocol and core_algos modules import; `ray` is stubbed).
// For 20 seeds (1000..1019 unless $TESSERA_VERL_PARITY_SEEDS="first:count") it draws random float64
// inputs and records verl's outputs for every advantage estimator (direct and through the registry),
// every kl_penalty mode, every policy loss mode (vanilla/compute_policy_loss, gpg, clip_cov, kl_cov),
// value/entropy losses, agg_loss's four modes and the verl_F helpers; and DataProto op sequences
// (chunk+concat, concat, union, repeat, pad/unpad, reorder, make_iterator). This test recomputes every
// case with tessera::algos / tessera::proto and fails naming the op and the seed when an output is off
// by more than 1e-6 (DataProto results must be identical).
//
// Skipped only when $TESSERA_PYTHON is unset; a failing script (verl missing, wrong version) FAILS.
#include <stdlib.h>  // mkdtemp
#include <unistd.h>  // rmdir

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "proto/column.hpp"
#include "proto/data_proto.hpp"
#include "tests/workers/algos/golden_cases.hpp"
#include "workers/algos/advantage.hpp"
#include "workers/algos/kl.hpp"
#include "workers/algos/losses.hpp"
#include "workers/algos/policy_loss.hpp"
#include "workers/algos/torch_functional.hpp"

namespace tessera::algos::testing {
namespace {

using nlohmann::json;

constexpr double kTolerance = 1e-6;
constexpr const char* kVerlVersion = "0.5.0";

// ---- running the Python side ---------------------------------------------------------------------

struct Harness {
  std::string skip;   // non-empty: GTEST_SKIP with this
  std::string error;  // non-empty: FAIL with this
  json doc;
};

std::string script_path() {
  if (const char* src = std::getenv("TESSERA_SOURCE_DIR"); src && *src) {
    return std::string(src) + "/tests/workers/algos/verl_parity.py";
  }
  std::string self = __FILE__;
  return self.substr(0, self.find_last_of('/') + 1) + "verl_parity.py";
}

std::string read_tail(const std::string& path, size_t max_chars) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  return s.size() > max_chars ? "..." + s.substr(s.size() - max_chars) : s;
}

const Harness& harness() {
  static const Harness h = [] {
    Harness out;
    const char* py = std::getenv("TESSERA_PYTHON");
    if (py == nullptr || *py == '\0') {
      out.skip = "TESSERA_PYTHON (with verl==0.5.0, see verl_parity.py) is not set";
      return out;
    }
    std::string seeds = "--first-seed 1000 --num-seeds 20";
    if (const char* s = std::getenv("TESSERA_VERL_PARITY_SEEDS"); s && *s) {
      const std::string v = s;
      const size_t colon = v.find(':');
      if (colon == std::string::npos) {
        out.error = fmt::format("TESSERA_VERL_PARITY_SEEDS must be first:count, got '{}'", v);
        return out;
      }
      seeds = fmt::format("--first-seed {} --num-seeds {}", std::stoll(v.substr(0, colon)),
                          std::stoll(v.substr(colon + 1)));
    }
    char tmpl[] = "/tmp/tessera_verl_parity_XXXXXX";
    const char* dir = mkdtemp(tmpl);
    if (dir == nullptr) {
      out.error = "mkdtemp failed";
      return out;
    }
    const std::string json_path = std::string(dir) + "/verl_parity.json";
    const std::string log_path = std::string(dir) + "/verl_parity.log";
    const std::string cmd =
        fmt::format("{} '{}' --out '{}' {} > '{}' 2>&1", py, script_path(), json_path, seeds, log_path);
    const int rc = std::system(cmd.c_str());
    const std::string log = read_tail(log_path, 4000);
    if (rc != 0) {
      out.error = fmt::format("`{}` failed (status {}):\n{}", cmd, rc, log);
    } else {
      fmt::print("[verl parity] {}", log);
      try {
        std::ifstream in(json_path);
        out.doc = json::parse(in);
      } catch (const std::exception& e) {
        out.error = fmt::format("{}: {}", json_path, e.what());
      }
    }
    std::remove(json_path.c_str());
    std::remove(log_path.c_str());
    ::rmdir(dir);
    if (out.error.empty() && out.doc.value("verl_version", std::string()) != kVerlVersion) {
      out.error = fmt::format("verl_parity.py reports verl '{}', the parity is pinned to {}",
                              out.doc.value("verl_version", std::string("?")), kVerlVersion);
    }
    return out;
  }();
  return h;
}

// ---- reading cases (flat layout of shared/golden/core_algos.json) --------------------------------

void flatten(const json& j, std::vector<double>& out, std::vector<int64_t>& shape, size_t depth) {
  if (!j.is_array()) {
    out.push_back(j.get<double>());
    return;
  }
  if (shape.size() == depth) shape.push_back(static_cast<int64_t>(j.size()));
  for (const auto& e : j) flatten(e, out, shape, depth + 1);
}

at::Tensor from_nested(const json& j) {
  std::vector<double> flat;
  std::vector<int64_t> shape;
  flatten(j, flat, shape, 0);
  return torch::tensor(flat, torch::kFloat64).reshape(shape);
}

Result<at::Tensor> tensor(CaseReader& r, const std::string& key) {
  TESSERA_ASSIGN_OR_RETURN(json j, r.get(key));
  return from_nested(j);
}

// Max |actual - verl| for output `key`; a shape mismatch is an error, NaN counts as infinite.
Result<double> diff(const at::Tensor& actual, CaseReader& r, const std::string& key) {
  TESSERA_ASSIGN_OR_RETURN(json j, r.get(key));
  return max_abs_diff(actual, from_nested(j), key);
}

Result<Diffs> diffs_of(CaseReader& r, const std::vector<std::pair<std::string, at::Tensor>>& outputs,
                       const std::string& prefix = "") {
  Diffs out;
  for (const auto& [name, t] : outputs) {
    TESSERA_ASSIGN_OR_RETURN(double d, diff(t, r, name));
    out.emplace_back(prefix + name, d);
  }
  return out;
}

Result<Diffs> policy_diffs(CaseReader& r, const PolicyLossOutput& out, const std::string& prefix = "") {
  return diffs_of(r,
                  {{"pg_loss", out.pg_loss},
                   {"pg_clipfrac", out.pg_clipfrac},
                   {"ppo_kl", out.ppo_kl},
                   {"pg_clipfrac_lower", out.pg_clipfrac_lower}},
                  prefix);
}

struct PolicyTensors {
  at::Tensor old_log_prob, log_prob, advantages, response_mask;
  std::string loss_agg_mode;
};

Result<PolicyTensors> policy_tensors(CaseReader& r) {
  PolicyTensors p;
  TESSERA_ASSIGN_OR_RETURN(p.old_log_prob, tensor(r, "old_log_prob"));
  TESSERA_ASSIGN_OR_RETURN(p.log_prob, tensor(r, "log_prob"));
  TESSERA_ASSIGN_OR_RETURN(p.advantages, tensor(r, "advantages"));
  TESSERA_ASSIGN_OR_RETURN(p.response_mask, tensor(r, "response_mask"));
  TESSERA_ASSIGN_OR_RETURN(p.loss_agg_mode, r.value<std::string>("loss_agg_mode"));
  return p;
}

// ---- handlers for what the golden table lacks (or checks one way only) ---------------------------

// verl's compute_policy_loss (the actor's loss_mode "vanilla"): Tessera's legacy entry point AND the
// registry's "vanilla" with the same clip settings must both match.
Result<Diffs> policy_loss_both(CaseReader& r) {
  TESSERA_ASSIGN_OR_RETURN(PolicyTensors p, policy_tensors(r));
  TESSERA_ASSIGN_OR_RETURN(double clip, r.value<double>("cliprange"));
  TESSERA_ASSIGN_OR_RETURN(double c, r.value<double>("clip_ratio_c"));
  std::optional<double> low, high;
  if (r.has("cliprange_low")) { TESSERA_ASSIGN_OR_RETURN(low, r.value<double>("cliprange_low")); }
  if (r.has("cliprange_high")) { TESSERA_ASSIGN_OR_RETURN(high, r.value<double>("cliprange_high")); }
  TESSERA_ASSIGN_OR_RETURN(PolicyLossOutput legacy,
                           compute_policy_loss(p.old_log_prob, p.log_prob, p.advantages, p.response_mask, clip, low,
                                               high, c, p.loss_agg_mode));
  TESSERA_ASSIGN_OR_RETURN(Diffs out, policy_diffs(r, legacy));
  PolicyLossConfig config;
  config.clip_ratio = clip;
  config.clip_ratio_low = low;
  config.clip_ratio_high = high;
  config.clip_ratio_c = c;
  TESSERA_ASSIGN_OR_RETURN(PolicyLossFn vanilla, get_policy_loss_fn("vanilla"));
  TESSERA_ASSIGN_OR_RETURN(PolicyLossOutput reg,
                           vanilla(p.old_log_prob, p.log_prob, p.advantages, p.response_mask, p.loss_agg_mode, config));
  TESSERA_ASSIGN_OR_RETURN(Diffs via_registry, policy_diffs(r, reg, "vanilla:"));
  out.insert(out.end(), via_registry.begin(), via_registry.end());
  return out;
}

// clip_cov through the registry. "seeded" cases reseed LibTorch's global CPU generator exactly as
// the script reseeded Python torch's before verl's torch.randperm.
Result<Diffs> clip_cov(CaseReader& r) {
  TESSERA_ASSIGN_OR_RETURN(PolicyTensors p, policy_tensors(r));
  TESSERA_ASSIGN_OR_RETURN(std::string variant, r.value<std::string>("variant"));
  PolicyLossConfig config;
  TESSERA_ASSIGN_OR_RETURN(config.clip_ratio, r.value<double>("clip_ratio"));
  if (r.has("clip_ratio_low")) { TESSERA_ASSIGN_OR_RETURN(config.clip_ratio_low, r.value<double>("clip_ratio_low")); }
  if (r.has("clip_ratio_high")) { TESSERA_ASSIGN_OR_RETURN(config.clip_ratio_high, r.value<double>("clip_ratio_high")); }
  TESSERA_ASSIGN_OR_RETURN(config.clip_cov_ratio, r.value<double>("clip_cov_ratio"));
  TESSERA_ASSIGN_OR_RETURN(config.clip_cov_lb, r.value<double>("clip_cov_lb"));
  TESSERA_ASSIGN_OR_RETURN(config.clip_cov_ub, r.value<double>("clip_cov_ub"));
  TESSERA_ASSIGN_OR_RETURN(PolicyLossFn fn, get_policy_loss_fn("clip_cov"));
  if (r.has("torch_seed")) {
    TESSERA_ASSIGN_OR_RETURN(json seed, r.get("torch_seed"));
    torch::manual_seed(seed.get<uint64_t>());
  }
  TESSERA_ASSIGN_OR_RETURN(PolicyLossOutput out,
                           fn(p.old_log_prob, p.log_prob, p.advantages, p.response_mask, p.loss_agg_mode, config));
  return policy_diffs(r, out, variant + ":");
}

Result<Diffs> kl_cov(CaseReader& r) {
  TESSERA_ASSIGN_OR_RETURN(PolicyTensors p, policy_tensors(r));
  PolicyLossConfig config;
  TESSERA_ASSIGN_OR_RETURN(config.kl_cov_ratio, r.value<double>("kl_cov_ratio"));
  TESSERA_ASSIGN_OR_RETURN(config.ppo_kl_coef, r.value<double>("ppo_kl_coef"));
  TESSERA_ASSIGN_OR_RETURN(PolicyLossFn fn, get_policy_loss_fn("kl_cov"));
  TESSERA_ASSIGN_OR_RETURN(PolicyLossOutput out,
                           fn(p.old_log_prob, p.log_prob, p.advantages, p.response_mask, p.loss_agg_mode, config));
  return policy_diffs(r, out);
}

// An estimator looked up by name, fed the kwargs ray_trainer.compute_advantage passes.
Result<Diffs> adv_registry(CaseReader& r) {
  TESSERA_ASSIGN_OR_RETURN(std::string name, r.value<std::string>("adv_estimator"));
  AdvantageInputs in;
  TESSERA_ASSIGN_OR_RETURN(in.token_level_rewards, tensor(r, "token_level_rewards"));
  TESSERA_ASSIGN_OR_RETURN(in.response_mask, tensor(r, "response_mask"));
  if (r.has("values")) { TESSERA_ASSIGN_OR_RETURN(in.values, tensor(r, "values")); }
  if (r.has("reward_baselines")) { TESSERA_ASSIGN_OR_RETURN(in.reward_baselines, tensor(r, "reward_baselines")); }
  if (r.has("index")) {
    TESSERA_ASSIGN_OR_RETURN(json index, r.get("index"));
    in.index = index.get<std::vector<std::string>>();
  }
  TESSERA_ASSIGN_OR_RETURN(in.config.gamma, r.value<double>("gamma"));
  TESSERA_ASSIGN_OR_RETURN(in.config.lam, r.value<double>("lam"));
  if (r.has("norm_adv_by_std_in_grpo")) {
    TESSERA_ASSIGN_OR_RETURN(in.config.norm_adv_by_std_in_grpo, r.value<bool>("norm_adv_by_std_in_grpo"));
  }
  TESSERA_ASSIGN_OR_RETURN(AdvantageEstimatorFn fn, get_adv_estimator_fn(name));
  TESSERA_ASSIGN_OR_RETURN(AdvantageReturn out, fn(in));
  return diffs_of(r, {{"advantages", out.advantages}, {"returns", out.returns}}, name + ":");
}

Result<Diffs> entropy_loss(CaseReader& r) {
  TESSERA_ASSIGN_OR_RETURN(at::Tensor logits, tensor(r, "logits"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor mask, tensor(r, "response_mask"));
  TESSERA_ASSIGN_OR_RETURN(std::string mode, r.value<std::string>("loss_agg_mode"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor out, compute_entropy_loss(logits, mask, mode));
  return diffs_of(r, {{"entropy_loss", out}});
}

Result<std::optional<int64_t>> axis_of(CaseReader& r) {
  TESSERA_ASSIGN_OR_RETURN(json axis, r.get("axis"));
  if (axis.is_null()) return std::optional<int64_t>();
  return std::optional<int64_t>(axis.get<int64_t>());
}

Result<Diffs> f_masked_mean(CaseReader& r) {
  TESSERA_ASSIGN_OR_RETURN(at::Tensor values, tensor(r, "values"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor mask, tensor(r, "mask"));
  TESSERA_ASSIGN_OR_RETURN(std::optional<int64_t> axis, axis_of(r));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor out, masked_mean(values, mask, axis));
  return diffs_of(r, {{"result", out}});
}

Result<Diffs> f_masked_sum(CaseReader& r) {
  TESSERA_ASSIGN_OR_RETURN(at::Tensor values, tensor(r, "values"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor mask, tensor(r, "mask"));
  TESSERA_ASSIGN_OR_RETURN(std::optional<int64_t> axis, axis_of(r));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor out, masked_sum(values, mask, axis));
  return diffs_of(r, {{"result", out}});
}

Result<Diffs> f_masked_var(CaseReader& r) {
  TESSERA_ASSIGN_OR_RETURN(at::Tensor values, tensor(r, "values"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor mask, tensor(r, "mask"));
  TESSERA_ASSIGN_OR_RETURN(bool unbiased, r.value<bool>("unbiased"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor out, masked_var(values, mask, unbiased));
  return diffs_of(r, {{"result", out}});
}

Result<Diffs> f_masked_whiten(CaseReader& r) {
  TESSERA_ASSIGN_OR_RETURN(at::Tensor values, tensor(r, "values"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor mask, tensor(r, "mask"));
  TESSERA_ASSIGN_OR_RETURN(bool shift_mean, r.value<bool>("shift_mean"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor out, masked_whiten(values, mask, shift_mean));
  return diffs_of(r, {{"result", out}});
}

Result<Diffs> f_entropy(CaseReader& r) {
  TESSERA_ASSIGN_OR_RETURN(at::Tensor logits, tensor(r, "logits"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor out, entropy_from_logits(logits));
  return diffs_of(r, {{"result", out}});
}

Result<Diffs> f_logprobs(CaseReader& r) {
  TESSERA_ASSIGN_OR_RETURN(at::Tensor logits, tensor(r, "logits"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor labels, tensor(r, "labels"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor out, logprobs_from_logits(logits, labels.to(torch::kLong)));
  return diffs_of(r, {{"result", out}});
}

Result<Diffs> f_clip(CaseReader& r) {
  TESSERA_ASSIGN_OR_RETURN(at::Tensor x, tensor(r, "x"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor lo, tensor(r, "tensor_min"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor hi, tensor(r, "tensor_max"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor out, clip_by_value(x, lo, hi));
  return diffs_of(r, {{"result", out}});
}

// This file's handlers first, then the golden ones (same case layout) for everything else.
CaseHandler find_handler(const std::string& fn) {
  static const std::map<std::string, CaseHandler> local = {
      {"compute_policy_loss", &policy_loss_both},
      {"compute_policy_loss_clip_cov", &clip_cov},
      {"compute_policy_loss_kl_cov", &kl_cov},
      {"get_adv_estimator_fn", &adv_registry},
      {"compute_entropy_loss", &entropy_loss},
      {"masked_mean", &f_masked_mean},
      {"masked_sum", &f_masked_sum},
      {"masked_var", &f_masked_var},
      {"masked_whiten", &f_masked_whiten},
      {"entropy_from_logits", &f_entropy},
      {"logprobs_from_logits", &f_logprobs},
      {"clip_by_value", &f_clip},
  };
  if (auto it = local.find(fn); it != local.end()) return it->second;
  const auto& golden = golden_handlers();
  if (auto it = golden.find(fn); it != golden.end()) return it->second;
  return nullptr;
}

// One case; "" when every output is within tolerance, else "op <fn> seed <seed>: ...".
std::string check_case(const json& c, double& worst) {
  const std::string fn = c.value("fn", std::string("<missing fn>"));
  const std::string where = fmt::format("op {} seed {}", fn, c.contains("seed") ? c["seed"].dump() : "?");
  const CaseHandler handler = find_handler(fn);
  if (handler == nullptr) return where + ": no C++ counterpart is wired into verl_parity_test";
  CaseReader reader(c);
  (void)reader.get("seed");
  const bool raises = reader.has("raises");
  std::string raised;
  if (raises) raised = reader.get("raises")->get<std::string>();
  Result<Diffs> diffs = Status();
  try {
    diffs = handler(reader);
  } catch (const std::exception& e) {
    return fmt::format("{}: threw {}", where, e.what());
  }
  if (raises) {
    if (diffs.ok()) return fmt::format("{}: verl raises {} but Tessera returned a value", where, raised);
    return "";
  }
  if (!diffs.ok()) return fmt::format("{}: {}", where, diffs.status().to_string());
  std::string failure;
  for (const auto& [name, d] : *diffs) {
    worst = std::max(worst, d);
    if (!(d <= kTolerance)) failure += fmt::format(" {} off by {:.3e};", name, d);
  }
  for (const auto& key : reader.unused()) failure += fmt::format(" field '{}' was not used;", key);
  return failure.empty() ? "" : where + ":" + failure;
}

TEST(VerlParity, CoreAlgosMatchVerlOnRandomSeeds) {
  const Harness& h = harness();
  if (!h.skip.empty()) GTEST_SKIP() << h.skip;
  ASSERT_TRUE(h.error.empty()) << h.error;
  ASSERT_TRUE(h.doc.contains("cases") && h.doc["cases"].is_array());
  std::map<std::string, std::pair<int, int>> per_fn;  // fn -> (matched, total)
  double worst = 0.0;
  int failed = 0;
  for (const auto& c : h.doc["cases"]) {
    const std::string failure = check_case(c, worst);
    auto& counts = per_fn[c.value("fn", std::string())];
    ++counts.second;
    if (failure.empty()) {
      ++counts.first;
    } else if (++failed <= 50) {
      ADD_FAILURE() << failure;
    }
  }
  EXPECT_EQ(failed, 0) << failed << " of " << h.doc["cases"].size() << " cases differ from verl "
                       << kVerlVersion << " (first 50 listed above)";
  fmt::print("[verl parity] verl {} (torch {}, tensordict {}), seeds {}: {} cases, max |diff| {:.3e} (tol {:.0e})\n",
             h.doc.value("verl_version", ""), h.doc.value("torch_version", ""), h.doc.value("tensordict_version", ""),
             h.doc["seeds"].dump(), h.doc["cases"].size(), worst, kTolerance);
  for (const auto& [fn, counts] : per_fn) {
    fmt::print("[verl parity]   {:<56} {}/{}\n", fn, counts.first, counts.second);
  }
  // Every estimator and loss mode verl 0.5.0 registers must have been exercised.
  for (const char* fn : {"compute_gae_advantage_return", "compute_grpo_outcome_advantage",
                         "compute_grpo_passk_outcome_advantage", "compute_rloo_outcome_advantage",
                         "compute_opo_outcome_advantage", "compute_reinforce_plus_plus_baseline_outcome_advantage",
                         "compute_reinforce_plus_plus_outcome_advantage", "compute_remax_outcome_advantage",
                         "compute_gpg_outcome_advantage", "get_adv_estimator_fn", "kl_penalty", "compute_policy_loss",
                         "compute_policy_loss_gpg", "compute_policy_loss_clip_cov", "compute_policy_loss_kl_cov",
                         "compute_value_loss", "compute_entropy_loss", "agg_loss"}) {
    EXPECT_GT(per_fn[fn].second, 0) << "no case for " << fn;
  }
}

// ---- DataProto sequences -------------------------------------------------------------------------

using proto::Column;
using proto::ColumnType;
using proto::DataProto;

Result<at::ScalarType> dtype_of(const std::string& name) {
  if (name == "float64") return at::kDouble;
  if (name == "float32") return at::kFloat;
  if (name == "int64") return at::kLong;
  if (name == "bool") return at::kBool;
  return make_error(ErrorCode::corrupt_data, "unknown tensor dtype '{}'", name);
}

Result<ColumnType> column_type_of(const std::string& name) {
  if (name == "string") return ColumnType::string;
  if (name == "int64") return ColumnType::int64;
  if (name == "float64") return ColumnType::float64;
  if (name == "json") return ColumnType::json;
  return make_error(ErrorCode::corrupt_data, "unknown column type '{}'", name);
}

Result<at::Tensor> tensor_of(const json& spec) {
  const auto data = spec.at("data").get<std::vector<double>>();
  const auto shape = spec.at("shape").get<std::vector<int64_t>>();
  TESSERA_ASSIGN_OR_RETURN(at::ScalarType dtype, dtype_of(spec.at("dtype").get<std::string>()));
  return torch::tensor(data, torch::kFloat64).reshape(shape).to(dtype);
}

// A DataProto recorded by verl_parity.py's dp_json.
Result<DataProto> dp_of(const json& j) {
  proto::TensorDict tensors;
  for (const auto& item : j.at("batch").items()) {
    TESSERA_ASSIGN_OR_RETURN(at::Tensor t, tensor_of(item.value()));
    tensors.insert_or_assign(item.key(), t);
  }
  proto::NonTensorBatch columns;
  for (const auto& item : j.at("non_tensor_batch").items()) {
    TESSERA_ASSIGN_OR_RETURN(ColumnType type, column_type_of(item.value().at("type").get<std::string>()));
    TESSERA_ASSIGN_OR_RETURN(Column col, Column::from_json(item.value().at("values"), type));
    columns.insert_or_assign(item.key(), col);
  }
  return DataProto::from_dict(std::move(tensors), std::move(columns), j.at("meta_info"));
}

std::set<std::string> keys_of(const json& obj) {
  std::set<std::string> out;
  for (const auto& item : obj.items()) out.insert(item.key());
  return out;
}

template <class Dict>
std::set<std::string> keys_of_dict(const Dict& d) {
  std::set<std::string> out;
  for (const auto& kv : d) out.insert(kv.first);
  return out;
}

std::string row_ids(const DataProto& dp) {
  auto t = dp.tensor("row_id");
  if (!t.ok()) return "?";
  const at::Tensor ids = t->to(torch::kLong).contiguous();
  return fmt::format("[{}]", fmt::join(std::vector<int64_t>(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel()), ","));
}

std::string row_ids(const json& j) {
  if (!j.at("batch").contains("row_id")) return "?";
  std::vector<int64_t> ids;
  for (double v : j["batch"]["row_id"]["data"].get<std::vector<double>>()) ids.push_back(static_cast<int64_t>(v));
  return fmt::format("[{}]", fmt::join(ids, ","));
}

// ok when `got` holds exactly verl's `want` (keys as sets, dtypes, shapes, values, meta_info).
Status same_dp(const DataProto& got, const json& want, const std::string& what) {
  const int64_t want_size = want.at("size").get<int64_t>();
  if (got.size() != want_size) {
    return make_error(ErrorCode::internal, "{}: {} rows, verl has {} (row ids {} vs verl {})", what, got.size(),
                      want_size, row_ids(got), row_ids(want));
  }
  if (keys_of_dict(got.batch()) != keys_of(want.at("batch"))) {
    return make_error(ErrorCode::internal, "{}: batch keys {} differ from verl's {}", what,
                      fmt::join(keys_of_dict(got.batch()), ","), fmt::join(keys_of(want.at("batch")), ","));
  }
  for (const auto& kv : got.batch()) {
    const json& spec = want["batch"][kv.first];
    TESSERA_ASSIGN_OR_RETURN(at::Tensor expected, tensor_of(spec));
    const at::Tensor& t = kv.second;
    if (t.scalar_type() != expected.scalar_type()) {
      return make_error(ErrorCode::internal, "{}: tensor '{}' is {}, verl's is {}", what, kv.first,
                        c10::toString(t.scalar_type()), c10::toString(expected.scalar_type()));
    }
    if (t.sizes() != expected.sizes()) {
      return make_error(ErrorCode::internal, "{}: tensor '{}' has shape [{}], verl's [{}]", what, kv.first,
                        fmt::join(t.sizes(), "x"), fmt::join(expected.sizes(), "x"));
    }
    if (t.numel() > 0) {
      const double d =
          (t.to(torch::kCPU).to(torch::kFloat64) - expected.to(torch::kFloat64)).abs().max().item<double>();
      if (!(d <= kTolerance)) {
        return make_error(ErrorCode::internal, "{}: tensor '{}' off by {:.3e} (row ids {} vs verl {})", what,
                          kv.first, d, row_ids(got), row_ids(want));
      }
    }
  }
  if (keys_of_dict(got.non_tensor_batch()) != keys_of(want.at("non_tensor_batch"))) {
    return make_error(ErrorCode::internal, "{}: non_tensor_batch keys {} differ from verl's {}", what,
                      fmt::join(keys_of_dict(got.non_tensor_batch()), ","),
                      fmt::join(keys_of(want.at("non_tensor_batch")), ","));
  }
  for (const auto& kv : got.non_tensor_batch()) {
    const json& spec = want["non_tensor_batch"][kv.first];
    const std::string type = proto::to_string(kv.second.type());
    if (type != spec.at("type").get<std::string>()) {
      return make_error(ErrorCode::internal, "{}: column '{}' is {}, verl's is {}", what, kv.first, type,
                        spec.at("type").get<std::string>());
    }
    if (kv.second.to_json() != spec.at("values")) {
      return make_error(ErrorCode::internal, "{}: column '{}' is {}, verl's is {}", what, kv.first,
                        kv.second.to_json().dump(), spec.at("values").dump());
    }
  }
  if (got.meta_info() != want.at("meta_info")) {
    return make_error(ErrorCode::internal, "{}: meta_info {} differs from verl's {}", what, got.meta_info().dump(),
                      want.at("meta_info").dump());
  }
  return Status();
}

// Applies one recorded op to `state` (Tessera's DataProto) and compares every result with verl's.
Status replay_step(DataProto& state, const json& st, const std::string& op, const std::string& where) {
  {
    if (op == "chunk_concat") {
      const int64_t k = st.at("chunks").get<int64_t>();
      TESSERA_ASSIGN_OR_RETURN(std::vector<DataProto> chunks, state.chunk(k));
      if (chunks.size() != st.at("chunk_results").size()) {
        return make_error(ErrorCode::internal, "{}: chunk({}) gave {} pieces, verl {}", where, k, chunks.size(),
                          st["chunk_results"].size());
      }
      for (size_t j = 0; j < chunks.size(); ++j) {
        TESSERA_RETURN_IF_ERROR(same_dp(chunks[j], st["chunk_results"][j], fmt::format("{} chunk {}", where, j)));
      }
      std::vector<DataProto> ordered;
      for (const auto& o : st.at("order")) ordered.push_back(chunks.at(o.get<size_t>()));
      TESSERA_ASSIGN_OR_RETURN(state, DataProto::concat(ordered));
    } else if (op == "concat") {
      TESSERA_ASSIGN_OR_RETURN(DataProto other, dp_of(st.at("other")));
      const std::vector<DataProto> both{state, other};
      TESSERA_ASSIGN_OR_RETURN(state, DataProto::concat(both));
    } else if (op == "union") {
      TESSERA_ASSIGN_OR_RETURN(DataProto other, dp_of(st.at("other")));
      TESSERA_RETURN_IF_ERROR(state.union_(other));
    } else if (op == "repeat") {
      TESSERA_ASSIGN_OR_RETURN(state, state.repeat(st.at("times").get<int64_t>(), st.at("interleave").get<bool>()));
    } else if (op == "pad_unpad") {
      TESSERA_ASSIGN_OR_RETURN(auto padded, proto::pad_dataproto_to_divisor(state, st.at("divisor").get<int64_t>()));
      if (padded.second != st.at("pad_size").get<int64_t>()) {
        return make_error(ErrorCode::internal, "{}: pad_size {}, verl {}", where, padded.second,
                          st["pad_size"].get<int64_t>());
      }
      TESSERA_RETURN_IF_ERROR(same_dp(padded.first, st.at("padded"), where + " padded"));
      TESSERA_ASSIGN_OR_RETURN(DataProto unpadded, proto::unpad_dataproto(padded.first, padded.second));
      TESSERA_RETURN_IF_ERROR(same_dp(unpadded, st.at("unpadded"), where + " unpadded"));
      state = st.at("keep").get<std::string>() == "padded" ? padded.first : unpadded;
    } else if (op == "reorder") {
      const auto idx = st.at("indices").get<std::vector<int64_t>>();
      TESSERA_RETURN_IF_ERROR(state.reorder(torch::tensor(idx, torch::kLong)));
    } else if (op == "make_iterator") {
      const int64_t mbs = st.at("mini_batch_size").get<int64_t>();
      const int64_t epochs = st.at("epochs").get<int64_t>();
      const int64_t iter_seed = st.at("iter_seed").get<int64_t>();
      const bool shuffle = st.at("shuffle").get<bool>();
      TESSERA_ASSIGN_OR_RETURN(proto::DataProtoIterator it, state.make_iterator(mbs, epochs, iter_seed, shuffle));
      std::vector<DataProto> got;
      while (auto b = it.next()) got.push_back(std::move(*b));
      const json& want = st.at("batches");
      std::string got_rows, want_rows;
      for (const auto& b : got) got_rows += row_ids(b);
      for (const auto& b : want) want_rows += row_ids(b);
      const std::string params = fmt::format("make_iterator(mini_batch_size={}, epochs={}, seed={}, shuffle={})", mbs,
                                             epochs, iter_seed, shuffle);
      if (got.size() != want.size()) {
        return make_error(ErrorCode::internal, "{}: {} yielded {} batches, verl {} (rows {} vs verl {})", where,
                          params, got.size(), want.size(), got_rows, want_rows);
      }
      for (size_t b = 0; b < got.size(); ++b) {
        Status s = same_dp(got[b], want[b], fmt::format("{} batch {}", where, b));
        if (!s.ok()) {
          return make_error(ErrorCode::internal, "{} [{}; all batches' row ids: tessera {} vs verl {}]", s.message(),
                            params, got_rows, want_rows);
        }
      }
    } else {
      return make_error(ErrorCode::corrupt_data, "{}: unknown op", where);
    }
  }
  return same_dp(state, st.at("result"), where + " result");
}

// Replays one recorded sequence, op by op; errors name the op, the seed and the step.
Status replay(const json& seq) {
  const int64_t seed = seq.at("seed").get<int64_t>();
  TESSERA_ASSIGN_OR_RETURN(DataProto state, dp_of(seq.at("initial")));
  TESSERA_RETURN_IF_ERROR(same_dp(state, seq["initial"], fmt::format("dataproto seed {} initial", seed)));
  const json& steps = seq.at("steps");
  for (size_t i = 0; i < steps.size(); ++i) {
    const std::string op = steps[i].at("op").get<std::string>();
    const std::string where = fmt::format("op DataProto.{} seed {} step {}", op, seed, i);
    Status s = replay_step(state, steps[i], op, where);
    if (!s.ok()) return s.message().rfind(where, 0) == 0 ? s : s.with_context(where);
  }
  return Status();
}

TEST(VerlParity, DataProtoSequencesMatchVerl) {
  const Harness& h = harness();
  if (!h.skip.empty()) GTEST_SKIP() << h.skip;
  ASSERT_TRUE(h.error.empty()) << h.error;
  ASSERT_TRUE(h.doc.contains("dataproto") && h.doc["dataproto"].is_array());
  int matched = 0;
  size_t steps = 0;
  for (const auto& seq : h.doc["dataproto"]) {
    steps += seq.at("steps").size();
    Status s = Status();
    try {
      s = replay(seq);
    } catch (const std::exception& e) {
      s = make_error(ErrorCode::internal, "dataproto seed {}: threw {}", seq.at("seed").dump(), e.what());
    }
    EXPECT_TRUE(s.ok()) << s.message();
    if (s.ok()) ++matched;
  }
  fmt::print("[verl parity] DataProto: {}/{} sequences ({} ops) match verl {}\n", matched, h.doc["dataproto"].size(),
             steps, kVerlVersion);
  EXPECT_GT(h.doc["dataproto"].size(), 0u);
}

}  // namespace
}  // namespace tessera::algos::testing
