// actor_rollout_ref_split.cpp: ActorRolloutRefWorker's split-placement methods (Tessera's
// extension of the seed's method table; Note [Split placement weight transfer] in
// workers/rollout/split_weights.hpp). The actor side exports its FSDP shards in buckets; a
// "rollout" role with engine_kwargs.tessera.placement=split builds only an engine and imports them.
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "workers/roles/actor_rollout_ref_worker.hpp"

namespace tessera::workers {

using json = nlohmann::json;
using dispatch::Args;
namespace Dispatch = dispatch::Dispatch;
using dispatch::Value;

namespace {

Result<int64_t> int_arg(const Args& args, size_t i, const char* key, const char* method) {
  if (args.size() <= i || !args[i].is_json() || !args[i].json().is_object() || !args[i].json().contains(key) ||
      !args[i].json().at(key).is_number_integer()) {
    return make_error(ErrorCode::invalid_argument, "{}: argument {} must be an object with an integer '{}'", method, i,
                      key);
  }
  return args[i].json().at(key).get<int64_t>();
}

}  // namespace

void ActorRolloutRefWorker::register_split_methods() {
  (void)methods().add("rollout_weight_buckets", Dispatch::ONE_TO_ALL, [this](const Args&) -> Result<Value> {
    TESSERA_ASSIGN_OR_RETURN(json plan, rollout_weight_buckets());
    return Value(std::move(plan));
  });
  (void)methods().add("export_rollout_weights", Dispatch::ONE_TO_ALL, [this](const Args& args) -> Result<Value> {
    TESSERA_ASSIGN_OR_RETURN(int64_t bucket, int_arg(args, 0, "bucket", "export_rollout_weights"));
    TESSERA_ASSIGN_OR_RETURN(int64_t version, int_arg(args, 0, "version", "export_rollout_weights"));
    TESSERA_ASSIGN_OR_RETURN(proto::DataProto out, export_rollout_weights(bucket, version));
    TESSERA_RETURN_IF_ERROR(out.to(c10::Device(c10::DeviceType::CPU), /*non_blocking=*/true));  // to the wire
    return Value(std::move(out));
  });
  (void)methods().add("load_rollout_weights", Dispatch::ONE_TO_ALL, [this](const Args& args) -> Result<Value> {
    TESSERA_ASSIGN_OR_RETURN(proto::DataProto bucket, proto_arg(args, "load_rollout_weights"));
    TESSERA_RETURN_IF_ERROR(bucket.to(device(), /*non_blocking=*/true).with_context("load_rollout_weights"));
    TESSERA_ASSIGN_OR_RETURN(json done, load_rollout_weights(bucket));
    return Value(std::move(done));
  });
}

// The engine's dtype: rollout.dtype, or ("auto") the actor's FSDP param_dtype, as the colocated
// sharding manager resolves it.
Result<c10::ScalarType> ActorRolloutRefWorker::rollout_weight_dtype() const {
  TESSERA_ASSIGN_OR_RETURN(std::optional<c10::ScalarType> configured, rollout::rollout_dtype(config_.rollout));
  if (configured) return *configured;
  TESSERA_ASSIGN_OR_RETURN(fsdp::FsdpConfig fc, fsdp::parse_fsdp_config(config_.actor_fsdp_config,
                                                                         "actor_rollout_ref.actor.fsdp_config"));
  return fc.mixed_precision.param_dtype;
}

Status ActorRolloutRefWorker::build_split_rollout() {
  TESSERA_ASSIGN_OR_RETURN(c10::ScalarType dtype, rollout_weight_dtype());
  models::ModelInit init;
  init.dtype = dtype;
  TESSERA_ASSIGN_OR_RETURN(auto model, models::CausalLM::create(model_config_, init));
  model->to(device());  // the placeholders the imported weights replace live on the worker's device
  // TP is 1 here: the dp rank is the rank.
  auto engine = rollout::KVCacheEngine::create(model, config_.rollout, engine_options(static_cast<uint64_t>(context().rank)));
  if (!engine.ok()) return engine.status().with_context("split-placement rollout engine");
  split_engine_ = std::move(*engine);
  // The actor's LoRA adapters arrive with its weights and are merged here.
  const double lora_scaling = config_.model.lora.enabled() ? config_.model.lora.scaling() : 0.0;
  importer_ = std::make_unique<rollout::WeightImporter>(*split_engine_, lora_scaling);
  rollout::drop_weight_storage(*model);  // the weights arrive by load_rollout_weights
  return Status();
}

Result<json> ActorRolloutRefWorker::rollout_weight_buckets() {
  TESSERA_RETURN_IF_ERROR(require(actor_module_ != nullptr, "rollout_weight_buckets", "actor"));
  if (!exporter_) {
    TESSERA_ASSIGN_OR_RETURN(c10::ScalarType dtype, rollout_weight_dtype());
    exporter_ = std::make_unique<rollout::WeightExporter>(actor_module_->engine(), dtype,
                                                          config_.rollout.update_weights_bucket_megabytes << 20);
  }
  return json{{"buckets", exporter_->buckets()}, {"bytes", exporter_->total_bytes()}};
}

Result<proto::DataProto> ActorRolloutRefWorker::export_rollout_weights(int64_t bucket, int64_t version) {
  TESSERA_RETURN_IF_ERROR(rollout_weight_buckets().status());
  return exporter_->export_bucket(bucket, version);
}

Result<json> ActorRolloutRefWorker::load_rollout_weights(const proto::DataProto& bucket) {
  TESSERA_RETURN_IF_ERROR(require(importer_ != nullptr, "load_rollout_weights", "split-placement rollout"));
  const int64_t before = importer_->version();
  TESSERA_RETURN_IF_ERROR(importer_->import_bucket(bucket).with_context(fmt::format("rank {}", context().rank)));
  return json{{"version", importer_->version()}, {"complete", importer_->version() != before},
              {"bytes", importer_->received_bytes()}};
}

}  // namespace tessera::workers
