// data_proto_views.cpp: indexing, slice, chunk, split and concat.
//
// Note [Zero-copy chunk/concat]
// chunk, split, slice and index(Slice) never copy bytes. A tensor piece is `narrow(0, start, n)`
// (or a strided `slice` for step > 1) of the original, sharing its storage (built directly for
// plain tensors: Note [Fast row views] in tensor_ops.cpp); a column piece is a
// Column view (shared immutable storage, element offset, rows, row stride). Dispatch splits a
// batch into world-size chunks, so this is what keeps DP_COMPUTE_PROTO free of copies in process.
//
// concat looks for the reverse: if the i-th input's tensor under a key starts in the same
// storage exactly where the (i-1)-th ends (storage_offset + size(0) * stride(0)), with equal
// dtype, device, strides and trailing sizes, the result is ONE as_strided view over the whole
// range; the same test on columns (same storage, stride 1, offset + rows * width) gives one
// column view. So chunk(8) + concat costs O(keys), not O(bytes). Anything else (gathered rows,
// outputs computed by workers, tensors requiring grad) is copied with at::cat.
//
// Note [meta_info merge in concat]
// verl v0.5.0 kept data[0].meta_info and silently dropped the metrics of every other rank; verl
// main merges. Tessera follows main, made exact:
//   * "metrics": every input's value (an object, or a list of objects) contributes, key by key,
//     to an object of lists: a scalar is appended, a list is appended element by element
//     (flattened), so concat(concat(a, b), c) == concat(a, b, c). A null value is skipped.
//   * any other key: kept once; an input whose value differs from an earlier one is an error
//     naming the key and both input indices. Keys absent from some inputs are fine.
#include "proto/data_proto.hpp"

#include <map>

#include <torch/torch.h>

#include "proto/internal/tensor_ops.hpp"

