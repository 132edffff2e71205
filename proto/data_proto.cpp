// data_proto.cpp: construction, accessors and the key operations (select, pop, rename, union_).
#include "proto/data_proto.hpp"

#include <cstdlib>
#include <set>

#include <torch/torch.h>

#include "proto/internal/tensor_ops.hpp"

namespace tessera::proto {
namespace {

using json = nlohmann::json;
using internal::rows_of;

Status check_row_count(const std::string& key, int64_t rows, const std::string& first_key,
                       int64_t expected, const char* what) {
  if (rows == expected) return Status();
  return make_error(ErrorCode::invalid_argument,
                    "{}: '{}' has {} rows but '{}' has {} (all keys share dim 0)", what, key, rows,
                    first_key, expected);
}

/// Checks that every key has the same row count and meta is an object.
Status check_parts(const TensorDict& batch, const NonTensorBatch& columns, const json& meta,
                   const char* what) {
  std::string first_key;
  int64_t expected = -1;
  for (const auto& [key, t] : batch) {
    if (!t.defined()) return make_error(ErrorCode::invalid_argument, "{}: tensor '{}' is undefined", what, key);
    if (t.dim() == 0) {
      return make_error(ErrorCode::invalid_argument, "{}: tensor '{}' is 0-dim (needs a batch dim)", what, key);
    }
    if (expected < 0) {
      first_key = key;
      expected = t.size(0);
    }
    TESSERA_RETURN_IF_ERROR(check_row_count(key, t.size(0), first_key, expected, what));
  }
  for (const auto& [key, c] : columns) {
    if (expected < 0) {
      first_key = key;
      expected = c.size();
    }
    TESSERA_RETURN_IF_ERROR(check_row_count(key, c.size(), first_key, expected, what));
  }
  if (!meta.is_object()) {
    return make_error(ErrorCode::invalid_argument, "{}: meta_info must be a JSON object, got {}",
                      what, meta.type_name());
  }
  return Status();
}

/// Finds the first key of `wanted` missing from a container with `contains`.
template <class Has>
Status require_keys(const std::vector<std::string>& wanted, Has has, const char* what,
                    const char* kind) {
  std::set<std::string> seen;
  for (const auto& k : wanted) {
    if (!has(k)) return make_error(ErrorCode::not_found, "{}: {} key '{}' not found", what, kind, k);
    if (!seen.insert(k).second) {
      return make_error(ErrorCode::invalid_argument, "{}: {} key '{}' given twice", what, kind, k);
    }
  }
  return Status();
}

}  // namespace

// Note [Empty meta_info]
// Most DataProtos carry an empty meta_info, and a JSON object is a heap-allocated std::map: every
// DataProto built, copied or destroyed paid an allocation and a free for its `{}`, ~20 of them
// per in-process DP call at the caller (dispatch's chunks, the ranks' outputs, the join). So
// meta_info_ holds null for "empty": DataProtoAccess::make stores an empty object as null, the
// const accessor shows null as a shared `{}`, the mutable accessor turns null into `{}` before
// handing it out (a caller writing into it needs an object), and code inside proto/ that reads
// meta_info_ directly treats null as `{}`.
DataProto::DataProto() = default;

const json& DataProto::empty_meta_info() {
  static const json empty = json::object();
  return empty;
}

Result<DataProto> DataProto::from_dict(TensorDict tensors, NonTensorBatch non_tensors,
                                       json meta_info, const FromDictOptions& options) {
  if (meta_info.is_null()) meta_info = json::object();
  TESSERA_RETURN_IF_ERROR(check_parts(tensors, non_tensors, meta_info, "from_dict"));
  if (options.auto_padding) meta_info[kAutoPaddingKey] = true;
  return DataProtoAccess::make(std::move(tensors), std::move(non_tensors), std::move(meta_info));
}

int64_t DataProto::size() const { return rows_of(batch_, non_tensor_batch_); }

Result<at::Tensor> DataProto::tensor(const std::string& key) const {
  if (const at::Tensor* t = batch_.find(key)) return *t;
  return make_error(ErrorCode::not_found, "DataProto: batch key '{}' not found", key);
}

Result<Column> DataProto::column(const std::string& key) const {
  if (const Column* c = non_tensor_batch_.find(key)) return *c;
  return make_error(ErrorCode::not_found, "DataProto: non_tensor_batch key '{}' not found", key);
}

Status DataProto::set_tensor(const std::string& key, at::Tensor tensor) {
  TensorDict batch = batch_;
  batch.insert_or_assign(key, std::move(tensor));
  TensorDict others = batch_;
  others.erase(key);
  bool has_others = !others.empty() || !non_tensor_batch_.empty();
  const at::Tensor& t = *batch.find(key);
  if (!t.defined() || t.dim() == 0) {
    return make_error(ErrorCode::invalid_argument, "set_tensor: '{}' must have a batch dim", key);
  }
  if (has_others && t.size(0) != rows_of(others, non_tensor_batch_)) {
    return make_error(ErrorCode::invalid_argument, "set_tensor: '{}' has {} rows, DataProto has {}",
                      key, t.size(0), rows_of(others, non_tensor_batch_));
  }
  batch_ = std::move(batch);
  return Status();
}

Status DataProto::set_column(const std::string& key, Column column) {
  NonTensorBatch others = non_tensor_batch_;
  others.erase(key);
  if ((!batch_.empty() || !others.empty()) && column.size() != rows_of(batch_, others)) {
    return make_error(ErrorCode::invalid_argument, "set_column: '{}' has {} rows, DataProto has {}",
                      key, column.size(), rows_of(batch_, others));
  }
  non_tensor_batch_.insert_or_assign(key, std::move(column));
  return Status();
}

Status DataProto::check_consistency() const {
  return check_parts(batch_, non_tensor_batch_, meta_info(), "check_consistency");
}

bool DataProto::is_padding_enabled() const {
  if (meta_info_.is_object()) {
    auto it = meta_info_.find(kAutoPaddingKey);
    if (it != meta_info_.end()) {
      if (it->is_boolean() && it->get<bool>()) return true;
      if (it->is_number() && it->get<double>() != 0) return true;
    }
  }
  const char* env = std::getenv("VERL_AUTO_PADDING");
  return env != nullptr && (std::string(env) == "TRUE" || std::string(env) == "1");
}

Result<DataProto> DataProto::select(const Keys& batch_keys, const Keys& non_tensor_batch_keys,
                                    const Keys& meta_info_keys, bool deepcopy) const {
  TensorDict batch;
  if (batch_keys) {
    TESSERA_RETURN_IF_ERROR(require_keys(
        *batch_keys, [&](const std::string& k) { return batch_.contains(k); }, "select", "batch"));
    for (const auto& k : *batch_keys) batch.insert_or_assign(k, *batch_.find(k));
  } else {
    batch = batch_;
  }
  NonTensorBatch columns;
  const std::vector<std::string> col_keys =
      non_tensor_batch_keys ? *non_tensor_batch_keys : non_tensor_batch_.keys();
  TESSERA_RETURN_IF_ERROR(require_keys(
      col_keys, [&](const std::string& k) { return non_tensor_batch_.contains(k); }, "select",
      "non_tensor_batch"));
  for (const auto& k : col_keys) {
    const Column& c = *non_tensor_batch_.find(k);
    columns.insert_or_assign(k, deepcopy ? c.compact() : c);
  }
  json meta;  // null: empty (Note [Empty meta_info])
  if (meta_info_keys) {
    TESSERA_RETURN_IF_ERROR(require_keys(
        *meta_info_keys, [&](const std::string& k) { return meta_info_.contains(k); }, "select",
        "meta_info"));
    for (const auto& k : *meta_info_keys) meta[k] = meta_info_[k];
  } else {
    meta = meta_info_;
  }
  return DataProtoAccess::make(std::move(batch), std::move(columns), std::move(meta));
}

Result<DataProto> DataProto::pop(const Keys& batch_keys, const Keys& non_tensor_batch_keys,
                                 const Keys& meta_info_keys) {
  const std::vector<std::string> bk = batch_keys.value_or(std::vector<std::string>{});
  const std::vector<std::string> ck = non_tensor_batch_keys.value_or(std::vector<std::string>{});
  const std::vector<std::string> mk = meta_info_keys.value_or(std::vector<std::string>{});
  TESSERA_RETURN_IF_ERROR(require_keys(
      bk, [&](const std::string& k) { return batch_.contains(k); }, "pop", "batch"));
  TESSERA_RETURN_IF_ERROR(require_keys(
      ck, [&](const std::string& k) { return non_tensor_batch_.contains(k); }, "pop",
      "non_tensor_batch"));
  TESSERA_RETURN_IF_ERROR(require_keys(
      mk, [&](const std::string& k) { return meta_info_.contains(k); }, "pop", "meta_info"));
  TensorDict batch;
  for (const auto& k : bk) {
    batch.insert_or_assign(k, *batch_.find(k));
    batch_.erase(k);
  }
  NonTensorBatch columns;
  for (const auto& k : ck) {
    columns.insert_or_assign(k, *non_tensor_batch_.find(k));
    non_tensor_batch_.erase(k);
  }
  json meta = json::object();
  for (const auto& k : mk) {
    meta[k] = meta_info_[k];
    meta_info_.erase(k);
  }
  return DataProtoAccess::make(std::move(batch), std::move(columns), std::move(meta));
}

Status DataProto::rename(const std::vector<std::string>& old_keys,
                         const std::vector<std::string>& new_keys) {
  if (old_keys.size() != new_keys.size()) {
    return make_error(ErrorCode::invalid_argument,
                      "rename: {} old keys but {} new keys (lengths must match)", old_keys.size(),
                      new_keys.size());
  }
  TensorDict batch = batch_;
  for (size_t i = 0; i < old_keys.size(); ++i) {
    const std::string& from = old_keys[i];
    const std::string& to = new_keys[i];
    if (!batch.contains(from)) {
      return make_error(ErrorCode::not_found, "rename: batch key '{}' not found", from);
    }
    if (from == to) continue;
    if (batch.contains(to)) {
      return make_error(ErrorCode::already_exists, "rename: batch key '{}' already exists", to);
    }
    batch.rename_key(from, to);
  }
  batch_ = std::move(batch);
  return Status();
}

Status DataProto::union_(const DataProto& other) {
  bool self_has_rows = !batch_.empty() || !non_tensor_batch_.empty();
  bool other_has_rows = !other.batch_.empty() || !other.non_tensor_batch_.empty();
  if (self_has_rows && other_has_rows && size() != other.size()) {
    return make_error(ErrorCode::invalid_argument, "union_: sizes differ ({} vs {})", size(),
                      other.size());
  }
  TensorDict batch = batch_;
  for (const auto& kv : other.batch_) {
    const std::string& key = kv.first;
    const at::Tensor& t = kv.second;  // not a structured binding: lambdas capture it (C++17)
    if (const at::Tensor* mine = batch.find(key)) {
      bool equal = false;
      TESSERA_RETURN_IF_ERROR(internal::guard("union_", [&]() -> Status {
        equal = internal::tensors_equal_nan(*mine, t);
        return Status();
      }));
      if (!equal) {
        return make_error(ErrorCode::invalid_argument,
                          "union_: batch key '{}' holds different values in the two DataProtos", key);
      }
    } else {
      batch.insert_or_assign(key, t);
    }
  }
  NonTensorBatch columns = non_tensor_batch_;
  for (const auto& [key, c] : other.non_tensor_batch_) {
    if (const Column* mine = columns.find(key)) {
      if (!mine->equals(c)) {
        return make_error(ErrorCode::invalid_argument,
                          "union_: non_tensor_batch key '{}' holds different values", key);
      }
    } else {
      columns.insert_or_assign(key, c);
    }
  }
  json meta = meta_info_;
  for (const auto& [key, v] : other.meta_info_.items()) {
    if (meta.contains(key) && meta[key] != v) {
      return make_error(ErrorCode::invalid_argument,
                        "union_: meta_info key '{}' holds different values", key);
    }
    meta[key] = v;
  }
  batch_ = std::move(batch);
  non_tensor_batch_ = std::move(columns);
  meta_info_ = std::move(meta);
  return Status();
}

}  // namespace tessera::proto
