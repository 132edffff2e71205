// data_proto.hpp: DataProto, verl's batch container (verl/protocol.py), in C++.
//
// A DataProto holds
//   batch            ordered name -> at::Tensor, every tensor sharing dim 0 (the row count);
//   non_tensor_batch ordered name -> Column of per-row values (string / int64 / double / JSON);
//   meta_info        a JSON object (temperature, micro_batch_size, metrics, ...).
// Method names and semantics are verl's (reference/verl-fsdp.md §2) with these differences:
//   * Every precondition verl asserts returns a Status error instead, naming the key or index.
//   * DataProto is a value type. Copies are shallow for tensors and columns (they alias the same
//     storage, like Python references to the same TensorDict) and deep for meta_info.
//   * In-place methods stay in place (pop, rename, union_, reorder, to); `padding` does NOT mutate
//     the caller (verl's does, which is how auto-padding leaked into callers): it returns a new one.
//   * chunk/split/slice/unpad and index(Slice) return VIEWS: tensors via narrow /
//     strided slicing and columns as (storage, offset, length) views; no bytes are copied.
//     `concat` of adjacent views re-joins them in O(1) (Note [Zero-copy chunk/concat]).
//   * `concat` merges meta_info like verl main, not v0.5.0: `metrics` from every input are kept
//     as lists; any other key must agree across inputs.
//   * `union_` compares tensors NaN-aware (verl's tensor.equal fails on NaN).
//
// Thread-safety: a DataProto is not synchronised. Const methods may run concurrently on one
// object; views share storage, so writing through a tensor is visible in every view of it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include "proto/column.hpp"
#include "proto/ordered_dict.hpp"
#include "proto/status.hpp"

namespace tessera::proto {

/// verl's TensorDict with one batch dim: ordered name -> tensor.
using TensorDict = OrderedDict<at::Tensor>;
/// verl's `non_tensor_batch`: ordered name -> column.
using NonTensorBatch = OrderedDict<Column>;
/// An optional key list: nullopt means "all keys" in select and "no keys" in pop (verl's None).
using Keys = std::optional<std::vector<std::string>>;

/// meta_info key that turns on auto-padding for one DataProto (verl's name).
inline constexpr const char* kAutoPaddingKey = "_verl_auto_padding";

/// A Python-style slice: start/stop may be negative (counted from the end) or absent.
struct Slice {
  std::optional<int64_t> start;
  std::optional<int64_t> stop;
  int64_t step = 1;  ///< Must be >= 1 (tensors have no negative strides).
};

/// What integer indexing returns (verl's DataProtoItem): row i of every tensor and column.
struct DataProtoItem {
  TensorDict batch;                ///< tensor[i] of every batch tensor (views, dim 0 removed).
  NonTensorBatch non_tensor_batch;  ///< one-row views of every column.
  nlohmann::json meta_info = nlohmann::json::object();
};

/// Options of DataProto::from_dict.
struct FromDictOptions {
  bool auto_padding = false;  ///< Sets meta_info["_verl_auto_padding"] = true.
};

class DataProtoIterator;

/// verl's DataProto: tensors + non-tensor columns sharing a row count, plus meta_info.
class DataProto {
 public:
  /// An empty DataProto: no keys, size() == 0, meta_info == {}.
  DataProto();

  /// Builds and validates a DataProto (verl's from_dict). Errors: a tensor with no dim 0 or a
  /// dim 0 / column length that disagrees with the first key's (naming both keys), meta_info
  /// that is not a JSON object.
  static Result<DataProto> from_dict(TensorDict tensors, NonTensorBatch non_tensors = {},
                                     nlohmann::json meta_info = nlohmann::json::object(),
                                     const FromDictOptions& options = {});

