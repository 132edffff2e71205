// ppo_trainer_state.cpp: make_ppo_state (see internal/ppo_state.hpp).
#include <spdlog/spdlog.h>

#include "driver/config.hpp"
#include "driver/internal/ppo_state.hpp"
#include "driver/python_dataset.hpp"
#include "driver/python_reward.hpp"

namespace tessera::driver {
namespace {

using nlohmann::json;
using State = RayPPOTrainer::State;

Status read_flags(const json& cfg, State& s) {
  TESSERA_ASSIGN_OR_RETURN(s.adv_estimator, config_get<std::string>(cfg, "algorithm.adv_estimator"));
  TESSERA_ASSIGN_OR_RETURN(s.use_kl_in_reward, config_get<bool>(cfg, "algorithm.use_kl_in_reward"));
  TESSERA_ASSIGN_OR_RETURN(s.kl_penalty, config_get<std::string>(cfg, "algorithm.kl_penalty"));
  TESSERA_ASSIGN_OR_RETURN(s.gamma, config_get<double>(cfg, "algorithm.gamma"));
  TESSERA_ASSIGN_OR_RETURN(s.lam, config_get<double>(cfg, "algorithm.lam"));
  TESSERA_ASSIGN_OR_RETURN(s.norm_adv_by_std_in_grpo, config_get<bool>(cfg, "algorithm.norm_adv_by_std_in_grpo"));
  TESSERA_ASSIGN_OR_RETURN(s.use_rm, config_get<bool>(cfg, "reward_model.enable"));
  TESSERA_ASSIGN_OR_RETURN(s.balance, config_get<bool>(cfg, "trainer.balance_batch"));
  TESSERA_ASSIGN_OR_RETURN(s.critic_warmup, config_get<int64_t>(cfg, "trainer.critic_warmup"));
  TESSERA_ASSIGN_OR_RETURN(s.test_freq, config_get<int64_t>(cfg, "trainer.test_freq"));
  TESSERA_ASSIGN_OR_RETURN(s.save_freq, config_get<int64_t>(cfg, "trainer.save_freq"));
  TESSERA_ASSIGN_OR_RETURN(int64_t nnodes, config_get<int64_t>(cfg, "trainer.nnodes"));
  TESSERA_ASSIGN_OR_RETURN(int64_t per_node, config_get<int64_t>(cfg, "trainer.n_gpus_per_node"));
  s.world_size = nnodes * per_node;
  TESSERA_ASSIGN_OR_RETURN(s.n, config_get<int64_t>(cfg, "actor_rollout_ref.rollout.n"));
  TESSERA_ASSIGN_OR_RETURN(s.temperature, config_get<double>(cfg, "actor_rollout_ref.rollout.temperature"));
  TESSERA_ASSIGN_OR_RETURN(s.val_n, config_get<int64_t>(cfg, "actor_rollout_ref.rollout.val_kwargs.n"));
  TESSERA_ASSIGN_OR_RETURN(s.val_do_sample, config_get<bool>(cfg, "actor_rollout_ref.rollout.val_kwargs.do_sample"));
  TESSERA_ASSIGN_OR_RETURN(s.loss_agg_mode, config_get<std::string>(cfg, "actor_rollout_ref.actor.loss_agg_mode"));
  TESSERA_ASSIGN_OR_RETURN(s.seed, config_get_or<int64_t>(cfg, "data.seed", 1));
  for (auto [key, out] : {std::pair{"trainer.rollout_data_dir", &s.rollout_data_dir},
                          std::pair{"trainer.validation_data_dir", &s.validation_data_dir}}) {
    TESSERA_ASSIGN_OR_RETURN(auto dir, config_get<std::optional<std::string>>(cfg, key));
    *out = dir.value_or("");
  }
  TESSERA_ASSIGN_OR_RETURN(s.log_val_generations, config_get<int64_t>(cfg, "trainer.log_val_generations"));
  TESSERA_ASSIGN_OR_RETURN(s.profiler, StepProfiler::from_config(cfg));
  TESSERA_ASSIGN_OR_RETURN(s.use_pf_ppo, config_get<bool>(cfg, "algorithm.use_pf_ppo"));
  TESSERA_ASSIGN_OR_RETURN(s.pf_reweight_method, config_get<std::string>(cfg, "algorithm.pf_ppo.reweight_method"));
  TESSERA_ASSIGN_OR_RETURN(s.pf_weight_pow, config_get<double>(cfg, "algorithm.pf_ppo.weight_pow"));
  s.use_critic = need_critic(cfg);
  s.use_ref = need_reference_policy(cfg);
  TESSERA_ASSIGN_OR_RETURN(int64_t lora_rank, config_get_or<int64_t>(cfg, "actor_rollout_ref.model.lora_rank", 0));
  s.ref_in_actor = s.use_ref && lora_rank > 0;
  TESSERA_ASSIGN_OR_RETURN(s.multi_turn, config_get<bool>(cfg, "actor_rollout_ref.rollout.multi_turn.enable"));
  TESSERA_ASSIGN_OR_RETURN(s.reward_async, config_get<bool>(cfg, "reward_model.launch_reward_fn_async"));
  TESSERA_ASSIGN_OR_RETURN(bool skip, config_get<bool>(cfg, "trainer.skip_on_policy_old_log_prob"));
  TESSERA_ASSIGN_OR_RETURN(int64_t epochs, config_get<int64_t>(cfg, "actor_rollout_ref.actor.ppo_epochs"));
  TESSERA_ASSIGN_OR_RETURN(int64_t mini, config_get<int64_t>(cfg, "actor_rollout_ref.actor.ppo_mini_batch_size"));
  TESSERA_ASSIGN_OR_RETURN(int64_t train_batch, config_get<int64_t>(cfg, "data.train_batch_size"));
  // A curriculum sampler's update reads verl's batch, old_log_probs included.
  const json* sampler = config_find(cfg, "data.sampler.class_path");
  const bool has_sampler = sampler != nullptr && !sampler->is_null();
  s.skip_old_log_prob = skip && !s.use_kl_in_reward && !has_sampler && epochs == 1 && mini == train_batch;
  s.train_batch_rows = train_batch * s.n;
  s.train_batch_size = train_batch;
  TESSERA_ASSIGN_OR_RETURN(s.filter_groups, config_get<bool>(cfg, "algorithm.filter_groups.enable"));
  if (s.filter_groups) {
    TESSERA_ASSIGN_OR_RETURN(s.filter_metric, config_get<std::string>(cfg, "algorithm.filter_groups.metric"));
    TESSERA_ASSIGN_OR_RETURN(s.max_num_gen_batches,
                             config_get<int64_t>(cfg, "algorithm.filter_groups.max_num_gen_batches"));
  }
  if (s.adv_estimator == "remax" && s.n != 1) {
    return make_error(ErrorCode::unimplemented,
                      "algorithm.adv_estimator=remax with actor_rollout_ref.rollout.n={}: only n=1 is supported "
                      "(verl v0.5.0 unions the un-repeated batch with the baseline generation)", s.n);
  }
  return Status();
}

Status load_data(const json& cfg, State& s) {
  TESSERA_ASSIGN_OR_RETURN(auto tok_path, config_get<std::optional<std::string>>(cfg, "data.tokenizer"));
  TESSERA_ASSIGN_OR_RETURN(std::string model_path, config_get<std::string>(cfg, "actor_rollout_ref.model.path"));
  bool corrected = false;
  TESSERA_ASSIGN_OR_RETURN(tokenizer::Tokenizer tok,
                           tokenizer::Tokenizer::from_dir_as_verl(tok_path.value_or(model_path), &corrected));
  if (corrected) spdlog::warn("{}: gemma-2-2b-it's eos token set to <end_of_turn>, as verl's hf_tokenizer does", tok.source());
  TESSERA_ASSIGN_OR_RETURN(int32_t pad, dataset_pad_id(tok));
  const auto eos = tok.eos_token_id();
  if (!eos) return make_error(ErrorCode::invalid_argument, "{}: the tokenizer has no eos_token", tok.source());
  s.eos_token_id = *eos;
  s.pad_token_id = pad;
  TESSERA_ASSIGN_OR_RETURN(auto custom_cls, config_get_or<std::optional<std::string>>(cfg, "data.custom_cls.path",
                                                                                       std::nullopt));
  // The user's class truncates by its own rules: data.truncation is its to read.
  json dataset_cfg = cfg;
  if (custom_cls) dataset_cfg["data"]["truncation"] = "error";
  TESSERA_ASSIGN_OR_RETURN(RLHFDatasetOptions opts, RLHFDatasetOptions::from_config(dataset_cfg));
  if (custom_cls) {  // verl's create_rl_dataset with the user's class, for both sets
    TESSERA_ASSIGN_OR_RETURN(PythonDatasetOptions po, PythonDatasetOptions::from_config(cfg));
    auto read = [&](const std::string& files_key) -> Result<RLHFDataset> {
      TESSERA_ASSIGN_OR_RETURN(auto rows, read_python_dataset(cfg, files_key, po, opts.max_prompt_length));
      return RLHFDataset::from_rows(std::move(rows), tok, opts);
    };
    TESSERA_RETURN_IF_ERROR(load_custom_train_and_val(cfg, read, s.train_dataset, s.val_dataset));
  } else {
    TESSERA_RETURN_IF_ERROR(load_train_and_val(cfg, tok, opts, s.train_dataset, s.val_dataset));
  }
  DataLoaderOptions lo;
  // verl's _create_dataloader: data.gen_batch_size prompts a batch (DAPO's recipe sets it).
  TESSERA_ASSIGN_OR_RETURN(lo.batch_size, config_get<int64_t>(cfg, "data.gen_batch_size"));
  TESSERA_ASSIGN_OR_RETURN(lo.shuffle, config_get<bool>(cfg, "data.shuffle"));
  lo.drop_last = true;
  lo.seed = static_cast<uint64_t>(s.seed);
  TESSERA_ASSIGN_OR_RETURN(StatefulDataLoader loader, StatefulDataLoader::create(s.train_dataset->size(), lo));
  s.train_loader.emplace(std::move(loader));
  if (config_find(cfg, "data.sampler.class_path") != nullptr && !config_find(cfg, "data.sampler.class_path")->is_null()) {
    TESSERA_ASSIGN_OR_RETURN(s.sampler, PythonSampler::start(cfg, s.train_dataset->size(), lo.batch_size));
  }
  TESSERA_ASSIGN_OR_RETURN(RewardManagerOptions ro, reward_manager_options(cfg));
  TESSERA_ASSIGN_OR_RETURN(PythonRewardOptions po, python_reward_options(cfg));
  if (!po.path.empty()) {  // verl's custom_reward_function: every data_source is scored by it
    TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<PythonRewardPool> pool, PythonRewardPool::start(po));
    ro.batch_scorer = [pool](const std::vector<ScoreRequest>& rows) { return pool->score(rows); };
  } else if (!s.use_rm) {
    // Every row's data_source (the column data.reward_fn_key names) needs a scorer, known before
    // the first step: a native one, or verl's Python one (then verl's own code scores those rows),
    // or the row is named here.
    const ScorerRegistry builtins = ScorerRegistry::with_builtins();
    const std::string& key = ro.reward_fn_key;
    std::string python_source;
    for (const std::optional<RLHFDataset>* ds : {&s.train_dataset, &s.val_dataset}) {
      if (!ds->has_value()) continue;
      for (int64_t i = 0; i < (**ds).size(); ++i) {
        const RLHFRow& row = (**ds).row(i);
        std::string source = key == "data_source" ? row.data_source : key == "ability" ? row.ability : std::string();
        if (key != "data_source" && key != "ability") {
          const json* v = row.columns.contains(key) ? &row.columns.at(key) : nullptr;
          if (v == nullptr || !v->is_string()) {
            return make_error(ErrorCode::invalid_argument, "{}: data.reward_fn_key = {}: the row's '{}' must be a "
                              "string, got {}", row.source, key, key, v ? v->dump().substr(0, 60) : "nothing");
          }
          source = v->get<std::string>();
        }
        if (builtins.find(source).ok()) continue;
        if (is_verl_python_source(source)) {
          python_source = source;
          continue;
        }
        return make_error(ErrorCode::not_found, "{}: {}; or score it with custom_reward_function.path", row.source,
                          builtins.find(source).status().message());
      }
    }
    if (!python_source.empty()) {
      TESSERA_ASSIGN_OR_RETURN(SandboxFusionOptions sandbox, sandbox_fusion_options(cfg));
      TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<PythonRewardPool> pool, start_verl_scorer_pool(po, python_source, sandbox));
      ro.fallback_scorer = [pool](const std::vector<ScoreRequest>& rows) { return pool->score(rows); };
    }
  }
  s.reward_fn = std::make_unique<NaiveRewardManager>(tok, ScorerRegistry::with_builtins(), ro);
  s.val_reward_fn = std::make_unique<NaiveRewardManager>(tok, ScorerRegistry::with_builtins(), ro);
  s.tokenizer.emplace(std::move(tok));
  return Status();
}

