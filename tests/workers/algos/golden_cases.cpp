#include "tests/workers/algos/golden_cases.hpp"

#include <cmath>
#include <functional>

#include <torch/torch.h>

#include "workers/algos/advantage.hpp"
#include "workers/algos/kl.hpp"
#include "workers/algos/losses.hpp"
#include "workers/algos/policy_loss.hpp"

namespace tessera::algos::testing {

using nlohmann::json;

Result<json> CaseReader::get(const std::string& key) {
  if (!c_.contains(key)) return make_error(ErrorCode::corrupt_data, "case has no field '{}'", key);
  used_.insert(key);
  return c_.at(key);
}

std::vector<std::string> CaseReader::unused() const {
  std::vector<std::string> out;
  for (const auto& item : c_.items()) {
    if (!used_.count(item.key())) out.push_back(item.key());
  }
  return out;
}

namespace {

void flatten(const json& j, std::vector<double>& out, std::vector<int64_t>& shape, size_t depth) {
  if (!j.is_array()) {
    out.push_back(j.get<double>());
    return;
  }
  if (shape.size() == depth) shape.push_back(static_cast<int64_t>(j.size()));
  for (const auto& e : j) flatten(e, out, shape, depth + 1);
}

Result<at::Tensor> tensor(CaseReader& r, const std::string& key) {
  TESSERA_ASSIGN_OR_RETURN(json j, r.get(key));
  std::vector<double> flat;
  std::vector<int64_t> shape;
  flatten(j, flat, shape, 0);
  return torch::tensor(flat, torch::kFloat64).reshape(shape);
}

// Max |actual - expected|; shape mismatch is an error, NaN anywhere counts as infinite.
Result<double> diff(const at::Tensor& actual, CaseReader& r, const std::string& key) {
  TESSERA_ASSIGN_OR_RETURN(at::Tensor expected, tensor(r, key));
  return max_abs_diff(actual, expected, key);
}

Result<Diffs> diffs_of(CaseReader& r, const std::vector<std::pair<std::string, at::Tensor>>& outputs) {
  Diffs out;
  for (const auto& [name, t] : outputs) {
    TESSERA_ASSIGN_OR_RETURN(double d, diff(t, r, name));
    out.emplace_back(name, d);
  }
  return out;
}

Result<Diffs> adv_diffs(CaseReader& r, const Result<AdvantageReturn>& res) {
  if (!res.ok()) return res.status();
  return diffs_of(r, {{"advantages", res->advantages}, {"returns", res->returns}});
}

Result<Diffs> gae(CaseReader& r) {
  TESSERA_ASSIGN_OR_RETURN(at::Tensor rewards, tensor(r, "token_level_rewards"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor values, tensor(r, "values"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor mask, tensor(r, "response_mask"));
  TESSERA_ASSIGN_OR_RETURN(double gamma, r.value<double>("gamma"));
  TESSERA_ASSIGN_OR_RETURN(double lam, r.value<double>("lam"));
  return adv_diffs(r, compute_gae_advantage_return(rewards, values, mask, gamma, lam));
}

// grpo / grpo_passk: (rewards, mask, index, epsilon, norm_adv_by_std_in_grpo).
template <Result<AdvantageReturn> (*F)(const at::Tensor&, const at::Tensor&, const std::vector<std::string>&, double,
                                       bool)>
Result<Diffs> grpo_like(CaseReader& r) {
  TESSERA_ASSIGN_OR_RETURN(at::Tensor rewards, tensor(r, "token_level_rewards"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor mask, tensor(r, "response_mask"));
  TESSERA_ASSIGN_OR_RETURN(auto index, r.value<std::vector<std::string>>("index"));
  TESSERA_ASSIGN_OR_RETURN(double epsilon, r.value<double>("epsilon"));
  bool norm = true;
  if (r.has("norm_adv_by_std_in_grpo")) {
    TESSERA_ASSIGN_OR_RETURN(json j, r.get("norm_adv_by_std_in_grpo"));
    norm = j.get<bool>();
  }
  return adv_diffs(r, F(rewards, mask, index, epsilon, norm));
}

// rloo / opo / reinforce_plus_plus_baseline / gpg: (rewards, mask, index, epsilon).
Result<Diffs> grouped(CaseReader& r, const std::function<Result<AdvantageReturn>(
                                         const at::Tensor&, const at::Tensor&, const std::vector<std::string>&, double)>& f) {
  TESSERA_ASSIGN_OR_RETURN(at::Tensor rewards, tensor(r, "token_level_rewards"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor mask, tensor(r, "response_mask"));
  TESSERA_ASSIGN_OR_RETURN(auto index, r.value<std::vector<std::string>>("index"));
  double epsilon = 1e-6;
  if (r.has("epsilon")) {
    TESSERA_ASSIGN_OR_RETURN(epsilon, r.value<double>("epsilon"));
  }
  return adv_diffs(r, f(rewards, mask, index, epsilon));
}

Result<Diffs> rloo(CaseReader& r) { return grouped(r, &compute_rloo_outcome_advantage); }
Result<Diffs> opo(CaseReader& r) { return grouped(r, &compute_opo_outcome_advantage); }
Result<Diffs> rfpp_baseline(CaseReader& r) {
  return grouped(r, &compute_reinforce_plus_plus_baseline_outcome_advantage);
}
Result<Diffs> gpg(CaseReader& r) {
  return grouped(r, [](const at::Tensor& rw, const at::Tensor& m, const std::vector<std::string>& ix, double eps) {
    return compute_gpg_outcome_advantage(rw, m, ix, eps);
  });
}

Result<Diffs> rfpp(CaseReader& r) {
  TESSERA_ASSIGN_OR_RETURN(at::Tensor rewards, tensor(r, "token_level_rewards"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor mask, tensor(r, "response_mask"));
  TESSERA_ASSIGN_OR_RETURN(double gamma, r.value<double>("gamma"));
  return adv_diffs(r, compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma));
}

Result<Diffs> remax(CaseReader& r) {
  TESSERA_ASSIGN_OR_RETURN(at::Tensor rewards, tensor(r, "token_level_rewards"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor baselines, tensor(r, "reward_baselines"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor mask, tensor(r, "response_mask"));
  return adv_diffs(r, compute_remax_outcome_advantage(rewards, baselines, mask));
}

Result<PolicyLossConfig> policy_config(CaseReader& r) {
  PolicyLossConfig config;
  for (const char* key : {"clip_ratio", "cliprange"}) {
    if (r.has(key)) { TESSERA_ASSIGN_OR_RETURN(config.clip_ratio, r.value<double>(key)); }
  }
  for (const char* key : {"clip_ratio_low", "cliprange_low"}) {
    if (r.has(key)) { TESSERA_ASSIGN_OR_RETURN(config.clip_ratio_low, r.value<double>(key)); }
  }
  for (const char* key : {"clip_ratio_high", "cliprange_high"}) {
    if (r.has(key)) { TESSERA_ASSIGN_OR_RETURN(config.clip_ratio_high, r.value<double>(key)); }
  }
  if (r.has("clip_ratio_c")) { TESSERA_ASSIGN_OR_RETURN(config.clip_ratio_c, r.value<double>("clip_ratio_c")); }
  return config;
}

// Policy loss through the registry; loss_mode defaults to vanilla (verl's compute_policy_loss).
Result<Diffs> policy_loss_mode(CaseReader& r, std::string loss_mode) {
  TESSERA_ASSIGN_OR_RETURN(at::Tensor old_log_prob, tensor(r, "old_log_prob"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor log_prob, tensor(r, "log_prob"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor advantages, tensor(r, "advantages"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor mask, tensor(r, "response_mask"));
  std::string agg_mode = "token-mean";
  if (r.has("loss_agg_mode")) { TESSERA_ASSIGN_OR_RETURN(agg_mode, r.value<std::string>("loss_agg_mode")); }
  if (r.has("loss_mode")) { TESSERA_ASSIGN_OR_RETURN(loss_mode, r.value<std::string>("loss_mode")); }
  TESSERA_ASSIGN_OR_RETURN(PolicyLossConfig config, policy_config(r));
  TESSERA_ASSIGN_OR_RETURN(PolicyLossFn fn, get_policy_loss_fn(loss_mode));
  TESSERA_ASSIGN_OR_RETURN(PolicyLossOutput out, fn(old_log_prob, log_prob, advantages, mask, agg_mode, config));
  return diffs_of(r, {{"pg_loss", out.pg_loss},
                      {"pg_clipfrac", out.pg_clipfrac},
                      {"ppo_kl", out.ppo_kl},
                      {"pg_clipfrac_lower", out.pg_clipfrac_lower}});
}

Result<Diffs> policy_loss(CaseReader& r) { return policy_loss_mode(r, "vanilla"); }
Result<Diffs> policy_loss_gpg(CaseReader& r) { return policy_loss_mode(r, "gpg"); }

Result<Diffs> agg(CaseReader& r) {
  TESSERA_ASSIGN_OR_RETURN(at::Tensor loss_mat, tensor(r, "loss_mat"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor loss_mask, tensor(r, "loss_mask"));
  TESSERA_ASSIGN_OR_RETURN(std::string mode, r.value<std::string>("loss_agg_mode"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor loss, agg_loss(loss_mat, loss_mask, mode));
  return diffs_of(r, {{"loss", loss}});
}

Result<Diffs> value_loss(CaseReader& r) {
  TESSERA_ASSIGN_OR_RETURN(at::Tensor vpreds, tensor(r, "vpreds"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor returns, tensor(r, "returns"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor values, tensor(r, "values"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor mask, tensor(r, "response_mask"));
  TESSERA_ASSIGN_OR_RETURN(double cliprange_value, r.value<double>("cliprange_value"));
  std::string mode = "token-mean";
  if (r.has("loss_agg_mode")) { TESSERA_ASSIGN_OR_RETURN(mode, r.value<std::string>("loss_agg_mode")); }
  // "returns" is both an input and verl's argument name; it is not an output here.
  TESSERA_ASSIGN_OR_RETURN(ValueLossOutput out, compute_value_loss(vpreds, returns, values, mask, cliprange_value, mode));
  return diffs_of(r, {{"vf_loss", out.vf_loss}, {"vf_clipfrac", out.vf_clipfrac}});
}

Result<Diffs> kl(CaseReader& r) {
  TESSERA_ASSIGN_OR_RETURN(at::Tensor logprob, tensor(r, "logprob"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor ref_logprob, tensor(r, "ref_logprob"));
  TESSERA_ASSIGN_OR_RETURN(std::string type, r.value<std::string>("kl_penalty"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor out, kl_penalty(logprob, ref_logprob, type));
  return diffs_of(r, {{"kl", out}});
}

Result<Diffs> rewards(CaseReader& r) {
  TESSERA_ASSIGN_OR_RETURN(at::Tensor scores, tensor(r, "token_level_scores"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor old_log_prob, tensor(r, "old_log_prob"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor ref_log_prob, tensor(r, "ref_log_prob"));
  TESSERA_ASSIGN_OR_RETURN(double kl_ratio, r.value<double>("kl_ratio"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor out, compute_rewards(scores, old_log_prob, ref_log_prob, kl_ratio));
  return diffs_of(r, {{"rewards", out}});
}

// Feeds `updates` ({current_kl, n_steps, value}) and reports the worst |value| difference.
Result<Diffs> run_controller(CaseReader& r, KLController& ctrl) {
  TESSERA_ASSIGN_OR_RETURN(json updates, r.get("updates"));
  double worst = 0.0;
  for (const auto& u : updates) {
    ctrl.update(u.at("current_kl").get<double>(), u.at("n_steps").get<int64_t>());
    const double d = std::abs(ctrl.value() - u.at("value").get<double>());
    worst = std::isnan(d) ? INFINITY : std::max(worst, d);
  }
  return Diffs{{"value", worst}};
}

Result<Diffs> adaptive_kl(CaseReader& r) {
  TESSERA_ASSIGN_OR_RETURN(double init, r.value<double>("init_kl_coef"));
  TESSERA_ASSIGN_OR_RETURN(double target, r.value<double>("target_kl"));
  TESSERA_ASSIGN_OR_RETURN(json horizon, r.get("horizon"));
  AdaptiveKLController ctrl(init, target, horizon.get<int64_t>());
  return run_controller(r, ctrl);
}

Result<Diffs> fixed_kl(CaseReader& r) {
  TESSERA_ASSIGN_OR_RETURN(double coef, r.value<double>("kl_coef"));
  FixedKLController ctrl(coef);
  return run_controller(r, ctrl);
}

}  // namespace

Result<double> max_abs_diff(const at::Tensor& actual, const at::Tensor& expected, const std::string& key) {
  if (actual.sizes() != expected.sizes()) {
    return make_error(ErrorCode::internal, "output '{}' has shape [{}] but verl's has [{}]", key,
                      fmt::join(actual.sizes(), "x"), fmt::join(expected.sizes(), "x"));
  }
  if (actual.numel() == 0) return 0.0;
  const double d = (actual.detach().to(torch::kFloat64) - expected.to(torch::kFloat64)).abs().max().item<double>();
  return std::isnan(d) ? INFINITY : d;
}

const std::map<std::string, CaseHandler>& golden_handlers() {
  static const std::map<std::string, CaseHandler> table = {
      {"compute_gae_advantage_return", &gae},
      {"compute_grpo_outcome_advantage", &grpo_like<&compute_grpo_outcome_advantage>},
      {"compute_grpo_passk_outcome_advantage", &grpo_like<&compute_grpo_passk_outcome_advantage>},
      {"compute_rloo_outcome_advantage", &rloo},
      {"compute_opo_outcome_advantage", &opo},
      {"compute_reinforce_plus_plus_baseline_outcome_advantage", &rfpp_baseline},
      {"compute_reinforce_plus_plus_outcome_advantage", &rfpp},
      {"compute_remax_outcome_advantage", &remax},
      {"compute_gpg_outcome_advantage", &gpg},
      {"compute_policy_loss", &policy_loss},
      {"compute_policy_loss_vanilla", &policy_loss},
      {"compute_policy_loss_gpg", &policy_loss_gpg},
      {"agg_loss", &agg},
      {"compute_value_loss", &value_loss},
      {"kl_penalty", &kl},
      {"compute_rewards", &rewards},
      {"AdaptiveKLController", &adaptive_kl},
      {"FixedKLController", &fixed_kl},
  };
  return table;
}

}  // namespace tessera::algos::testing
