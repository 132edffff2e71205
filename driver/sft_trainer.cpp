// sft_trainer.cpp: FSDPSFTTrainer (see sft_trainer.hpp).
#include "driver/sft_trainer.hpp"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "driver/checkpoint_manager.hpp"
#include "driver/config.hpp"
#include "driver/data.hpp"
#include "driver/logger.hpp"
#include "driver/python_dataset.hpp"
#include "driver/runtime_config.hpp"
#include "workers/tokenizer/tokenizer.hpp"

namespace tessera::driver {

using nlohmann::json;
using dispatch::Value;

struct FSDPSFTTrainer::State {
  std::optional<SFTDataset> train_dataset;
  std::optional<SFTDataset> val_dataset;
  std::optional<StatefulDataLoader> loader;
  std::optional<Tracking> tracking;
  std::optional<CheckpointManager> ckpt;
  int64_t test_freq = -1, save_freq = -1, total_epochs = 1, seed = 1, world_size = 1, train_batch_size = 1;
};

namespace {

Status load_datasets(const json& cfg, FSDPSFTTrainer::State& s) {
  TESSERA_ASSIGN_OR_RETURN(std::string model_path, config_get<std::string>(cfg, "model.partial_pretrain"));
  bool corrected = false;
  TESSERA_ASSIGN_OR_RETURN(tokenizer::Tokenizer tok, tokenizer::Tokenizer::from_dir_as_verl(model_path, &corrected));
  if (corrected) spdlog::warn("{}: gemma-2-2b-it's eos token set to <end_of_turn>, as verl's hf_tokenizer does", tok.source());
  TESSERA_ASSIGN_OR_RETURN(auto custom_cls, config_get_or<std::optional<std::string>>(cfg, "data.custom_cls.path",
                                                                                       std::nullopt));
  const bool custom = custom_cls && !custom_cls->empty();  // verl: a falsy path is none
  // The user's class truncates by its own rules: data.truncation is its to read.
  json dataset_cfg = cfg;
  if (custom) dataset_cfg["data"]["truncation"] = "error";
  TESSERA_ASSIGN_OR_RETURN(SFTDatasetOptions opts, SFTDatasetOptions::from_config(dataset_cfg));
  if (custom) {  // verl's create_sft_dataset with the user's class, for both sets
    TESSERA_ASSIGN_OR_RETURN(PythonDatasetOptions po, PythonDatasetOptions::from_sft_config(cfg));
    auto read = [&](const std::string& files_key) -> Result<SFTDataset> {
      TESSERA_ASSIGN_OR_RETURN(auto items, read_python_sft_dataset(cfg, files_key, po, opts.max_length));
      return SFTDataset::from_items(std::move(items), tok, opts);
    };
    TESSERA_RETURN_IF_ERROR(load_custom_train_and_val(cfg, read, s.train_dataset, s.val_dataset));
  } else {
    TESSERA_RETURN_IF_ERROR(load_train_and_val(cfg, tok, opts, s.train_dataset, s.val_dataset));
  }
  DataLoaderOptions lo;
  lo.batch_size = s.train_batch_size;
  lo.shuffle = true;
  lo.drop_last = true;
  lo.seed = static_cast<uint64_t>(s.seed);
  TESSERA_ASSIGN_OR_RETURN(StatefulDataLoader loader, StatefulDataLoader::create(s.train_dataset->size(), lo));
  s.loader.emplace(std::move(loader));
  return Status();
}

Status read_trainer_keys(const json& cfg, FSDPSFTTrainer::State& s) {
  TESSERA_ASSIGN_OR_RETURN(s.test_freq, config_get<int64_t>(cfg, "trainer.test_freq"));
  TESSERA_ASSIGN_OR_RETURN(s.save_freq, config_get<int64_t>(cfg, "trainer.save_freq"));
  TESSERA_ASSIGN_OR_RETURN(s.total_epochs, config_get<int64_t>(cfg, "trainer.total_epochs"));
  TESSERA_ASSIGN_OR_RETURN(s.seed, config_get<int64_t>(cfg, "trainer.seed"));
  TESSERA_ASSIGN_OR_RETURN(s.train_batch_size, config_get<int64_t>(cfg, "data.train_batch_size"));
  TESSERA_ASSIGN_OR_RETURN(int64_t nnodes, config_get<int64_t>(cfg, "trainer.nnodes"));
  TESSERA_ASSIGN_OR_RETURN(int64_t per_node, config_get<int64_t>(cfg, "trainer.n_gpus_per_node"));
  s.world_size = nnodes * per_node;
  return Status();
}

Status make_services(const json& cfg, std::FILE* console, FSDPSFTTrainer::State& s) {
  TESSERA_ASSIGN_OR_RETURN(Tracking tracking, Tracking::from_config(cfg, console));
  s.tracking.emplace(std::move(tracking));
  TESSERA_ASSIGN_OR_RETURN(CheckpointOptions co, CheckpointOptions::from_config(cfg));
  s.ckpt.emplace(std::move(co));
  return Status();
}

// The worker's metrics (meta_info.metrics of the collected row-less output).
Result<Metrics> batch_call(dispatch::WorkerGroup& wg, const std::string& method, const proto::DataProto& batch) {
  TESSERA_ASSIGN_OR_RETURN(Value v, wg.call(method, {Value(batch)}));
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto out, v.as_proto("sft." + method));
  Metrics m;
  if (out.meta_info().contains("metrics")) TESSERA_RETURN_IF_ERROR(merge_worker_metrics(out.meta_info()["metrics"], m));
  return m;
}

}  // namespace

