// ppo_trainer_fit.cpp: one fit() step in verl v0.5.0's order, and _validate (see ppo_trainer.hpp).
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <future>
#include <map>
#include <set>

#include "driver/config.hpp"
#include "driver/generations.hpp"
#include "driver/internal/ppo_state.hpp"
#include "workers/algos/losses.hpp"

namespace tessera::driver {
namespace {

using nlohmann::json;
using dispatch::Value;
using State = RayPPOTrainer::State;

const std::vector<std::string> kGenTensorKeys = {"input_ids", "attention_mask", "position_ids"};

// verl's gen_batch pop: the prompt tensors plus raw_prompt_ids and, when present, raw_prompt / index.
Result<proto::DataProto> pop_generation_keys(proto::DataProto& batch) {
  std::vector<std::string> non_tensor = {"raw_prompt_ids"};
  for (const char* k : {"multi_modal_data", "raw_prompt", "tools_kwargs", "interaction_kwargs", "index", "agent_name"}) {
    if (batch.column(k).ok()) non_tensor.push_back(k);
  }
  return batch.pop(kGenTensorKeys, non_tensor);
}

// Calls a DataProto method and returns its output with meta_info["metrics"] moved into `metrics`
// (timing_s/* entries into `timing` instead, as verl merges the worker's timing dict).
Result<proto::DataProto> call_proto(dispatch::WorkerGroup& wg, const std::string& method, const proto::DataProto& in,
                                    Metrics& metrics, TimingRaw& timing) {
  TESSERA_ASSIGN_OR_RETURN(Value v, wg.call(method, {Value(in)}));
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto out, v.as_proto(wg.name() + "." + method));
  json& meta = out.meta_info();
  if (meta.contains("metrics")) {
    json worker = meta["metrics"];
    meta.erase("metrics");
    json rest = json::object();
    for (auto& [k, val] : worker.items()) {
      if (k.rfind("timing_s/", 0) == 0 && val.is_number()) timing[k.substr(9)] = val.get<double>();
      else rest[k] = val;
    }
    TESSERA_RETURN_IF_ERROR(merge_worker_metrics(rest, metrics));
  }
  return out;
}

// Unions `part` (a worker output without meta_info) into `batch`.
Status union_output(proto::DataProto& batch, proto::DataProto part) {
  part.meta_info() = json::object();
  return batch.union_(part);
}

// "<step>-<row>"; a step's further generation batches (dynamic sampling) "<step>.<k>-<row>".
std::vector<std::string> step_uids(int64_t step, int64_t gen_index, int64_t rows) {
  const std::string prefix = gen_index > 0 ? fmt::format("{}.{}", step, gen_index) : std::to_string(step);
  std::vector<std::string> uids;
  for (int64_t i = 0; i < rows; ++i) uids.push_back(fmt::format("{}-{}", prefix, i));
  return uids;
}

// token_level_scores (and reward extra infos as columns) from the rule reward manager.
Status add_scores(State& s, proto::DataProto& batch, Result<RewardOutput> scored) {
  if (!scored.ok()) return scored.status();
  RewardOutput& r = *scored;
  TESSERA_RETURN_IF_ERROR(batch.set_tensor("token_level_scores", r.reward_tensor));
  s.reward_extra_keys.clear();
  for (auto& [key, values] : r.reward_extra_info) {
    TESSERA_RETURN_IF_ERROR(batch.set_column(key, proto::Column::jsons(values)));
    s.reward_extra_keys.push_back(key);
  }
  return Status();
}

// Per-sample scores as host numbers, for the JSON dumps (the driver's batch lives on the host).
std::vector<double> to_doubles(const at::Tensor& t) {
  at::Tensor c = t.to(torch::kCPU, torch::kFloat64).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

// verl's rollout_data_dir dump of a training step: decoded prompts and responses, scores, ground
// truths and the reward extra infos.
Status dump_rollout(const State& s, const proto::DataProto& batch, int64_t step) {
  TESSERA_ASSIGN_OR_RETURN(at::Tensor scores, batch.tensor("token_level_scores"));
  TESSERA_ASSIGN_OR_RETURN(Generations g, decode_generations(batch, *s.tokenizer, to_doubles(scores.sum(-1))));
  for (const auto& key : s.reward_extra_keys) {
    TESSERA_ASSIGN_OR_RETURN(proto::Column c, batch.column(key));
    auto& values = g.extra[key];
    for (int64_t i = 0; i < batch.size(); ++i) values.push_back(c.row_json(i));
  }
  return dump_generations(g, step, s.rollout_data_dir);
}

// verl's gen_max (ReMax): greedy rollouts of the same prompts, scored, as reward_baselines.
Status remax_baselines(const std::function<Result<proto::DataProto>(const proto::DataProto&, Metrics&, TimingRaw&)>& generate,
                       const State& s, const proto::DataProto& gen_batch,
                       proto::DataProto& batch, Metrics& metrics, TimingRaw& timing) {
  MarkedTimer timer("gen_max", timing);
  proto::DataProto baseline_in = gen_batch;
  baseline_in.meta_info()["do_sample"] = false;
  TimingRaw ignored;
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto out, generate(baseline_in, metrics, ignored));
  proto::DataProto scored = batch;
  TESSERA_RETURN_IF_ERROR(union_output(scored, out));
  TESSERA_ASSIGN_OR_RETURN(RewardOutput r, (*s.reward_fn)(scored));
  return batch.set_tensor("reward_baselines", r.reward_tensor.sum(-1));
}

}  // namespace