namespace tessera::proto {
namespace {

using json = nlohmann::json;

Status add_metrics(const json& metrics, size_t input, json& merged) {
  if (!metrics.is_object()) {
    return make_error(ErrorCode::invalid_argument,
                      "concat: meta_info['metrics'] of input {} must be an object or a list of "
                      "objects, got {}", input, metrics.type_name());
  }
  for (const auto& [key, value] : metrics.items()) {
    json& list = merged[key];
    if (list.is_null()) list = json::array();
    if (value.is_array()) {
      for (const auto& v : value) list.push_back(v);
    } else {
      list.push_back(value);
    }
  }
  return Status();
}

/// Note [meta_info merge in concat].
Result<json> merge_meta(const std::vector<const DataProto*>& data) {
  json merged;   // null until a key arrives (Note [Empty meta_info])
  json metrics;  // made an object by its first key
  bool any_metrics = false;
  std::map<std::string, size_t> origin;
  for (size_t i = 0; i < data.size(); ++i) {
    // Iterators, not items(): each items() range builds strings, even over an empty object,
    // and this runs for every rank's output of every DP collect.
    const json& meta = DataProtoAccess::stored_meta(*data[i]);
    if (!meta.is_object()) continue;  // null: empty (Note [Empty meta_info])
    for (auto entry = meta.begin(); entry != meta.end(); ++entry) {
      const std::string& key = entry.key();
      const json& value = entry.value();
      if (key == "metrics") {
        if (value.is_null()) continue;
        any_metrics = true;
        const bool list = value.is_array();
        for (size_t j = 0; j < (list ? value.size() : 1); ++j) {
          TESSERA_RETURN_IF_ERROR(add_metrics(list ? value[j] : value, i, metrics));
        }
      } else if (auto it = origin.find(key); it != origin.end()) {
        if (merged[key] != value) {
          return make_error(ErrorCode::invalid_argument,
                            "concat: meta_info key '{}' differs between input {} and input {}", key,
                            it->second, i);
        }
      } else {
        origin[key] = i;
        merged[key] = value;
      }
    }
  }
  if (any_metrics) merged["metrics"] = std::move(metrics);
  return merged;
}

/// Whether every input holds input 0's keys in input 0's order: the usual case (pieces of one
/// split, or one method's outputs), where key k of each input is found at position k.
template <class Dict>
bool same_key_order(const std::vector<const DataProto*>& data, const Dict& (DataProto::*get)() const) {
  const Dict& first = (data[0]->*get)();
  for (size_t i = 1; i < data.size(); ++i) {
    const Dict& d = (data[i]->*get)();
    if (d.size() != first.size()) return false;
    auto a = first.begin();
    for (auto b = d.begin(); a != first.end(); ++a, ++b) {
      if (a->first != b->first) return false;
    }
  }
  return true;
}

/// Every input must hold exactly the keys of input 0. Returns whether they are in its order.
template <class Dict>
Result<bool> check_same_keys(const std::vector<const DataProto*>& data,
                             const Dict& (DataProto::*get)() const, const char* kind) {
  if (same_key_order(data, get)) return true;
  const Dict& first = (data[0]->*get)();
  for (size_t i = 1; i < data.size(); ++i) {
    const Dict& d = (data[i]->*get)();
    for (const auto& kv : first) {
      if (!d.contains(kv.first)) {
        return make_error(ErrorCode::invalid_argument, "concat: {} key '{}' is missing from input {}",
                          kind, kv.first, i);
      }
    }
    for (const auto& kv : d) {
      if (!first.contains(kv.first)) {
        return make_error(ErrorCode::invalid_argument,
                          "concat: {} key '{}' of input {} is missing from input 0", kind, kv.first, i);
      }
    }
  }
  return false;
}

/// Input i's value for `key`, which is at `position` when the inputs' keys are in one order.
template <class Dict>
const auto& value_of(const Dict& d, const std::string& key, size_t position, bool in_order) {
  return in_order ? (d.begin() + static_cast<std::ptrdiff_t>(position))->second : *d.find(key);
}

Result<at::Tensor> concat_tensors(const std::vector<const DataProto*>& data, const std::string& key,
                                  size_t position, bool in_order) {
  std::vector<at::Tensor> parts;
  parts.reserve(data.size());
  for (const DataProto* d : data) parts.push_back(value_of(d->batch(), key, position, in_order));
  if (at::Tensor joined = internal::try_join_adjacent(parts); joined.defined()) return joined;
  std::string what = "concat: batch key '" + key + "'";
  return internal::guard(what.c_str(), [&]() -> Result<at::Tensor> { return at::cat(parts, 0); });
}

}  // namespace

Result<DataProtoItem> DataProto::index(int64_t i) const {
  const int64_t n = size();
  if (i < -n || i >= n) {
    return make_error(ErrorCode::out_of_range, "index: row {} is out of range for {} rows", i, n);
  }
  if (i < 0) i += n;
  DataProtoItem item;
  for (const auto& [key, t] : batch_) item.batch.insert_or_assign(key, t.select(0, i));
  for (const auto& [key, c] : non_tensor_batch_) item.non_tensor_batch.insert_or_assign(key, c.view(i, 1));
  item.meta_info = meta_info();
  return item;
}

Result<DataProto> DataProto::index(const Slice& s) const { return slice(s.start, s.stop, s.step); }
Result<DataProto> DataProto::index(const at::Tensor& idxs) const { return select_idxs(idxs); }
Result<DataProto> DataProto::index(const std::vector<int64_t>& idxs) const { return select_idxs(idxs); }
Result<DataProto> DataProto::index(const std::vector<bool>& mask) const { return select_idxs(mask); }

Result<DataProto> DataProto::slice(std::optional<int64_t> start, std::optional<int64_t> end,
                                   int64_t step) const {
  if (step < 1) {
    return make_error(ErrorCode::invalid_argument, "slice: step must be >= 1, got {}", step);
  }
  const int64_t n = size();
  // Python's slice.indices() for a positive step: negatives count from the end, then clamp.
  auto clamp = [n](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v < 0 ? *v + n : *v;
    return std::min(std::max<int64_t>(x, 0), n);
  };
  const int64_t lo = clamp(start, 0);
  const int64_t hi = clamp(end, n);
  const int64_t count = hi > lo ? (hi - lo + step - 1) / step : 0;
  return internal::view_rows(*this, lo, count, step);
}

Result<std::vector<DataProto>> DataProto::chunk(int64_t chunks) const {
  if (chunks < 1) return make_error(ErrorCode::invalid_argument, "chunk: chunks must be >= 1, got {}", chunks);
  const int64_t n = size();
  const bool divisible = n % chunks == 0;
  if (!divisible && !is_padding_enabled()) {
    return make_error(ErrorCode::invalid_argument,
                      "chunk({}): length {} is not divisible by {} and auto-padding is off "
                      "(only equal chunks are supported)", chunks, n, chunks);
  }
  // TensorDict.chunk follows torch.chunk: pieces of ceil(n / chunks) rows, the last shorter.
  const int64_t piece = divisible ? n / chunks : (n + chunks - 1) / chunks;
  const int64_t produced = divisible ? chunks : (n + piece - 1) / piece;
  if (produced != chunks) {
    return make_error(ErrorCode::invalid_argument,
                      "chunk({}): length {} splits into only {} chunks of {} rows; pad to a "
                      "multiple of {} first", chunks, n, produced, piece, chunks);
  }
  std::vector<std::pair<int64_t, int64_t>> ranges;
  ranges.reserve(static_cast<size_t>(chunks));
  for (int64_t i = 0; i < chunks; ++i) {
    const int64_t start = std::min(i * piece, n);
    ranges.emplace_back(start, std::min(piece, n - start));
  }
  return internal::view_row_ranges(*this, ranges);
}

Result<std::vector<DataProto>> DataProto::split(int64_t split_size) const {
  if (split_size < 1) {
    return make_error(ErrorCode::invalid_argument, "split: split_size must be >= 1, got {}", split_size);
  }
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int64_t start = 0, n = size(); start < n; start += split_size) {
    ranges.emplace_back(start, std::min(split_size, n - start));
  }
  return internal::view_row_ranges(*this, ranges);
}

