// checkpoint.cpp: Note [Sharded checkpoint] in checkpoint.hpp.
#include "workers/fsdp/checkpoint.hpp"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <utility>

#include "workers/fsdp/internal/checkpoint_io.hpp"
#include "workers/models/lora.hpp"
#include "workers/models/safetensors.hpp"
#include "workers/models/weight_loader.hpp"

namespace tessera::fsdp {
namespace {

namespace fs = std::filesystem;
using internal::extra_file;
using internal::model_file;
using internal::optim_file;

// The copy that is current: the working tensor, or its offload buffer while offloaded.
const at::Tensor& current(const at::Tensor& working, const at::Tensor& offloaded) {
  return working.defined() ? working : offloaded;
}

// Is this rank the writer of its shard (first replica)?
bool writes_shard(FsdpModule& e) {
  const auto& mesh = e.mesh();
  if (e.strategy() == ShardingStrategy::no_shard) return mesh.world()->rank() == 0;
  if (e.strategy() == ShardingStrategy::hybrid_shard) return mesh.coordinate(0) == 0;
  return true;
}

Status write_rank_files(FsdpModule& e, const std::string& tmp) {
  const int k = e.shard_index(), K = e.shard_count();
  if (writes_shard(e)) {
    models::TensorMap model, optim;
    for (size_t u = 0; u < e.layouts().size(); ++u) {
      const auto& s = std::as_const(e).unit_state(static_cast<int>(u));  // reads: the host copy stays current
      const std::string& name = e.layouts()[u].unit;
      model[name] = current(s.shard, s.offload_shard);
      if (e.frozen() || !s.trainable) continue;  // no moments (Note [Attached units])
      optim[name + ".exp_avg"] = current(s.adam.exp_avg, s.offload_adam.exp_avg);
      optim[name + ".exp_avg_sq"] = current(s.adam.exp_avg_sq, s.offload_adam.exp_avg_sq);
    }
    TESSERA_RETURN_IF_ERROR(models::write_safetensors(tmp + "/" + model_file(k, K), model));
    if (!e.frozen()) TESSERA_RETURN_IF_ERROR(models::write_safetensors(tmp + "/" + optim_file(k, K), optim));
  }
  at::Tensor rng;
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    rng = gen.get_state();
  }
  const auto& world = e.mesh().world();
  return models::write_safetensors(tmp + "/" + extra_file(world->rank(), world->size()),
                                   {{"rng_state", rng}});
}

nlohmann::json make_manifest(FsdpModule& e, const std::string& tmp) {
  nlohmann::json units = nlohmann::json::array();
  for (const auto& layout : e.layouts()) units.push_back(flat_layout_to_json(layout));
  nlohmann::json files = nlohmann::json::object();
  for (const auto& entry : fs::recursive_directory_iterator(tmp)) {
    if (entry.is_regular_file()) {
      files[fs::relative(entry.path(), tmp).string()] = static_cast<int64_t>(entry.file_size());
    }
  }
  const auto& mesh = e.mesh();
  return {{"format", internal::kManifestFormat},
          {"version", internal::kManifestVersion},
          {"world_size", mesh.world()->size()},
          {"shard_count", e.shard_count()},
          {"strategy", to_string(e.strategy())},
          {"mesh", {{"dims", mesh.dim_names()}, {"shape", mesh.shape()}}},
          {"model_dtype", c10::toString(e.options().model_dtype)},
          {"optimizer_steps", e.optimizer_steps()},
          {"optimizer_state", !e.frozen()},
          {"lr_scheduler", {{"last_step", e.scheduler().last_step()}, {"base_lr", e.scheduler().base_lr()}}},
          {"units", units},
          {"files", files}};
}

// Rank 0's part after every rank wrote its files: config, manifest (last), swap into place.
Status publish(FsdpModule& e, const std::string& tmp, const std::string& dir,
               const SaveOptions& options) {
  if (!options.hf_config.is_null()) {
    std::error_code ec;
    fs::create_directories(tmp + "/huggingface", ec);
    TESSERA_RETURN_IF_ERROR(
        internal::write_text_atomic(tmp + "/huggingface/config.json", options.hf_config.dump(2)));
  }
  nlohmann::json manifest = make_manifest(e, tmp);
  TESSERA_RETURN_IF_ERROR(internal::write_text_atomic(tmp + "/manifest.json", manifest.dump(1)));
  return internal::swap_into_place(tmp, dir);
}

// All ranks learn whether any rank failed (max over a 0/1 flag).
Status agree(collective::Communicator& world, const Status& local, const std::string& what) {
  at::Tensor flag = at::tensor({local.ok() ? 0 : 1}, at::kInt);
  Status st = world.all_reduce(flag, collective::ReduceOp::max);
  if (!st.ok()) return st.with_context(what);
  if (!local.ok()) return local.with_context(what);
  if (flag.item<int>() != 0) {
    return make_error(ErrorCode::unavailable, "{}: another rank failed; nothing was published", what);
  }
  return Status();
}

}  // namespace