Result<proto::DataProto> RayPPOTrainer::rollout_batch(const std::vector<int64_t>& indices, int64_t gen_index,
                                                      Metrics& metrics, TimingRaw& timing) {
  State& s = *state_;
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto batch, s.train_dataset->collate(indices));
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto gen_batch, pop_generation_keys(batch));
  TESSERA_ASSIGN_OR_RETURN(gen_batch, gen_batch.repeat(s.n, /*interleave=*/true));
  gen_batch.meta_info()["global_steps"] = global_steps_;
  if (gen_index > 0) gen_batch.meta_info()["gen_batch"] = gen_index;  // seeds apart from the step's first
  // The trainer computes old_log_probs itself after the reward (verl v0.5.0's order; an on-policy
  // step none at all), so the seed worker's recompute inside generate_sequences would be a
  // wasted forward pass over the whole batch.
  gen_batch.meta_info()["recompute_log_prob"] = false;
  proto::DataProto gen_out;
  {
    MarkedTimer t("gen", timing);
    TESSERA_ASSIGN_OR_RETURN(gen_out, generate(gen_batch, metrics, timing));
  }
  if (s.adv_estimator == "remax") {
    auto gen = [this](const proto::DataProto& in, Metrics& m, TimingRaw& t) { return generate(in, m, t); };
    TESSERA_RETURN_IF_ERROR(remax_baselines(gen, s, gen_batch, batch, metrics, timing));
  }
  TESSERA_RETURN_IF_ERROR(
      batch.set_column("uid", proto::Column::strings(step_uids(global_steps_, gen_index, batch.size()))));
  TESSERA_ASSIGN_OR_RETURN(batch, batch.repeat(s.n, /*interleave=*/true));
  if (gen_out.tensor("old_log_probs").ok()) {  // computed after the reward, as verl v0.5.0 does
    TESSERA_RETURN_IF_ERROR(gen_out.pop(std::vector<std::string>{"old_log_probs"}).status());
  }
  TESSERA_RETURN_IF_ERROR(union_output(batch, gen_out));
  if (!batch.tensor("response_mask").ok()) {  // a multi-turn rollout's masks out the tool answers
    TESSERA_ASSIGN_OR_RETURN(at::Tensor response_mask, compute_response_mask(batch));
    TESSERA_RETURN_IF_ERROR(batch.set_tensor("response_mask", response_mask));
  }
  return batch;
}

