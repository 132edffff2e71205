// column.hpp: one non-tensor column of a DataProto (verl's `non_tensor_batch[key]`, an object
// ndarray in Python): per-row values of one type, string / int64 / double / JSON.
//
// A Column is a cheap value: a view (offset, rows, row stride, width) onto shared, immutable
// storage. Slicing, chunking and splitting make views and copy no values; gathers (take) copy.
// `concat` of views that are adjacent in the same storage re-joins them without copying
// (Note [Zero-copy chunk/concat] in proto/data_proto_views.cpp).
//
// Width: a row normally holds one value (width 1). After fold_batch_dim a row holds `width`
// consecutive values (numpy's reshape of an object array to [b, B/b]).
//
// Thread-safety: const methods may be called concurrently; storage is never mutated.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "proto/status.hpp"

namespace tessera::proto {

/// The value type of a Column. Numbers are the wire format's enum values.
enum class ColumnType : uint8_t { string = 0, int64 = 1, float64 = 2, json = 3 };

/// "string" / "int64" / "float64" / "json".
const char* to_string(ColumnType type);

/// Per-row non-tensor values of one ColumnType: a view onto shared immutable storage.
class Column {
 public:
  /// The shared storage: exactly one of the vectors, according to the type.
  using Values = std::variant<std::vector<std::string>, std::vector<int64_t>,
                              std::vector<double>, std::vector<nlohmann::json>>;

  /// An empty string column (0 rows).
  Column();

  /// Owning columns of width 1 (one value per row).
  static Column strings(std::vector<std::string> values);
  static Column int64s(std::vector<int64_t> values);
  static Column doubles(std::vector<double> values);
  static Column jsons(std::vector<nlohmann::json> values);

  /// A column of `values.size() / width` rows of `width` values each.
  /// Errors: width < 1, or values.size() not divisible by width.
  static Result<Column> from_values(Values values, int64_t width = 1);

  /// Builds a width-1 column of `type` from a JSON array of scalars (strings for string, integers
  /// for int64, numbers for float64, anything for json). Errors name the offending row.
  static Result<Column> from_json(const nlohmann::json& array, ColumnType type);

  ColumnType type() const;
  /// Number of rows.
  int64_t size() const { return rows_; }
  /// Values per row (1 unless folded).
  int64_t width() const { return width_; }

  /// Typed element access. REQUIRES: type() matches, 0 <= row < size(), 0 <= j < width().
  /// A violated REQUIRES aborts (it is a bug, not bad input).
  const std::string& str(int64_t row, int64_t j = 0) const;
  int64_t i64(int64_t row, int64_t j = 0) const;
  double f64(int64_t row, int64_t j = 0) const;
  const nlohmann::json& json_value(int64_t row, int64_t j = 0) const;

  /// Row `row` as JSON: the scalar for width 1, an array of `width` values otherwise.
  /// REQUIRES: 0 <= row < size().
  nlohmann::json row_json(int64_t row) const;
  /// All rows as a JSON array (of row_json values).
  nlohmann::json to_json() const;

  /// View of rows [start, start + step * count) with the given step; copies nothing.
  /// REQUIRES: step >= 1, count >= 0, and the rows exist.
  Column view(int64_t start, int64_t count, int64_t step = 1) const;
  /// A new owning column holding rows `rows` in order (gather; copies values).
  /// REQUIRES: every index in [0, size()).
  Column take(const std::vector<int64_t>& rows) const;
  /// The same rows with `width() * factor` values per row, i.e. size() / factor rows.
  /// REQUIRES: size() % factor == 0, factor >= 1. Copies only when the view is strided.
  Column fold(int64_t factor) const;
  /// Each row split into width() rows of width 1. Copies only when the view is strided.
  Column unfold() const;
  /// A compact, owning deep copy (own storage, offset 0, stride 1).
  Column compact() const;

  /// Row-concatenation. Adjacent views of one storage (same width, stride 1) are re-joined
  /// without copying; anything else is copied into new storage.
  /// Errors: empty list, different types or widths (naming the index of the first mismatch).
  static Result<Column> concat(const std::vector<Column>& parts);

  /// Same type, width, rows and values; doubles compare NaN == NaN (numpy's equal_nan).
  bool equals(const Column& other) const;

  /// Identity of the shared storage (for proving views share it); never dereference.
  const void* storage_id() const { return storage_.get(); }
  /// First element's index in the storage, and the row stride in rows.
  int64_t storage_offset() const { return offset_; }
  int64_t row_stride() const { return stride_; }
  /// The shared storage (all of it, not only this view's rows).
  const Values& storage() const { return *storage_; }

 private:
  Column(std::shared_ptr<const Values> storage, int64_t offset, int64_t rows, int64_t stride,
         int64_t width);
  /// Storage index of element (row, j).
  int64_t element_index(int64_t row, int64_t j) const {
    return offset_ + row * stride_ * width_ + j;
  }
  void check_access(ColumnType type, int64_t row, int64_t j) const;

  std::shared_ptr<const Values> storage_;
  int64_t offset_ = 0;  // element index of row 0
  int64_t rows_ = 0;
  int64_t stride_ = 1;  // in rows
  int64_t width_ = 1;
};

}  // namespace tessera::proto