FSDPSFTTrainer::~FSDPSFTTrainer() {
  wg_.reset();
  if (runtime_) runtime_->shutdown();
}

Result<std::unique_ptr<FSDPSFTTrainer>> FSDPSFTTrainer::create(json cfg, const runtime::WorkerTypeRegistry& registry,
                                                               SftTrainerOptions options) {
  TESSERA_RETURN_IF_ERROR(validate_sft_config(cfg));
  std::unique_ptr<FSDPSFTTrainer> t(new FSDPSFTTrainer());
  t->options_ = options;
  t->state_ = std::make_unique<State>();
  State& s = *t->state_;
  TESSERA_ASSIGN_OR_RETURN(int64_t threads, config_get_or<int64_t>(cfg, "trainer.num_threads", 0));
  if (threads > 0) torch::set_num_threads(static_cast<int>(threads));
  TESSERA_RETURN_IF_ERROR(read_trainer_keys(cfg, s));
  TESSERA_RETURN_IF_ERROR(load_datasets(cfg, s));
  t->total_training_steps_ = s.loader->size() * s.total_epochs;
  TESSERA_ASSIGN_OR_RETURN(auto fixed, config_get<std::optional<int64_t>>(cfg, "trainer.total_training_steps"));
  if (fixed) t->total_training_steps_ = *fixed;
  if (t->total_training_steps_ < 1) {
    return make_error(ErrorCode::invalid_argument, "trainer.total_training_steps: {} must be >= 1", t->total_training_steps_);
  }
  TESSERA_RETURN_IF_ERROR(make_services(cfg, options.console, s));
  TESSERA_ASSIGN_OR_RETURN(runtime::RuntimeConfig rc, trainer_runtime_config(cfg));
  TESSERA_ASSIGN_OR_RETURN(t->runtime_, runtime::Runtime::start(rc, registry));
  TESSERA_ASSIGN_OR_RETURN(int64_t nnodes, config_get<int64_t>(cfg, "trainer.nnodes"));
  TESSERA_ASSIGN_OR_RETURN(runtime::ResourcePool pool,
                           t->runtime_->resource_pool(std::vector<int>(static_cast<size_t>(nnodes),
                                                                       static_cast<int>(s.world_size / nnodes))));
  json init{{"config",
             {{"model", cfg["model"]},
              {"optim", cfg["optim"]},
              {"data", cfg["data"]},
              {"use_remove_padding", cfg.value("use_remove_padding", json(false))}}},
            {"total_training_steps", t->total_training_steps_},
            {"seed", s.seed}};
  TESSERA_ASSIGN_OR_RETURN(t->wg_, dispatch::WorkerGroup::spawn(*t->runtime_, "sft", pool, {{"", "sft", init.dump()}}));
  TESSERA_RETURN_IF_ERROR(t->wg_->call("init_model", {}).status());
  t->cfg_ = std::move(cfg);
  return t;
}

Status FSDPSFTTrainer::log_step(int64_t step, const Metrics& metrics) {
  history_.emplace_back(step, metrics);
  if (bar_) bar_->clear();
  return state_->tracking->log(metrics, step);
}

void FSDPSFTTrainer::announce() const {
  const State& s = *state_;
  RunSummary r = run_summary_from_config(cfg_);
  r.what = "SFT";
  r.groups.emplace_back(wg_->name(), wg_->world_size());
  r.train_rows = s.train_dataset->size();
  r.val_rows = s.val_dataset ? s.val_dataset->size() : -1;
  r.steps_per_epoch = s.loader->size();
  r.total_steps = total_training_steps_;
  r.resumed_step = global_step_;
  auto path = config_get<std::string>(cfg_, "model.partial_pretrain");
  const nlohmann::json* override = config_find(cfg_, "model.override_config");
  if (path.ok()) r.model = model_summary(*path, override != nullptr ? *override : nlohmann::json());
  print_run_summary(options_.console, r);
}