Result<std::optional<std::vector<int64_t>>> RayPPOTrainer::next_training_batch() {
  State& s = *state_;
  TESSERA_ASSIGN_OR_RETURN(int64_t total_epochs, config_get<int64_t>(cfg_, "trainer.total_epochs"));
  for (int tries = 0; tries < 2 && s.epoch() < total_epochs; ++tries) {
    TESSERA_ASSIGN_OR_RETURN(std::optional<std::vector<int64_t>> indices, s.next_batch());
    if (indices) return indices;  // else the epoch ended, and next_batch() moved to the next one
  }
  return std::optional<std::vector<int64_t>>();
}

namespace {

// The value per row that DAPO's filter compares within a prompt's group: a reward extra-info
// column (numbers or booleans), or seq_reward / seq_final_reward, the summed token scores /
// rewards (the same here: KL in the reward is refused with the filter).
Result<std::vector<double>> filter_values(const proto::DataProto& batch, const std::string& metric) {
  if (metric == "seq_reward" || metric == "seq_final_reward") {
    TESSERA_ASSIGN_OR_RETURN(at::Tensor t, batch.tensor("token_level_scores"));
    return to_doubles(t.sum(-1));
  }
  auto column = batch.column(metric);
  if (!column.ok()) {
    return make_error(ErrorCode::invalid_argument,
                      "algorithm.filter_groups.metric = '{}' is not a reward extra-info key of this run's reward "
                      "manager (nor seq_reward / seq_final_reward)", metric);
  }
  std::vector<double> values;
  for (int64_t i = 0; i < batch.size(); ++i) {
    const json v = column->row_json(i);
    if (v.is_null()) {  // a row custom_reward_function.on_error=zero scored 0
      values.push_back(0.0);
      continue;
    }
    if (!v.is_number() && !v.is_boolean()) {
      return make_error(ErrorCode::invalid_argument,
                        "algorithm.filter_groups.metric = '{}': row {} holds {}, not a number", metric, i, v.dump());
    }
    values.push_back(v.is_boolean() ? (v.get<bool>() ? 1.0 : 0.0) : v.get<double>());
  }
  return values;
}

// verl's filter: the rows of the prompts (uids) whose values differ (np.std > 0 in verl, here
// without its rounding: a group of equal fractional scores can get a std of 1e-17 there), or
// with a single sample; and how many such prompts there are.
Result<std::pair<std::vector<int64_t>, int64_t>> varied_groups(const proto::DataProto& batch,
                                                               const std::vector<double>& values) {
  TESSERA_ASSIGN_OR_RETURN(proto::Column uid_column, batch.column("uid"));
  std::vector<std::string> uids;
  std::map<std::string, std::vector<double>> groups;
  for (int64_t i = 0; i < batch.size(); ++i) {
    uids.push_back(uid_column.row_json(i).get<std::string>());
    groups[uids.back()].push_back(values[static_cast<size_t>(i)]);
  }
  std::set<std::string> kept;
  for (const auto& [uid, v] : groups) {
    const bool differ = std::any_of(v.begin(), v.end(), [&](double x) { return x != v.front(); });
    if (differ || v.size() == 1) kept.insert(uid);
  }
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < batch.size(); ++i) {
    if (kept.count(uids[static_cast<size_t>(i)])) rows.push_back(i);
  }
  return std::make_pair(std::move(rows), static_cast<int64_t>(kept.size()));
}

}  // namespace