Status total_steps(const json& cfg, State& s) {
  TESSERA_ASSIGN_OR_RETURN(int64_t epochs, config_get<int64_t>(cfg, "trainer.total_epochs"));
  s.total_training_steps = s.batches_per_epoch() * epochs;
  TESSERA_ASSIGN_OR_RETURN(auto fixed, config_get<std::optional<int64_t>>(cfg, "trainer.total_training_steps"));
  if (fixed) s.total_training_steps = *fixed;
  if (s.total_training_steps < 1) {
    return make_error(ErrorCode::invalid_argument, "trainer.total_training_steps: {} (dataloader of {} batches x {} epochs)",
                      s.total_training_steps, s.batches_per_epoch(), epochs);
  }
  return Status();
}

Status make_services(const json& cfg, std::FILE* console, State& s) {
  if (s.use_kl_in_reward) {
    algos::KLControlConfig kc;
    TESSERA_ASSIGN_OR_RETURN(kc.type, config_get<std::string>(cfg, "algorithm.kl_ctrl.type"));
    TESSERA_ASSIGN_OR_RETURN(kc.kl_coef, config_get<double>(cfg, "algorithm.kl_ctrl.kl_coef"));
    TESSERA_ASSIGN_OR_RETURN(kc.horizon, config_get<int64_t>(cfg, "algorithm.kl_ctrl.horizon"));
    TESSERA_ASSIGN_OR_RETURN(kc.target_kl, config_get<double>(cfg, "algorithm.kl_ctrl.target_kl"));
    TESSERA_ASSIGN_OR_RETURN(s.kl_ctrl, algos::get_kl_controller(kc));
  }
  TESSERA_ASSIGN_OR_RETURN(Tracking tracking, Tracking::from_config(cfg, console));
  s.tracking.emplace(std::move(tracking));
  TESSERA_ASSIGN_OR_RETURN(CheckpointOptions co, CheckpointOptions::from_config(cfg));
  s.ckpt.emplace(std::move(co));
  return Status();
}

}  // namespace

Result<std::unique_ptr<RayPPOTrainer::State>> make_ppo_state(const json& cfg, std::FILE* console) {
  auto s = std::make_unique<State>();
  TESSERA_RETURN_IF_ERROR(read_flags(cfg, *s));
  TESSERA_RETURN_IF_ERROR(load_data(cfg, *s));
  TESSERA_RETURN_IF_ERROR(total_steps(cfg, *s));
  TESSERA_RETURN_IF_ERROR(make_services(cfg, console, *s));
  return s;
}

}  // namespace tessera::driver
