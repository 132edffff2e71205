// split_weights.cpp: Note [Split placement weight transfer] in split_weights.hpp.
#include "workers/rollout/split_weights.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <set>
#include <utility>

#include "workers/fsdp/flat_param.hpp"
#include "workers/fsdp/units.hpp"
#include "workers/models/lora.hpp"

namespace tessera::rollout {
namespace {

using json = nlohmann::json;

constexpr const char* kMetaKey = "tessera_weights";

std::string unit_key(int u) { return "unit." + std::to_string(u); }

Status bad_bucket(const std::string& what) {
  return make_error(ErrorCode::corrupt_data, "load_rollout_weights: {}", what);
}

}  // namespace

c10::ScalarType WeightExporter::unit_dtype(size_t u) const {
  return fsdp::is_adapter_unit(fsdp_.layouts()[u]) ? at::kFloat : dtype_;
}

WeightExporter::WeightExporter(fsdp::FsdpModule& fsdp, c10::ScalarType dtype, int64_t bucket_bytes)
    : fsdp_(fsdp), dtype_(dtype) {
  const auto& layouts = fsdp.layouts();
  int64_t in_bucket = 0;
  for (size_t u = 0; u < layouts.size(); ++u) {
    const int64_t elem = static_cast<int64_t>(c10::elementSize(unit_dtype(u)));
    const int64_t bytes = layouts[u].padded_numel * elem;
    if (buckets_.empty() || (in_bucket > 0 && in_bucket + bytes > bucket_bytes)) {
      buckets_.emplace_back();
      in_bucket = 0;
    }
    buckets_.back().push_back(static_cast<int>(u));
    in_bucket += bytes;
    total_bytes_ += layouts[u].numel * elem;
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    json units = json::array();
    for (int u : buckets_[b]) units.push_back({{"key", unit_key(u)}, {"layout", fsdp::flat_layout_to_json(layouts[static_cast<size_t>(u)])}});
    metadata_.push_back({{"bucket", b}, {"buckets", buckets_.size()}, {"dtype", c10::toString(dtype)}, {"units", units}});
  }
}

Result<proto::DataProto> WeightExporter::export_bucket(int64_t bucket, int64_t version) {
  if (bucket < 0 || bucket >= buckets()) {
    return make_error(ErrorCode::out_of_range, "export_rollout_weights: bucket {} of {}", bucket, buckets());
  }
  torch::NoGradGuard no_grad;
  // Offloaded shards are read where they lie, in their host buffers: loading every unit onto the
  // device for each bucket would move the whole model per bucket.
  const bool offloaded = fsdp_.params_offloaded();
  // One replica of the shards contributes (Note [Split placement weight transfer], step 2).
  const bool contributes = fsdp_.mesh().world()->rank() == fsdp_.shard_index();
  proto::TensorDict tensors;
  try {
    for (int u : buckets_[static_cast<size_t>(bucket)]) {
      const at::Tensor& source = offloaded ? std::as_const(fsdp_).unit_state(u).offload_shard : fsdp_.shard(u);
      const c10::ScalarType dtype = unit_dtype(static_cast<size_t>(u));
      tensors.insert_or_assign(unit_key(u), contributes
                                                ? source.to(dtype, /*non_blocking=*/false, /*copy=*/true).reshape({1, -1})
                                                : at::empty({0, source.numel()}, source.options().dtype(dtype)));
    }
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, "export_rollout_weights: {}", e.what());
  }
  json meta = metadata_[static_cast<size_t>(bucket)];
  meta["version"] = version;
  return proto::DataProto::from_dict(std::move(tensors), {}, json{{kMetaKey, meta}});
}

Status WeightImporter::import_unit(const json& unit, const proto::DataProto& bucket) {
  TESSERA_ASSIGN_OR_RETURN(fsdp::FlatLayout layout, fsdp::flat_layout_from_json(unit.at("layout"), "load_rollout_weights"));
  const std::string key = unit.at("key").get<std::string>();
  TESSERA_ASSIGN_OR_RETURN(at::Tensor rows, bucket.tensor(key));
  if (rows.dim() != 2 || rows.size(0) != layout.shard_count || rows.numel() != layout.padded_numel) {
    return bad_bucket(fmt::format("'{}' of unit '{}' is [{}], expected {} shard rows of {} elements", key, layout.unit,
                                  fmt::join(rows.sizes(), ","), layout.shard_count, layout.shard_numel()));
  }
  at::Tensor full = rows.contiguous().view(-1);
  std::vector<std::string> names;
  for (const auto& e : layout.params) {
    pending_tensors_[e.name] = full.narrow(0, e.offset, e.numel).view(e.shape);
    names.push_back(e.name);
  }
  pending_buffers_.push_back(full);
  pending_names_.push_back(std::move(names));
  pending_bytes_ += full.numel() * static_cast<int64_t>(full.element_size());
  return Status();
}