Result<std::optional<proto::DataProto>> RayPPOTrainer::dynamic_sampling(proto::DataProto first, Metrics& metrics,
                                                                         TimingRaw& timing) {
  State& s = *state_;
  std::vector<proto::DataProto> kept;
  int64_t prompts = 0, gen_batches = 0;
  proto::DataProto batch = std::move(first);
  while (true) {
    ++gen_batches;
    {
      MarkedTimer t("reward", timing);
      TESSERA_RETURN_IF_ERROR(add_rm_scores(batch, metrics, timing));
      TESSERA_RETURN_IF_ERROR(add_scores(s, batch, (*s.reward_fn)(batch)));
    }
    TESSERA_ASSIGN_OR_RETURN(std::vector<double> values, filter_values(batch, s.filter_metric));
    TESSERA_ASSIGN_OR_RETURN(auto groups, varied_groups(batch, values));
    prompts += groups.second;
    if (!groups.first.empty()) {
      TESSERA_ASSIGN_OR_RETURN(proto::DataProto rows, batch.index(groups.first));
      kept.push_back(std::move(rows));
    }
    if (prompts >= s.train_batch_size) break;
    if (s.max_num_gen_batches > 0 && gen_batches >= s.max_num_gen_batches) {
      return make_error(ErrorCode::resource_exhausted,
                        "dynamic sampling kept {} of data.train_batch_size = {} prompts in "
                        "algorithm.filter_groups.max_num_gen_batches = {} generation batches: the data may be too "
                        "hard (or too easy) for the model; raise it, or 0 for no limit",
                        prompts, s.train_batch_size, s.max_num_gen_batches);
    }
    TESSERA_ASSIGN_OR_RETURN(std::optional<std::vector<int64_t>> next, next_training_batch());
    if (!next) {
      spdlog::info("dynamic sampling: the data ran out with {} of data.train_batch_size = {} prompts kept after {} "
                   "generation batches; that batch is not trained on (as in verl)",
                   prompts, s.train_batch_size, gen_batches);
      return std::optional<proto::DataProto>();
    }
    Metrics more;
    TimingRaw more_timing;
    TESSERA_ASSIGN_OR_RETURN(batch, rollout_batch(*next, gen_batches, more, more_timing));
    fold_generation_metrics(more, more_timing, gen_batches, metrics, timing);
  }
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto all, proto::DataProto::concat(kept));
  metrics["train/num_gen_batches"] = static_cast<double>(gen_batches);
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto trimmed, all.slice(0, s.train_batch_rows));
  return std::optional<proto::DataProto>(std::move(trimmed));
}

Status RayPPOTrainer::add_rm_scores(proto::DataProto& batch, Metrics& metrics, TimingRaw& timing) {
  if (!rm_wg_) return Status();
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto rm, call_proto(*rm_wg_, "compute_rm_score", batch, metrics, timing));
  return union_output(batch, rm);
}