  // ---- Accessors -----------------------------------------------------------------------------
  /// Row count: dim 0 of the first tensor, else the first column's length, else 0 (verl's len).
  int64_t size() const;
  /// The tensors, in key order.
  const TensorDict& batch() const { return batch_; }
  /// The non-tensor columns, in key order.
  const NonTensorBatch& non_tensor_batch() const { return non_tensor_batch_; }
  /// meta_info; a JSON object. Mutable: meta_info carries no invariant except being an object.
  /// REQUIRES: callers keep it an object. (Note [Empty meta_info]: an empty one is stored as
  /// null, which neither accessor shows: the const one reads as `{}`, the mutable one makes it
  /// `{}` first.)
  nlohmann::json& meta_info() {
    if (meta_info_.is_null()) meta_info_ = nlohmann::json::object();
    return meta_info_;
  }
  const nlohmann::json& meta_info() const {
    return meta_info_.is_null() ? empty_meta_info() : meta_info_;
  }

  /// The tensor under `key`; not_found names the key.
  Result<at::Tensor> tensor(const std::string& key) const;
  /// The column under `key`; not_found names the key.
  Result<Column> column(const std::string& key) const;
  /// Inserts or replaces a tensor (verl's `data.batch[key] = t`). Error if its dim 0 differs
  /// from size() while other keys exist, or it is 0-dim.
  Status set_tensor(const std::string& key, at::Tensor tensor);
  /// Inserts or replaces a column. Error if its length differs from size() while keys exist.
  Status set_column(const std::string& key, Column column);

  /// verl's check_consistency: every tensor has dim 0 == size(), every column size() rows,
  /// meta_info is an object. Always ok for objects built through this API.
  Status check_consistency() const;
  /// True if meta_info["_verl_auto_padding"] is true, or env VERL_AUTO_PADDING is TRUE/1.
  bool is_padding_enabled() const;

  // ---- Indexing (verl's __getitem__) ----------------------------------------------------------
  /// Row i (negative counts from the end). out_of_range if outside [-size, size).
  Result<DataProtoItem> index(int64_t i) const;
  /// Python slice; a view (same as slice()).
  Result<DataProto> index(const Slice& s) const;
  /// Row gather by indices (negative allowed), or by a bool mask when `idxs` is kBool
  /// (same as select_idxs()).
  Result<DataProto> index(const at::Tensor& idxs) const;
  Result<DataProto> index(const std::vector<int64_t>& idxs) const;
  Result<DataProto> index(const std::vector<bool>& mask) const;

  // ---- Row selection ---------------------------------------------------------------------------
  /// Rows by index (int tensor / list, negatives allowed) or bool mask (length must equal
  /// size()). Copies (gather). meta_info is copied. Errors: out-of-range index, mask length,
  /// non-integer non-bool tensor, tensor not 1-D.
  Result<DataProto> select_idxs(const at::Tensor& idxs) const;
  Result<DataProto> select_idxs(const std::vector<int64_t>& idxs) const;
  Result<DataProto> select_idxs(const std::vector<bool>& mask) const;
  /// Rows [start:end:step] with Python clamping semantics; a VIEW. Error if step < 1.
  Result<DataProto> slice(std::optional<int64_t> start = std::nullopt,
                          std::optional<int64_t> end = std::nullopt, int64_t step = 1) const;

  // ---- Keys ------------------------------------------------------------------------------------
  /// A new DataProto with a subset of keys (nullopt: all keys of that kind). Tensors are never
  /// copied; `deepcopy` copies columns (meta_info is always copied). Error names a missing key.
  Result<DataProto> select(const Keys& batch_keys = std::nullopt,
                           const Keys& non_tensor_batch_keys = std::nullopt,
                           const Keys& meta_info_keys = std::nullopt, bool deepcopy = false) const;
  /// Removes the keys from *this and returns them as a new DataProto (nullopt: none of that
  /// kind). All keys are checked first: on error *this is unchanged.
  Result<DataProto> pop(const Keys& batch_keys = std::nullopt,
                        const Keys& non_tensor_batch_keys = std::nullopt,
                        const Keys& meta_info_keys = std::nullopt);
  /// Renames batch keys in place, keeping their positions. Errors: length mismatch, missing old
  /// key, new key already present (unless it is itself being renamed away). Atomic on error.
  Status rename(const std::vector<std::string>& old_keys, const std::vector<std::string>& new_keys);
  /// verl's union: adds other's keys to *this in place. Sizes must match when both hold rows;
  /// a key present in both must hold equal values (tensors: same shape/dtype, values equal with
  /// NaN == NaN; columns: Column::equals; meta: JSON ==). Error names the key; atomic on error.
  Status union_(const DataProto& other);