// Note [Split placement weight transfer]: the units holding adapted weights get buffers of their
// own, which the adapters are merged into; the adapters' own buffers are dropped after.
Status WeightImporter::merge_adapters() {
  std::set<std::string> adapted;
  for (const auto& [name, t] : pending_tensors_) {
    if (auto weight = models::lora_adapted_weight(name)) adapted.insert(*weight);
  }
  try {
    torch::NoGradGuard no_grad;
    for (size_t b = 0; b < pending_buffers_.size(); ++b) {
      const auto& names = pending_names_[b];
      if (std::none_of(names.begin(), names.end(), [&](const std::string& n) { return adapted.count(n) > 0; })) continue;
      const at::Tensor own = pending_buffers_[b].clone();
      const void* base = pending_buffers_[b].data_ptr();
      const int64_t elem = static_cast<int64_t>(own.element_size());
      for (const auto& n : names) {
        at::Tensor& view = pending_tensors_.at(n);
        const int64_t offset = (static_cast<const char*>(view.data_ptr()) - static_cast<const char*>(base)) / elem;
        view = own.narrow(0, offset, view.numel()).view(view.sizes());
      }
      pending_buffers_[b] = own;
    }
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, "load_rollout_weights: merging the LoRA adapters: {}", e.what());
  }
  TESSERA_ASSIGN_OR_RETURN(pending_tensors_, models::merge_lora_weights(pending_tensors_, lora_scaling_, /*in_place=*/true));
  for (size_t b = 0; b < pending_buffers_.size();) {  // the adapters' buffers: nothing views them now
    const auto& names = pending_names_[b];
    if (!names.empty() && std::all_of(names.begin(), names.end(), models::is_lora_parameter)) {
      pending_buffers_.erase(pending_buffers_.begin() + static_cast<std::ptrdiff_t>(b));
      pending_names_.erase(pending_names_.begin() + static_cast<std::ptrdiff_t>(b));
    } else {
      ++b;
    }
  }
  return Status();
}

Status WeightImporter::import_bucket(const proto::DataProto& bucket) {
  auto it = bucket.meta_info().find(kMetaKey);
  if (it == bucket.meta_info().end() || !it->is_object()) return bad_bucket("meta_info has no 'tessera_weights' entry");
  const json& meta = *it;
  try {
    const int64_t version = meta.at("version").get<int64_t>(), index = meta.at("bucket").get<int64_t>();
    const int64_t count = meta.at("buckets").get<int64_t>();
    if (version != pending_version_ || index == 0) {
      pending_version_ = version;
      next_bucket_ = 0;
      pending_tensors_.clear();
      pending_buffers_.clear();
      pending_names_.clear();
      pending_bytes_ = 0;
    }
    if (index != next_bucket_) {
      return bad_bucket(fmt::format("bucket {} of version {} arrived, expected bucket {}", index, version, next_bucket_));
    }
    for (const json& unit : meta.at("units")) TESSERA_RETURN_IF_ERROR(import_unit(unit, bucket));
    ++next_bucket_;
    if (next_bucket_ < count) return Status();
    if (lora_scaling_ > 0) TESSERA_RETURN_IF_ERROR(merge_adapters());
    TESSERA_RETURN_IF_ERROR(engine_.load_weights_by_reference(pending_tensors_));
    buffers_ = std::move(pending_buffers_);
    version_ = version;
    received_bytes_ = pending_bytes_;
    pending_tensors_.clear();
    pending_buffers_.clear();
    pending_names_.clear();
    pending_version_ = -1;
    next_bucket_ = 0;
    return Status();
  } catch (const json::exception& e) {
    return bad_bucket(fmt::format("malformed metadata: {}", e.what()));
  }
}

}  // namespace tessera::rollout