Result<std::optional<Metrics>> RayPPOTrainer::train_step(const std::vector<int64_t>& indices, bool is_last_step) {
  State& s = *state_;
  Metrics metrics;
  TimingRaw timing;
  std::future<Result<RewardOutput>> reward;  // reward_model.launch_reward_fn_async's scoring
  if (s.profiler) TESSERA_RETURN_IF_ERROR(s.profiler->begin(global_steps_));
  std::optional<MarkedTimer> step_timer(std::in_place, "step", timing);
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto batch, rollout_batch(indices, 0, metrics, timing));
  if (s.filter_groups) {  // scored per generation batch, then filtered and joined
    TESSERA_ASSIGN_OR_RETURN(std::optional<proto::DataProto> kept, dynamic_sampling(std::move(batch), metrics, timing));
    if (!kept) {  // out of data: no step; a trace begun for it is ended, unwritten
      if (s.profiler) (void)s.profiler->end(global_steps_);
      return std::optional<Metrics>();
    }
    batch = std::move(*kept);
  }
  if (s.balance) TESSERA_RETURN_IF_ERROR(balance_batch(batch, actor_rollout_wg_->world_size(), metrics));
  {
    TESSERA_ASSIGN_OR_RETURN(at::Tensor mask, batch.tensor("attention_mask"));
    at::Tensor lens = mask.sum(-1).to(torch::kInt64).contiguous();
    batch.meta_info()["global_token_num"] =
        std::vector<int64_t>(lens.data_ptr<int64_t>(), lens.data_ptr<int64_t>() + lens.numel());
  }
  batch.meta_info()["temperature"] = s.temperature;
  if (!s.filter_groups) {
    MarkedTimer t("reward", timing);
    TESSERA_RETURN_IF_ERROR(add_rm_scores(batch, metrics, timing));
    if (s.reward_async) {
      // The reward function reads its own copy of the batch (the tensors are shared, not written)
      // on a thread of its own while the workers compute; add_scores waits for it before "adv".
      reward = std::async(std::launch::async, [&s, scored = batch]() { return (*s.reward_fn)(scored); });
    } else {
      TESSERA_RETURN_IF_ERROR(add_scores(s, batch, (*s.reward_fn)(batch)));
    }
  }
  // Note [On-policy old log-probs] (workers/ppo/dp_actor.hpp): an on-policy update takes them from
  // its own forward. A step the actor does not update in (critic warm-up) keeps the pass for
  // actor/entropy.
  if (!s.skip_old_log_prob || batch.size() != s.train_batch_rows || s.critic_warmup > global_steps_) {
    MarkedTimer t("old_log_prob", timing);
    TESSERA_ASSIGN_OR_RETURN(proto::DataProto old, call_proto(*actor_rollout_wg_, "compute_log_prob", batch, metrics, timing));
    if (old.tensor("entropys").ok()) {
      TESSERA_ASSIGN_OR_RETURN(proto::DataProto ent, old.pop(std::vector<std::string>{"entropys"}));
      TESSERA_ASSIGN_OR_RETURN(at::Tensor e, ent.tensor("entropys"));
      TESSERA_ASSIGN_OR_RETURN(at::Tensor rmask, batch.tensor("response_mask"));
      TESSERA_ASSIGN_OR_RETURN(at::Tensor agg, algos::agg_loss(e, rmask.to(e.scalar_type()), s.loss_agg_mode));
      metrics["actor/entropy"] = agg.item<double>();
    }
    TESSERA_RETURN_IF_ERROR(union_output(batch, old));
  }
  if (dispatch::WorkerGroup* ref_group = s.ref_in_actor ? actor_rollout_wg_.get() : ref_wg_.get()) {
    MarkedTimer t("ref", timing);
    TESSERA_ASSIGN_OR_RETURN(proto::DataProto ref, call_proto(*ref_group, "compute_ref_log_prob", batch, metrics, timing));
    TESSERA_RETURN_IF_ERROR(union_output(batch, ref));
  }
  if (critic_wg_) {
    MarkedTimer t("values", timing);
    TESSERA_ASSIGN_OR_RETURN(proto::DataProto values, call_proto(*critic_wg_, "compute_values", batch, metrics, timing));
    TESSERA_RETURN_IF_ERROR(union_output(batch, values));
  }
  {
    MarkedTimer t("adv", timing);
    if (reward.valid()) TESSERA_RETURN_IF_ERROR(add_scores(s, batch, reward.get()));
    if (s.use_kl_in_reward) {
      const double beta = s.kl_ctrl->value();
      TESSERA_ASSIGN_OR_RETURN(double kl, apply_kl_penalty(batch, beta, s.kl_penalty));
      s.kl_ctrl->update(kl, batch.size());
      metrics["actor/reward_kl_penalty"] = kl;
      metrics["actor/reward_kl_penalty_coeff"] = beta;
    } else {
      TESSERA_ASSIGN_OR_RETURN(at::Tensor scores, batch.tensor("token_level_scores"));
      TESSERA_RETURN_IF_ERROR(batch.set_tensor("token_level_rewards", scores));
    }
    TESSERA_RETURN_IF_ERROR(compute_advantage(batch, s.adv_estimator, s.gamma, s.lam, s.norm_adv_by_std_in_grpo));
    if (s.use_pf_ppo) TESSERA_RETURN_IF_ERROR(pf_ppo_reweight(batch, s.pf_reweight_method, s.pf_weight_pow));
  }
  if (!s.rollout_data_dir.empty()) {
    MarkedTimer t("dump_rollout_generations", timing);
    TESSERA_RETURN_IF_ERROR(dump_rollout(s, batch, global_steps_));
  }
  if (critic_wg_) {
    MarkedTimer t("update_critic", timing);
    TESSERA_RETURN_IF_ERROR(call_proto(*critic_wg_, "update_critic", batch, metrics, timing).status());
  }
  if (s.critic_warmup <= global_steps_) {
    MarkedTimer t("update_actor", timing);
    batch.meta_info()["multi_turn"] = s.multi_turn;
    TESSERA_RETURN_IF_ERROR(call_proto(*actor_rollout_wg_, "update_actor", batch, metrics, timing).status());
    ++weights_version_;
  }
  // A curriculum sampler sees the step's batch before the next one is drawn, and before the
  // checkpoint, which then holds its state after this update (verl updates it after saving, so
  // a run resumed there misses the update).
  if (s.sampler) TESSERA_RETURN_IF_ERROR(s.sampler->update(batch));
  if (s.val_dataset && s.test_freq > 0 && (is_last_step || global_steps_ % s.test_freq == 0)) {
    MarkedTimer t("testing", timing);
    TESSERA_ASSIGN_OR_RETURN(Metrics val, validate());
    metrics.insert(val.begin(), val.end());
  }
  if (s.save_freq > 0 && (is_last_step || global_steps_ % s.save_freq == 0)) {
    MarkedTimer t("save_checkpoint", timing);
    TESSERA_RETURN_IF_ERROR(save_checkpoint());
  }
  step_timer.reset();
  if (s.profiler) {
    TESSERA_ASSIGN_OR_RETURN(std::vector<std::string> digest, s.profiler->end(global_steps_));
    if (options_.console != nullptr && !digest.empty()) {
      if (s.bar) s.bar->clear();
      for (const auto& line : digest) std::fprintf(options_.console, "tessera: %s\n", line.c_str());
      std::fflush(options_.console);
    }
  }
  metrics["training/global_step"] = static_cast<double>(global_steps_);
  TESSERA_ASSIGN_OR_RETURN(Metrics data, compute_data_metrics(batch, critic_wg_ != nullptr));
  TESSERA_ASSIGN_OR_RETURN(Metrics timing_m, compute_timing_metrics(batch, timing));
  TESSERA_ASSIGN_OR_RETURN(Metrics perf, compute_throughout_metrics(batch, timing, s.world_size));
  for (const Metrics* m : {&data, &timing_m, &perf}) metrics.insert(m->begin(), m->end());
  return std::optional<Metrics>(std::move(metrics));
}

