// ppo_trainer.cpp: RayPPOTrainer construction, placement and fit() (see ppo_trainer.hpp).
// The per-step body lives in ppo_trainer_fit.cpp, the driver-side maths in ppo_trainer_steps.cpp.
#include "driver/ppo_trainer.hpp"

#include <algorithm>

#include <fstream>
#include <sstream>

#include <torch/torch.h>

#include "driver/config.hpp"
#include "driver/internal/ppo_state.hpp"
#include "driver/runtime_config.hpp"

namespace tessera::driver {

using nlohmann::json;

RayPPOTrainer::~RayPPOTrainer() {
  actor_rollout_wg_.reset();
  critic_wg_.reset();
  ref_wg_.reset();
  rm_wg_.reset();
  colocated_.reset();
  if (runtime_) runtime_->shutdown();
}

namespace {

// The init config of one colocated role (workers/roles/registry.hpp).
std::string role_init(const json& cfg, const std::string& subtree, const std::string& role, int64_t seed) {
  json init{{"config", cfg.value(subtree, json::object())}, {"seed", seed}};
  if (!role.empty()) init["role"] = role;
  // The multi-turn rollout renders prompts as the dataset does.
  const json* kwargs = config_find(cfg, "data.apply_chat_template_kwargs");
  if (subtree == "actor_rollout_ref" && kwargs != nullptr && kwargs->is_object()) init["chat_template_kwargs"] = *kwargs;
  // The user's agent loops get the whole config (verl's trainer_config.config).
  const json* loops = config_find(cfg, "actor_rollout_ref.rollout.agent.agent_loop_config_path");
  const bool with_loops = loops != nullptr && loops->is_string() && !loops->get<std::string>().empty();
  if (subtree == "actor_rollout_ref" && role != "ref" && with_loops) init["trainer_config"] = cfg;
  return init.dump();
}

}  // namespace

Result<std::unique_ptr<RayPPOTrainer>> RayPPOTrainer::create(json cfg, const runtime::WorkerTypeRegistry& registry,
                                                             PpoTrainerOptions options) {
  TESSERA_RETURN_IF_ERROR(validate_ppo_config(cfg));
  std::unique_ptr<RayPPOTrainer> t(new RayPPOTrainer());
  t->options_ = options;
  TESSERA_ASSIGN_OR_RETURN(int64_t threads, config_get_or<int64_t>(cfg, "trainer.num_threads", 0));
  if (threads > 0) torch::set_num_threads(static_cast<int>(threads));
  TESSERA_ASSIGN_OR_RETURN(t->state_, make_ppo_state(cfg, options.console));
  t->total_training_steps_ = t->state_->total_training_steps;
  // verl writes the step count into the optimiser configs (_create_dataloader).
  cfg["actor_rollout_ref"]["actor"]["optim"]["total_training_steps"] = t->total_training_steps_;
  if (t->state_->use_critic) cfg["critic"]["optim"]["total_training_steps"] = t->total_training_steps_;
  t->cfg_ = std::move(cfg);
  TESSERA_RETURN_IF_ERROR(t->start_workers(registry));
  return t;
}

Status RayPPOTrainer::start_workers(const runtime::WorkerTypeRegistry& registry) {
  TESSERA_ASSIGN_OR_RETURN(runtime::RuntimeConfig rc, trainer_runtime_config(cfg_));
  TESSERA_ASSIGN_OR_RETURN(runtime_, runtime::Runtime::start(rc, registry));
  TESSERA_ASSIGN_OR_RETURN(int64_t nnodes, config_get<int64_t>(cfg_, "trainer.nnodes"));
  TESSERA_ASSIGN_OR_RETURN(int64_t per_node, config_get<int64_t>(cfg_, "trainer.n_gpus_per_node"));
  TESSERA_ASSIGN_OR_RETURN(runtime::ResourcePool pool,
                           runtime_->resource_pool(std::vector<int>(static_cast<size_t>(nnodes), static_cast<int>(per_node))));
  const State& s = *state_;
  TESSERA_ASSIGN_OR_RETURN(int64_t split, split_rollout_devices(cfg_));
  std::vector<runtime::RoleSpec> roles;
  // Split placement: the actor group trains only; the rollout group lives on the devices after
  // the trainer's on every node (start_split_rollout).
  const std::string actor_role = split > 0 ? "actor" : "actor_rollout";
  roles.push_back({"actor_rollout", "actor_rollout_ref", role_init(cfg_, "actor_rollout_ref", actor_role, s.seed)});
  if (s.use_critic) roles.push_back({"critic", "critic", role_init(cfg_, "critic", "", s.seed)});
  if (s.use_ref && !s.ref_in_actor) {
    roles.push_back({"ref", "actor_rollout_ref", role_init(cfg_, "actor_rollout_ref", "ref", s.seed)});
  }
  if (s.use_rm) roles.push_back({"rm", "reward_model", role_init(cfg_, "reward_model", "", s.seed)});
  TESSERA_ASSIGN_OR_RETURN(colocated_, dispatch::WorkerGroup::spawn(*runtime_, "global_pool", pool, roles));
  TESSERA_ASSIGN_OR_RETURN(actor_rollout_wg_, colocated_->role("actor_rollout"));
  if (s.use_critic) {
    TESSERA_ASSIGN_OR_RETURN(critic_wg_, colocated_->role("critic"));
  }
  if (s.use_ref && !s.ref_in_actor) {
    TESSERA_ASSIGN_OR_RETURN(ref_wg_, colocated_->role("ref"));
  }
  if (s.use_rm) {
    TESSERA_ASSIGN_OR_RETURN(rm_wg_, colocated_->role("rm"));
  }
  if (split > 0) TESSERA_RETURN_IF_ERROR(start_split_rollout(nnodes, per_node, split));
  return Status();
}

// The split pool: on every node (in the runtime's sorted order), the `split` devices that follow
// the first `per_node` ones the training pool uses.
Status RayPPOTrainer::start_split_rollout(int64_t nnodes, int64_t per_node, int64_t split) {
  TESSERA_ASSIGN_OR_RETURN(runtime::ResourcePool all, runtime_->resource_pool());
  std::vector<runtime::NodeDevices> nodes;
  for (const auto& node : all.nodes()) {
    if (static_cast<int64_t>(nodes.size()) == nnodes) break;
    std::vector<std::string> devices = node.devices;
    std::sort(devices.begin(), devices.end(), runtime::device_less);
    if (static_cast<int64_t>(devices.size()) < per_node + split) {
      return make_error(ErrorCode::invalid_argument,
                        "actor_rollout_ref.rollout.engine_kwargs.tessera.placement=split needs trainer.n_gpus_per_node "
                        "+ split_devices_per_node = {} devices per node; node {} has {}",
                        per_node + split, node.address, devices.size());
    }
    nodes.push_back({node.host, node.address,
                     std::vector<std::string>(devices.begin() + per_node, devices.begin() + per_node + split)});
  }
  TESSERA_ASSIGN_OR_RETURN(runtime::ResourcePool pool, runtime::ResourcePool::make(std::move(nodes)));
  std::vector<runtime::RoleSpec> roles{{"rollout", "actor_rollout_ref",
                                        role_init(cfg_, "actor_rollout_ref", "rollout", state_->seed)}};
  TESSERA_ASSIGN_OR_RETURN(rollout_pool_, dispatch::WorkerGroup::spawn(*runtime_, "rollout_pool", pool, roles));
  TESSERA_ASSIGN_OR_RETURN(rollout_wg_, rollout_pool_->role("rollout"));
  return Status();
}

Status RayPPOTrainer::init_workers() {
  // verl: critic, ref, rm, then actor_rollout last (so the rollout can size its cache).
  for (dispatch::WorkerGroup* wg : {critic_wg_.get(), ref_wg_.get(), rm_wg_.get(), actor_rollout_wg_.get(), rollout_wg_.get()}) {
    if (wg == nullptr) continue;
    TESSERA_RETURN_IF_ERROR(wg->call("init_model", {}).status());
  }
  return Status();
}

void RayPPOTrainer::announce() const {
  const State& s = *state_;
  RunSummary r = run_summary_from_config(cfg_);
  r.what = s.adv_estimator == "grpo"  ? "GRPO"
           : s.adv_estimator == "gae" ? "PPO (gae)"
                                      : fmt::format("PPO with {} advantages", s.adv_estimator);
  for (const dispatch::WorkerGroup* wg :
       {actor_rollout_wg_.get(), rollout_wg_.get(), ref_wg_.get(), critic_wg_.get(), rm_wg_.get()}) {
    if (wg != nullptr) r.groups.emplace_back(wg->name(), wg->world_size());
  }
  r.train_rows = s.train_dataset->size();
  r.val_rows = s.val_dataset ? s.val_dataset->size() : -1;
  r.steps_per_epoch = s.batches_per_epoch();
  r.total_steps = total_training_steps_;
  r.resumed_step = global_steps_;
  auto path = config_get<std::string>(cfg_, "actor_rollout_ref.model.path");
  const json* override = config_find(cfg_, "actor_rollout_ref.model.override_config");
  if (path.ok()) r.model = model_summary(*path, override != nullptr ? *override : json());
  if (s.skip_old_log_prob) {
    r.notes.push_back("old_log_prob: from the update's own forward (on-policy: one mini-batch, one epoch); "
                      "trainer.skip_on_policy_old_log_prob=false runs the pass");
  }
  print_run_summary(options_.console, r);
}

Status RayPPOTrainer::log_step(int64_t step, const Metrics& metrics) {
  history_.emplace_back(step, metrics);
  if (state_->bar) state_->bar->clear();
  if (state_->tracking) TESSERA_RETURN_IF_ERROR(state_->tracking->log(metrics, step));
  return Status();
}

Status RayPPOTrainer::save_checkpoint() {
  State& s = *state_;
  const int64_t step = global_steps_;
  TESSERA_RETURN_IF_ERROR(s.ckpt->begin_save(step).status());
  auto save = [&](dispatch::WorkerGroup& wg, const std::filesystem::path& dir) {
    // Rotation is the CheckpointManager's (commit prunes); the workers keep everything.
    json args{{"local_path", dir.string()}, {"hdfs_path", nullptr}, {"global_step", step}, {"max_ckpt_to_keep", nullptr}};
    return wg.call("save_checkpoint", {dispatch::Value(args)}).status();
  };
  TESSERA_RETURN_IF_ERROR(save(*actor_rollout_wg_, s.ckpt->actor_dir(step)));
  if (critic_wg_) TESSERA_RETURN_IF_ERROR(save(*critic_wg_, s.ckpt->critic_dir(step)));
  json trainer_state{{"global_step", step}, {"kl_coef", s.kl_ctrl ? s.kl_ctrl->value() : 0.0}};
  json data_state = s.train_loader->state_dict();
  if (s.sampler) {
    TESSERA_ASSIGN_OR_RETURN(data_state, s.sampler->state_dict());
  }
  TESSERA_RETURN_IF_ERROR(s.ckpt->write_driver_state(step, data_state, trainer_state));
  return s.ckpt->commit(step);
}

Status RayPPOTrainer::load_checkpoint() {
  State& s = *state_;
  TESSERA_ASSIGN_OR_RETURN(std::optional<ResumePoint> point, s.ckpt->resolve_resume());
  if (!point) return Status();
  TESSERA_ASSIGN_OR_RETURN(bool del_local, config_get<bool>(cfg_, "trainer.del_local_ckpt_after_load"));
  auto load = [&](dispatch::WorkerGroup& wg, const std::filesystem::path& dir) {
    json args{{"local_path", dir.string()}, {"hdfs_path", nullptr}, {"del_local_after_load", del_local}};
    return wg.call("load_checkpoint", {dispatch::Value(args)}).status();
  };
  TESSERA_RETURN_IF_ERROR(load(*actor_rollout_wg_, point->step_dir / "actor"));
  ++weights_version_;  // a split rollout must resync
  if (critic_wg_) TESSERA_RETURN_IF_ERROR(load(*critic_wg_, point->step_dir / "critic"));
  if (point->dataloader_state.is_null()) {
    std::fprintf(stderr, "warning: %s has no dataloader state; the data order restarts\n", point->step_dir.c_str());
  } else if (static_cast<bool>(s.sampler) != point->dataloader_state.contains("sampler_state")) {
    return make_error(ErrorCode::invalid_argument, "{}: its data order was taken {} data.sampler.class_path; resume with "
                      "the data.sampler of that run", point->step_dir.string(), s.sampler ? "without" : "with");
  } else if (s.sampler) {
    TESSERA_RETURN_IF_ERROR(s.sampler->load_state_dict(point->dataloader_state));
  } else {
    TESSERA_RETURN_IF_ERROR(s.train_loader->load_state_dict(point->dataloader_state));
  }
  global_steps_ = point->global_step;
  return Status();
}

Status RayPPOTrainer::fit() {
  Status st = fit_loop();
  if (state_->tracking) state_->tracking->finish(st.ok());  // the trackers' runs: finished or failed
  return st;
}

Status RayPPOTrainer::fit_loop() {
  State& s = *state_;
  global_steps_ = 0;
  TESSERA_RETURN_IF_ERROR(load_checkpoint());
  if (s.tracking) TESSERA_RETURN_IF_ERROR(s.tracking->start_at(global_steps_ > 0 ? global_steps_ : -1));
  announce();
  TESSERA_ASSIGN_OR_RETURN(bool val_before, config_get<bool>(cfg_, "trainer.val_before_train"));
  TESSERA_ASSIGN_OR_RETURN(bool val_only, config_get<bool>(cfg_, "trainer.val_only"));
  if (val_before && s.val_dataset) {
    TESSERA_ASSIGN_OR_RETURN(Metrics val, validate());
    TESSERA_RETURN_IF_ERROR(log_step(global_steps_, val));
    if (val_only) return Status();
  }
  if (options_.progress) s.bar = std::make_unique<ProgressBar>(total_training_steps_, options_.progress);
  global_steps_ += 1;
  if (global_steps_ > total_training_steps_) return Status();  // resumed after the last step
  // Epochs follow the loader (dynamic sampling may draw into the next one within a step).
  const int64_t first_step = global_steps_;
  while (true) {
    TESSERA_ASSIGN_OR_RETURN(std::optional<std::vector<int64_t>> indices, next_training_batch());
    if (!indices) break;
    const bool is_last = global_steps_ >= total_training_steps_;
    TESSERA_ASSIGN_OR_RETURN(std::optional<Metrics> stepped, train_step(*indices, is_last));
    if (!stepped) break;  // dynamic sampling ran out of data
    Metrics& metrics = *stepped;
    metrics["training/epoch"] = static_cast<double>(s.epoch());  // of the step's last batch, as verl's
    TESSERA_RETURN_IF_ERROR(log_step(global_steps_, metrics));
    if (s.bar) s.bar->update(global_steps_, metrics);
    if (options_.after_step) TESSERA_RETURN_IF_ERROR(options_.after_step(global_steps_, metrics));
    if (is_last) {
      if (s.bar) s.bar->finish();
      return Status();
    }
    global_steps_ += 1;
  }
  // Dynamic sampling ran out of data before total_training_steps (its steps take several
  // batches): as verl's DAPO trainer, the last step trained here is saved (with save_freq > 0;
  // verl saves regardless, under the next step's number).
  global_steps_ -= 1;
  if (s.filter_groups && s.save_freq > 0 && global_steps_ >= first_step && global_steps_ % s.save_freq != 0) {
    TESSERA_RETURN_IF_ERROR(save_checkpoint());
  }
  if (s.bar) s.bar->finish();
  return Status();
}

}  // namespace tessera::driver