Status save_checkpoint(FsdpModule& e, const std::string& dir, const SaveOptions& options) {
  auto& world = *e.mesh().world();
  const std::string what = fmt::format("save_checkpoint '{}' (rank {} of {})", dir, world.rank(), world.size());
  const std::string tmp = dir + ".tmp";
  Status st;
  if (world.rank() == 0) st = internal::fresh_directory(tmp);
  TESSERA_RETURN_IF_ERROR(agree(world, st, what));
  try {
    st = write_rank_files(e, tmp);
  } catch (const std::exception& ex) {
    st = make_error(ErrorCode::internal, "{}", ex.what());
  }
  if (st.ok() && options.after_rank_files) st = options.after_rank_files(tmp);
  TESSERA_RETURN_IF_ERROR(agree(world, st, what));
  st = Status();
  if (world.rank() == 0) st = publish(e, tmp, dir, options);
  return agree(world, st, what);
}

Result<nlohmann::json> read_manifest(const std::string& dir) {
  return internal::read_and_check_manifest(dir);
}

Status load_checkpoint(FsdpModule& e, const std::string& dir) {
  const std::string what = "load_checkpoint '" + dir + "'";
  TESSERA_ASSIGN_OR_RETURN(nlohmann::json manifest, read_manifest(dir));
  TESSERA_ASSIGN_OR_RETURN(std::vector<FlatLayout> old_layouts, internal::manifest_layouts(manifest, dir));
  TESSERA_RETURN_IF_ERROR(internal::check_same_units(old_layouts, e.layouts(), dir));
  TESSERA_ASSIGN_OR_RETURN(bool has_optim, internal::manifest_has_optimizer_state(manifest, dir));
  if (!has_optim && !e.frozen()) {
    return make_error(ErrorCode::invalid_argument,
                      "{}: saved from a frozen module (no optimizer state), cannot restore the optimizer "
                      "of trainable module '{}'", what, e.options().name);
  }
  // Offloaded shards and moments are restored into their host buffers, a unit at a time: never
  // all onto the device, nor a second full copy on the host beside the buffers (Note [Streamed
  // optimizer step] in fsdp_step.cpp; a 7B model's fp32 shards are 30 GB).
  const bool params_off = e.params_offloaded(), optim_off = e.optimizer_offloaded();
  internal::ShardFiles files(dir, manifest["shard_count"].get<int>());
  try {
    for (size_t u = 0; u < old_layouts.size(); ++u) {
      auto& s = e.unit_state(static_cast<int>(u));
      auto [begin, end] = e.layouts()[u].shard_range(e.shard_index());
      const std::string& unit = old_layouts[u].unit;
      // The unit's own shard dtype (frozen units may be kept in param_dtype).
      const at::Tensor& current_shard = params_off ? s.offload_shard : s.shard;
      const c10::ScalarType shard_dtype = current_shard.defined() ? current_shard.scalar_type() : e.options().model_dtype;
      TESSERA_ASSIGN_OR_RETURN(at::Tensor shard, files.recut(old_layouts[u], begin, end, "model", unit, shard_dtype));
      if (params_off) {  // the same shapes (check_same_units): into the kept host buffer
        s.offload_shard.copy_(shard);
      } else {
        s.shard = std::move(shard);
      }
      s.shard_grad = at::Tensor();
      if (e.frozen() || !s.trainable) continue;  // a frozen module or unit reads no optimizer files
      AdamWState& into = optim_off ? s.offload_adam : s.adam;
      TESSERA_ASSIGN_OR_RETURN(at::Tensor exp_avg, files.recut(old_layouts[u], begin, end, "optim", unit + ".exp_avg", e.options().model_dtype));
      TESSERA_ASSIGN_OR_RETURN(at::Tensor exp_avg_sq, files.recut(old_layouts[u], begin, end, "optim", unit + ".exp_avg_sq", e.options().model_dtype));
      if (optim_off) {  // the same shapes (check_same_units): into the kept host buffers
        into.exp_avg.copy_(exp_avg);
        into.exp_avg_sq.copy_(exp_avg_sq);
      } else {
        into = AdamWState{std::move(exp_avg), std::move(exp_avg_sq)};
      }
    }
    // The files are read on the host; the working state lives on the engine's device.
    for (size_t u = 0; u < old_layouts.size(); ++u) {
      auto& s = e.unit_state(static_cast<int>(u));
      if (!params_off) s.shard = s.shard.to(e.device());
      if (e.frozen() || !s.trainable || optim_off) continue;
      s.adam.exp_avg = s.adam.exp_avg.to(e.device());
      s.adam.exp_avg_sq = s.adam.exp_avg_sq.to(e.device());
    }
  } catch (const std::exception& ex) {
    return make_error(ErrorCode::internal, "{}: {}", what, ex.what());
  }
  e.set_optimizer_steps(manifest["optimizer_steps"].get<int64_t>());
  e.scheduler().set_last_step(manifest["lr_scheduler"]["last_step"].get<int64_t>());
  const auto& world = e.mesh().world();
  TESSERA_RETURN_IF_ERROR(internal::restore_rng(dir, world->rank(), manifest["world_size"].get<int>()));
  return Status();
}

