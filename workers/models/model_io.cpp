// model_io.cpp: load_causal_lm / load_value_model / save_pretrained.
#include "workers/models/model_io.hpp"

#include <filesystem>

#include <torch/torch.h>

#include "proto/device.hpp"

namespace tessera::models {
namespace {

namespace fs = std::filesystem;

struct Loaded {
  ModelConfig config;
  ArchitectureEntry entry;
  TensorMap checkpoint;
  c10::ScalarType dtype = c10::ScalarType::Float;
};

Result<Loaded> read_directory(const std::string& dir, const LoadOptions& options) {
  Loaded out;
  TESSERA_ASSIGN_OR_RETURN(out.config, load_model_config(dir, options.config_override, options.config_override_key));
  TESSERA_ASSIGN_OR_RETURN(out.entry, WeightLoaderRegistry::global().find(out.config.architecture));
  TESSERA_ASSIGN_OR_RETURN(out.checkpoint, read_safetensors_checkpoint(dir));
  auto embed = out.checkpoint.find("model.embed_tokens.weight");
  if (embed == out.checkpoint.end()) {
    return make_error(ErrorCode::not_found, "{}: tensor 'model.embed_tokens.weight' missing", dir);
  }
  out.dtype = options.dtype.value_or(embed->second.scalar_type());
  return out;
}

template <class Model>
Result<std::shared_ptr<Model>> load_into(Loaded& loaded, const std::string& dir, const ModelInit& init,
                                         const LoadOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<Model> model, Model::create(loaded.config, init));
  const bool to_device = options.device && *options.device != c10::Device(c10::DeviceType::CPU);
  if (to_device) TESSERA_RETURN_IF_ERROR(proto::require_device(*options.device).with_context(dir));
  try {
    // The loader puts the checkpoint's tensors on the device; this moves what it initialised
    // instead (a value head the checkpoint lacks). The uploads are asynchronous: the load ends
    // when they have landed, so that a device error is this call's.
    TESSERA_RETURN_IF_ERROR(loaded.entry.load(loaded.checkpoint, dir, *model, options));
    if (to_device) {
      model->to(*options.device);
      proto::synchronize(*options.device);
    }
  } catch (const std::exception& e) {
    if (proto::is_out_of_memory(e)) {
      return make_error(ErrorCode::resource_exhausted, "{}: out of memory moving the model to {}: {}", dir,
                        options.device->str(), proto::out_of_memory_summary(e));
    }
    return make_error(ErrorCode::internal, "{}: loading weights failed: {}", dir, e.what());
  }
  return model;
}

}  // namespace

Result<std::shared_ptr<CausalLM>> load_causal_lm(const std::string& dir, const LoadOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(Loaded loaded, read_directory(dir, options));
  if (loaded.entry.head != HeadKind::causal_lm) {
    return make_error(ErrorCode::invalid_argument, "{}: architecture '{}' is a value model; use load_value_model",
                      dir, loaded.config.architecture);
  }
  ModelInit init;
  init.dtype = loaded.dtype;
  return load_into<CausalLM>(loaded, dir, init, options);
}

Result<std::shared_ptr<ValueModel>> load_value_model(const std::string& dir, const LoadOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(Loaded loaded, read_directory(dir, options));
  ModelInit init;
  init.dtype = loaded.dtype;
  // Keep the checkpoint's head layout; a fresh head gets HF's layout (Linear with bias).
  init.score_bias = loaded.checkpoint.count("score.weight") == 0 || loaded.checkpoint.count("score.bias") != 0;
  return load_into<ValueModel>(loaded, dir, init, options);
}

Status save_pretrained(const PretrainedModel& model, const std::string& dir, const CheckpointWriteOptions& options) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return make_error(ErrorCode::io_error, "{}: cannot create directory: {}", dir, ec.message());
  ModelConfig config = model.config();
  TESSERA_ASSIGN_OR_RETURN(config.torch_dtype,
                           torch_dtype_name(model.backbone().embed_tokens->weight.scalar_type()));
  TESSERA_RETURN_IF_ERROR(write_safetensors_checkpoint(dir, to_hf_checkpoint_tensors(model.parameter_map()), options));
  return save_model_config(config, dir);
}

}  // namespace tessera::models