  // ---- Splitting and joining -------------------------------------------------------------------
  /// n VIEWS of consecutive rows, each with a copy of meta_info. Without padding enabled,
  /// size() % n must be 0. With padding enabled, follows TensorDict.chunk (ceil-sized pieces)
  /// and errors when that yields fewer than n chunks. Error if n < 1.
  Result<std::vector<DataProto>> chunk(int64_t n) const;
  /// VIEWS of `split_size` rows each; the last may be shorter (verl's split). Error if < 1.
  Result<std::vector<DataProto>> split(int64_t split_size) const;
  /// Row-concatenation. Every input must have the same batch and column keys (a key missing
  /// from one input is an error naming it and the input index). Adjacent views of the same
  /// storage (chunk + concat) are re-joined in O(1) bytes; otherwise tensors are copied
  /// (at::cat). meta_info: Note [meta_info merge in concat] (metrics kept as lists, other keys
  /// must agree; error names the key). Error on an empty list.
  static Result<DataProto> concat(const std::vector<DataProto>& data);
  /// The same over DataProtos held elsewhere (no copies of the inputs). REQUIRES: no null.
  static Result<DataProto> concat(const std::vector<const DataProto*>& data);

  // ---- Reordering and repetition ---------------------------------------------------------------
  /// In place: rows become this[indices] (verl's reorder; a gather, so it copies).
  Status reorder(const at::Tensor& indices);
  /// Each row `times` times: interleave -> aabb (repeat_interleave), else abab (tile). New
  /// object, copies. Error if times < 0.
  Result<DataProto> repeat(int64_t times, bool interleave = true) const;
  /// Row i repeated counts[i] times (verl's sample_level_repeat). Errors: counts.size() !=
  /// size(), a negative count.
  Result<DataProto> sample_level_repeat(const std::vector<int64_t>& counts) const;
  /// Same, from a 1-D integer tensor.
  Result<DataProto> sample_level_repeat(const at::Tensor& counts) const;

  // ---- Padding ---------------------------------------------------------------------------------
  /// A NEW DataProto with `padding_size` copies of the last row ("" or "last") or of the first
  /// ("first") appended. *this is never mutated. Errors: negative size, unknown candidate,
  /// padding an empty DataProto by > 0 rows.
  Result<DataProto> padding(int64_t padding_size, const std::string& padding_candidate = "") const;
  /// verl's pad_dataproto_to_divisor: appends rows copied from the BEGINNING (wrapping as often
  /// as needed) until size() % divisor == 0. Returns (padded, pad_size); pad_size == 0 returns an
  /// alias of *this (also for an empty DataProto, as in verl). Error: divisor < 1.
  Result<std::pair<DataProto, int64_t>> pad_to_divisor(int64_t size_divisor) const;
  /// verl's unpad_dataproto: drops the last pad_size rows (a view). Error if pad_size is
  /// negative or > size().
  Result<DataProto> unpad(int64_t pad_size) const;

  // ---- Shape -----------------------------------------------------------------------------------
  /// verl's fold_batch_dim: [B, ...] -> [new_batch_size, B / new_batch_size, ...] for every
  /// tensor; columns get width *= B / new_batch_size. Error unless B % new_batch_size == 0.
  Result<DataProto> fold_batch_dim(int64_t new_batch_size) const;
  /// verl's unfold_batch_dim: merges the first batch_dims dims of every tensor into dim 0.
  /// Columns (2-D at most) support batch_dims == 2 only. Errors: batch_dims < 1, a tensor with
  /// fewer dims, tensors disagreeing on the leading dims.
  Result<DataProto> unfold_batch_dim(int64_t batch_dims = 2) const;