Status export_hf(const std::string& checkpoint_dir, const std::string& out_dir,
                 const ExportOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(nlohmann::json manifest, read_manifest(checkpoint_dir));
  std::string config_path = internal::resolve_checkpoint_dir(checkpoint_dir) + "/huggingface/config.json";
  if (!fs::exists(config_path)) {
    return make_error(ErrorCode::not_found,
                      "export_hf: '{}' has no huggingface/config.json (save with hf_config)",
                      checkpoint_dir);
  }
  TESSERA_ASSIGN_OR_RETURN(std::vector<FlatLayout> layouts, internal::manifest_layouts(manifest, checkpoint_dir));
  internal::ShardFiles files(checkpoint_dir, manifest["shard_count"].get<int>());
  models::TensorMap tensors;
  for (const auto& layout : layouts) {
    TESSERA_ASSIGN_OR_RETURN(at::Tensor flat, files.recut(layout, 0, layout.numel, "model", layout.unit, std::nullopt));
    for (const auto& p : layout.params) {
      at::Tensor t = flat.narrow(0, p.offset, p.numel).view(p.shape);
      tensors[p.name] = t;
    }
  }
  // LoRA adapters are merged into their base weights (PEFT's merge_and_unload), with the alpha and
  // rank recorded beside them in lora_adapter/adapter_config.json. The merge is exact in fp32: a
  // base kept in bf16 (FsdpOptions::frozen_units_in_param_dtype) is widened first, and without an
  // asked-for dtype the model is written in fp32, as an fp32 master model would be.
  std::optional<c10::ScalarType> out_dtype = options.dtype;
  if (std::any_of(tensors.begin(), tensors.end(), [](const auto& kv) { return models::is_lora_parameter(kv.first); })) {
    if (!out_dtype) out_dtype = at::kFloat;
    for (auto& [name, t] : tensors) {
      if (!models::is_lora_parameter(name)) t = t.to(at::kFloat);
    }
    const std::string adapter_config =
        internal::resolve_checkpoint_dir(checkpoint_dir) + "/lora_adapter/adapter_config.json";
    TESSERA_ASSIGN_OR_RETURN(std::string text, internal::read_text(adapter_config));
    nlohmann::json adapter = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (adapter.is_discarded() || !adapter.value("r", nlohmann::json()).is_number_integer() ||
        !adapter.value("lora_alpha", nlohmann::json()).is_number() || adapter["r"].get<int64_t>() <= 0) {
      return make_error(ErrorCode::corrupt_data, "export_hf: {} has no valid r and lora_alpha", adapter_config);
    }
    const double scaling = adapter["lora_alpha"].get<double>() / static_cast<double>(adapter["r"].get<int64_t>());
    TESSERA_ASSIGN_OR_RETURN(tensors, models::merge_lora_weights(tensors, scaling, /*in_place=*/false));
  }
  if (out_dtype) {
    for (auto& [name, t] : tensors) t = t.to(*out_dtype);
  }
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return make_error(ErrorCode::io_error, "export_hf: cannot create '{}': {}", out_dir, ec.message());
  TESSERA_RETURN_IF_ERROR(models::write_safetensors_checkpoint(out_dir, models::to_hf_checkpoint_tensors(tensors)));
  TESSERA_ASSIGN_OR_RETURN(std::string config_text, internal::read_text(config_path));
  nlohmann::json config = nlohmann::json::parse(config_text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) return make_error(ErrorCode::corrupt_data, "export_hf: {} is not JSON", config_path);
  if (out_dtype) config["torch_dtype"] = internal::hf_dtype_name(*out_dtype);
  return internal::write_text_atomic(out_dir + "/config.json", config.dump(2));
}

}  // namespace tessera::fsdp