Result<DataProto> DataProto::concat(const std::vector<DataProto>& data) {
  std::vector<const DataProto*> refs;
  refs.reserve(data.size());
  for (const DataProto& d : data) refs.push_back(&d);
  return concat(refs);
}

Result<DataProto> DataProto::concat(const std::vector<const DataProto*>& data) {
  if (data.empty()) return make_error(ErrorCode::invalid_argument, "concat: no DataProto to concatenate");
  TESSERA_ASSIGN_OR_RETURN(bool tensors_in_order, check_same_keys(data, &DataProto::batch, "batch"));
  TESSERA_ASSIGN_OR_RETURN(bool columns_in_order,
                           check_same_keys(data, &DataProto::non_tensor_batch, "non_tensor_batch"));
  TensorDict batch;
  size_t position = 0;
  for (const auto& kv : data[0]->batch()) {
    TESSERA_ASSIGN_OR_RETURN(at::Tensor t, concat_tensors(data, kv.first, position++, tensors_in_order));
    batch.insert_or_assign(kv.first, std::move(t));
  }
  NonTensorBatch columns;
  position = 0;
  for (const auto& kv : data[0]->non_tensor_batch()) {
    std::vector<Column> parts;
    parts.reserve(data.size());
    for (const DataProto* d : data) {
      parts.push_back(value_of(d->non_tensor_batch(), kv.first, position, columns_in_order));
    }
    ++position;
    auto joined = Column::concat(parts);
    if (!joined.ok()) return joined.status().with_context("concat: non_tensor_batch key '" + kv.first + "'");
    columns.insert_or_assign(kv.first, std::move(joined).value());
  }
  TESSERA_ASSIGN_OR_RETURN(json meta, merge_meta(data));
  return DataProtoAccess::make(std::move(batch), std::move(columns), std::move(meta));
}

}  // namespace tessera::proto