Result<Metrics> RayPPOTrainer::validate() {
  State& s = *state_;
  if (!s.val_dataset) return make_error(ErrorCode::invalid_argument, "validate: data.val_files is not set");
  std::vector<int64_t> all(static_cast<size_t>(s.val_dataset->size()));
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto batch, s.val_dataset->collate(all));
  // verl's _validate: "we only do validation on rule-based rm" -- with a reward model enabled and
  // the first row's reward_model.style "model", validation returns no metrics.
  if (s.use_rm && batch.size() > 0) {
    TESSERA_ASSIGN_OR_RETURN(proto::Column rm_info, batch.column("reward_model"));
    const json first = rm_info.row_json(0);
    if (first.is_object() && first.value("style", json()) == json("model")) return Metrics{};
  }
  TESSERA_ASSIGN_OR_RETURN(batch, batch.repeat(s.val_n, /*interleave=*/true));
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto gen, pop_generation_keys(batch));
  json& meta = gen.meta_info();
  meta["eos_token_id"] = s.eos_token_id;
  meta["pad_token_id"] = s.pad_token_id;
  meta["recompute_log_prob"] = false;
  meta["do_sample"] = s.val_do_sample;
  meta["validate"] = true;
  meta["global_steps"] = global_steps_;
  TESSERA_ASSIGN_OR_RETURN(auto padded, gen.pad_to_divisor(generation_wg().world_size()));
  Metrics ignored;
  TimingRaw ignored_timing;
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto out,
                           generate(padded.first, ignored, ignored_timing));
  TESSERA_ASSIGN_OR_RETURN(out, out.unpad(padded.second));
  TESSERA_RETURN_IF_ERROR(union_output(batch, out));
  batch.meta_info()["validate"] = true;
  TESSERA_ASSIGN_OR_RETURN(RewardOutput r, (*s.val_reward_fn)(batch));
  std::map<std::string, std::vector<json>> infos = r.reward_extra_info;
  at::Tensor scores = r.reward_tensor.sum(-1).to(torch::kFloat64).contiguous();
  std::vector<json>& reward = infos["reward"];
  for (int64_t i = 0; i < scores.numel(); ++i) reward.push_back(scores.data_ptr<double>()[i]);
  TESSERA_ASSIGN_OR_RETURN(proto::Column sources, batch.column("data_source"));
  TESSERA_ASSIGN_OR_RETURN(at::Tensor prompts, batch.tensor("prompts"));
  std::vector<std::string> data_sources, inputs;
  for (int64_t i = 0; i < batch.size(); ++i) {
    const json ds = sources.row_json(i);
    data_sources.push_back(ds.is_string() ? ds.get<std::string>() : ds.dump());
    // verl groups samples by the decoded prompt text; the prompt ids identify it equally.
    at::Tensor row = prompts[i].contiguous();
    inputs.push_back(std::string(reinterpret_cast<const char*>(row.data_ptr()), row.numel() * row.element_size()));
  }
  if (!s.validation_data_dir.empty() || s.log_val_generations > 0) {
    TESSERA_ASSIGN_OR_RETURN(Generations g, decode_generations(batch, *s.tokenizer, to_doubles(scores)));
    for (const auto& [key, values] : r.reward_extra_info) g.extra[key] = values;
    if (!s.validation_data_dir.empty()) TESSERA_RETURN_IF_ERROR(dump_generations(g, global_steps_, s.validation_data_dir));
    if (options_.console != nullptr) {
      if (s.bar) s.bar->clear();
      for (const auto& line : val_generation_lines(g, s.log_val_generations)) {
        std::fprintf(options_.console, "%s\n", line.c_str());
      }
      std::fflush(options_.console);
    }
    if (s.log_val_generations > 0 && s.tracking) {  // verl's ValidationGenerationsLogger
      TESSERA_RETURN_IF_ERROR(s.tracking->log_generations(val_generation_samples(g, s.log_val_generations), global_steps_));
    }
  }
  TESSERA_ASSIGN_OR_RETURN(ValidationMetrics vm, process_validation_metrics(data_sources, inputs, infos));
  return validation_metric_dict(vm);
}