  // ---- Iteration -------------------------------------------------------------------------------
  /// verl's make_iterator: an iterator yielding size()/mini_batch_size mini-batches per epoch for
  /// `epochs` epochs, each with meta_info re-attached. With shuffle, each epoch is a fresh
  /// permutation drawn from a torch CPU generator seeded with `seed` (deterministic); without,
  /// rows come in order. Errors: mini_batch_size < 1, size() % mini_batch_size != 0, epochs < 0.
  Result<DataProtoIterator> make_iterator(int64_t mini_batch_size, int64_t epochs = 1,
                                          int64_t seed = 0, bool shuffle = false) const;

  // ---- Devices and files -----------------------------------------------------------------------
  /// Moves every tensor to `device`, in place (verl's to). Error (naming the key) if the device
  /// is not available; on error *this is unchanged. With `non_blocking`, copies to a GPU are
  /// queued on the current stream, and copies from a GPU land in pinned host memory with one
  /// synchronisation at the end (Note [Crossing the worker boundary] in proto/device.hpp).
  Status to(const c10::Device& device, bool non_blocking = false);
  /// Writes the wire format (proto/codec.hpp) to `path` atomically: a temporary sibling file is
  /// written, fsync'ed and renamed over `path`. Errors name the path.
  Status save(const std::string& path) const;
  /// Reads a file written by save(): memory-maps it and decodes zero-copy (tensors alias the
  /// mapping, copy-on-write). Errors (missing, truncated, corrupt) name the path.
  static Result<DataProto> load(const std::string& path);

 private:
  friend class DataProtoAccess;  // proto/internal helpers that build results without re-checks

  /// The `{}` that the const meta_info() shows for an empty (null) meta_info_.
  static const nlohmann::json& empty_meta_info();

  TensorDict batch_;
  NonTensorBatch non_tensor_batch_;
  nlohmann::json meta_info_;  // null: empty (Note [Empty meta_info])
};

/// Deterministic mini-batch iterator returned by DataProto::make_iterator.
class DataProtoIterator {
 public:
  /// The next mini-batch, or nullopt when all epochs are done.
  std::optional<DataProto> next();
  /// Mini-batches per epoch.
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  /// Total mini-batches over all epochs.
  int64_t total_batches() const { return batches_per_epoch_ * epochs_; }

 private:
  friend class DataProto;
  DataProtoIterator(DataProto data, int64_t mini_batch_size, int64_t epochs, int64_t seed,
                    bool shuffle);
  void start_epoch();

  DataProto data_;
  int64_t mini_batch_size_ = 1;
  int64_t epochs_ = 0;
  int64_t batches_per_epoch_ = 0;
  bool shuffle_ = false;
  int64_t epoch_ = -1;
  int64_t batch_in_epoch_ = 0;
  at::Tensor order_;      // row order of the current epoch (int64), undefined when not shuffling
  at::Generator generator_;
};

/// verl's pad_dataproto_to_divisor (module function); same as data.pad_to_divisor(k).
Result<std::pair<DataProto, int64_t>> pad_dataproto_to_divisor(const DataProto& data,
                                                               int64_t size_divisor);
/// verl's unpad_dataproto; same as data.unpad(pad_size).
Result<DataProto> unpad_dataproto(const DataProto& data, int64_t pad_size);
/// verl's fold_batch_dim (module function).
Result<DataProto> fold_batch_dim(const DataProto& data, int64_t new_batch_size);
/// verl's unfold_batch_dim (module function).
Result<DataProto> unfold_batch_dim(const DataProto& data, int64_t batch_dims = 2);

}  // namespace tessera::proto