Result<double> FSDPSFTTrainer::validate() {
  State& s = *state_;
  if (!s.val_dataset) return make_error(ErrorCode::invalid_argument, "validate: data.val_files is not set");
  double loss_sum = 0.0, tokens = 0.0;
  const int64_t n = s.val_dataset->size();
  for (int64_t start = 0; start < n; start += s.train_batch_size) {
    std::vector<int64_t> idx;
    for (int64_t i = start; i < std::min(n, start + s.train_batch_size); ++i) idx.push_back(i);
    TESSERA_ASSIGN_OR_RETURN(proto::DataProto batch, s.val_dataset->collate(idx));
    TESSERA_ASSIGN_OR_RETURN(auto padded, batch.pad_to_divisor(wg_->world_size()));
    proto::DataProto& b = padded.first;
    if (padded.second > 0) {  // padding copies must not count
      TESSERA_ASSIGN_OR_RETURN(at::Tensor mask, b.tensor("loss_mask"));
      at::Tensor m = mask.clone();
      m.narrow(0, m.size(0) - padded.second, padded.second).zero_();
      TESSERA_RETURN_IF_ERROR(b.set_tensor("loss_mask", m));
    }
    TESSERA_ASSIGN_OR_RETURN(at::Tensor lm, b.tensor("loss_mask"));
    const double batch_tokens = lm.narrow(1, 0, lm.size(1) - 1).sum().item<double>();
    TESSERA_ASSIGN_OR_RETURN(Metrics m, batch_call(*wg_, "validate_batch", b));
    loss_sum += m["val/loss"] * batch_tokens;
    tokens += batch_tokens;
  }
  return tokens > 0 ? loss_sum / tokens : 0.0;
}

Status FSDPSFTTrainer::save_checkpoint() {
  State& s = *state_;
  TESSERA_RETURN_IF_ERROR(s.ckpt->begin_save(global_step_).status());
  const std::filesystem::path dir = s.ckpt->actor_dir(global_step_);
  json args{{"local_path", dir.string()}, {"hdfs_path", nullptr}, {"global_step", global_step_}, {"max_ckpt_to_keep", nullptr}};
  TESSERA_RETURN_IF_ERROR(wg_->call("save_checkpoint", {Value(args)}).status());
  TESSERA_RETURN_IF_ERROR(s.ckpt->write_driver_state(global_step_, s.loader->state_dict(), json{{"global_step", global_step_}}));
  TESSERA_RETURN_IF_ERROR(s.ckpt->commit(global_step_));
  last_hf_dir_ = dir / "huggingface";
  return Status();
}

Status FSDPSFTTrainer::load_checkpoint() {
  State& s = *state_;
  TESSERA_ASSIGN_OR_RETURN(std::optional<ResumePoint> point, s.ckpt->resolve_resume());
  if (!point) return Status();
  json args{{"local_path", (point->step_dir / "actor").string()}, {"hdfs_path", nullptr}, {"del_local_after_load", false}};
  TESSERA_RETURN_IF_ERROR(wg_->call("load_checkpoint", {Value(args)}).status());
  if (!point->dataloader_state.is_null()) TESSERA_RETURN_IF_ERROR(s.loader->load_state_dict(point->dataloader_state));
  global_step_ = point->global_step;
  last_hf_dir_ = point->step_dir / "actor" / "huggingface";
  return Status();
}

Status FSDPSFTTrainer::fit() {
  Status st = fit_loop();
  state_->tracking->finish(st.ok());  // the trackers' runs: finished or failed
  return st;
}

Status FSDPSFTTrainer::fit_loop() {
  State& s = *state_;
  TESSERA_RETURN_IF_ERROR(load_checkpoint());
  TESSERA_RETURN_IF_ERROR(s.tracking->start_at(global_step_ > 0 ? global_step_ : -1));
  announce();
  if (global_step_ >= total_training_steps_) return Status();
  std::unique_ptr<ProgressBar>& bar = bar_;
  if (options_.progress) bar = std::make_unique<ProgressBar>(total_training_steps_, options_.progress);
  for (int64_t epoch = s.loader->epoch(); epoch < s.total_epochs || global_step_ < total_training_steps_; ++epoch) {
    while (std::optional<std::vector<int64_t>> idx = s.loader->next()) {
      global_step_ += 1;
      TESSERA_ASSIGN_OR_RETURN(proto::DataProto batch, s.train_dataset->collate(*idx));
      TESSERA_ASSIGN_OR_RETURN(Metrics metrics, batch_call(*wg_, "train_batch", batch));
      const bool is_last = global_step_ >= total_training_steps_;
      if (s.val_dataset && (is_last || (s.test_freq > 0 && global_step_ % s.test_freq == 0))) {
        TESSERA_ASSIGN_OR_RETURN(metrics["val/loss"], validate());
      }
      if (is_last || (s.save_freq > 0 && global_step_ % s.save_freq == 0)) TESSERA_RETURN_IF_ERROR(save_checkpoint());
      metrics["train/epoch"] = static_cast<double>(epoch);
      TESSERA_RETURN_IF_ERROR(log_step(global_step_, metrics));
      if (bar) bar->update(global_step_, metrics);
      if (is_last) {
        if (bar) bar->finish();
        return Status();
      }
    }
  }
  if (bar) bar->finish();
  return Status();
}

}  // namespace tessera::driver