// Note [Split placement weight transfer] (workers/rollout/split_weights.hpp), driver side: per
// bucket one non-blocking export on the actor group, whose future the rollout group pulls peer to
// peer. Timed as verl's timing_s/reshard.
Status RayPPOTrainer::sync_rollout_weights(TimingRaw& timing) {
  if (synced_version_ == weights_version_) return Status();
  MarkedTimer t("reshard", timing);
  TESSERA_ASSIGN_OR_RETURN(Value plans, actor_rollout_wg_->call("rollout_weight_buckets", {}));
  if (!plans.is_list() || plans.list().empty() || !plans.list()[0].is_json() ||
      !plans.list()[0].json().value("buckets", json()).is_number_integer()) {
    return make_error(ErrorCode::internal, "rollout_weight_buckets: the actor group answered no bucket plan");
  }
  const int64_t buckets = plans.list()[0].json().at("buckets").get<int64_t>();
  for (int64_t b = 0; b < buckets; ++b) {
    TESSERA_ASSIGN_OR_RETURN(dispatch::FutureRef bucket,
                             actor_rollout_wg_->call_async("export_rollout_weights",
                                                           {Value(json{{"bucket", b}, {"version", weights_version_}})}));
    TESSERA_RETURN_IF_ERROR(rollout_wg_->call("load_rollout_weights", {dispatch::make_future(bucket)}).status());
  }
  synced_version_ = weights_version_;
  return Status();
}

Result<proto::DataProto> RayPPOTrainer::generate(const proto::DataProto& batch, Metrics& metrics, TimingRaw& timing) {
  if (rollout_wg_) TESSERA_RETURN_IF_ERROR(sync_rollout_weights(timing));
  return call_proto(generation_wg(), "generate_sequences", batch, metrics, timing);
}

}  // namespace tessera::driver
