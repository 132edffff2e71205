// internal/tensor_ops.hpp: helpers shared by DataProto's .cpp files. Private to proto/.
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <type_traits>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include "proto/data_proto.hpp"
#include "proto/status.hpp"

namespace tessera::proto {

/// Builds and edits DataProto internals for proto/'s own .cpp files (results already valid).
class DataProtoAccess {
 public:
  static DataProto make(TensorDict batch, NonTensorBatch columns, nlohmann::json meta) {
    DataProto d;
    d.batch_ = std::move(batch);
    d.non_tensor_batch_ = std::move(columns);
    // Note [Empty meta_info] (data_proto.cpp): an empty object is kept as null.
    if (!(meta.is_object() && meta.empty())) d.meta_info_ = std::move(meta);
    return d;
  }
  /// meta_info as stored: null when empty (Note [Empty meta_info]); copying it allocates nothing.
  static const nlohmann::json& stored_meta(const DataProto& d) { return d.meta_info_; }
  static TensorDict& batch(DataProto& d) { return d.batch_; }
  static NonTensorBatch& columns(DataProto& d) { return d.non_tensor_batch_; }
};

namespace internal {

/// Runs `f` (returning Status or Result<T>); a c10::Error or std::exception escaping from LibTorch
/// becomes an error whose message is prefixed with `what` (one line, no backtrace).
template <class F>
auto guard(const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error& e) {
    std::string msg = e.what_without_backtrace();
    if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
    return Status(ErrorCode::invalid_argument, std::string(what) + ": " + msg);
  } catch (const std::exception& e) {
    return Status(ErrorCode::internal, std::string(what) + ": " + e.what());
  }
}

/// Rows start, start+step, ... (count of them) of every tensor and column, as views.
/// REQUIRES: the rows exist, step >= 1, count >= 0. meta_info is copied.
DataProto view_rows(const DataProto& d, int64_t start, int64_t count, int64_t step = 1);

/// view_rows(d, start, count) for each (start, count) of `ranges`, in order: what chunk and
/// split return (each tensor's view test is made once, not once per piece).
std::vector<DataProto> view_row_ranges(const DataProto& d,
                                       const std::vector<std::pair<int64_t, int64_t>>& ranges);

/// Rows `idx` (each in [0, size)) of every tensor and column, copied (gather). meta copied.
Result<DataProto> gather_rows(const DataProto& d, const std::vector<int64_t>& idx,
                              const char* what);

/// Normalises an index list against `n` rows (negatives count from the end).
/// Error names the first bad index, prefixed by `what`.
Result<std::vector<int64_t>> normalize_indices(const std::vector<int64_t>& idx, int64_t n,
                                               const char* what);
/// Converts a 1-D integer tensor (indices) or bool tensor (mask) to normalised indices.
Result<std::vector<int64_t>> indices_from_tensor(const at::Tensor& idx, int64_t n,
                                                 const char* what);

/// Same shape, dtype and values; floating NaN == NaN. Identical views compare without a scan.
bool tensors_equal_nan(const at::Tensor& a, const at::Tensor& b);

/// If `parts` are adjacent dim-0 views of one storage (as chunk() makes them), the single view
/// spanning all of them (no copy); otherwise an undefined tensor.
at::Tensor try_join_adjacent(const std::vector<at::Tensor>& parts);

/// Row count implied by a DataProto's keys (first tensor's dim 0, else first column, else 0).
int64_t rows_of(const TensorDict& batch, const NonTensorBatch& columns);

}  // namespace internal
}  // namespace tessera::proto
