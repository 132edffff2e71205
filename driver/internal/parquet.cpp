// Parquet rows as JSON (driver/internal/parquet.hpp). Compiled as C++20 without the shared
// precompiled header (Arrow's headers need C++20; cmake: Note [Arrow from pyarrow]).
#include "driver/internal/parquet.hpp"

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <parquet/arrow/reader.h>

#include <fmt/format.h>

#include <cmath>

namespace tessera::driver::internal {
namespace {

using json = Record;  // struct fields keep the schema's order

template <class ListArray>
arrow::Result<json> list_value(const ListArray& a, int64_t i);

// a[i] as JSON. `column` names the column in errors.
arrow::Result<json> value_at(const arrow::Array& a, int64_t i) {
  if (a.IsNull(i)) return json(nullptr);
  using T = arrow::Type;
  switch (a.type_id()) {
    case T::NA: return json(nullptr);
    case T::BOOL: return json(static_cast<const arrow::BooleanArray&>(a).Value(i));
    case T::INT8: return json(static_cast<const arrow::Int8Array&>(a).Value(i));
    case T::INT16: return json(static_cast<const arrow::Int16Array&>(a).Value(i));
    case T::INT32: return json(static_cast<const arrow::Int32Array&>(a).Value(i));
    case T::INT64: return json(static_cast<const arrow::Int64Array&>(a).Value(i));
    case T::UINT8: return json(static_cast<const arrow::UInt8Array&>(a).Value(i));
    case T::UINT16: return json(static_cast<const arrow::UInt16Array&>(a).Value(i));
    case T::UINT32: return json(static_cast<const arrow::UInt32Array&>(a).Value(i));
    case T::UINT64: return json(static_cast<const arrow::UInt64Array&>(a).Value(i));
    case T::FLOAT:
    case T::DOUBLE: {
      const double v = a.type_id() == T::FLOAT ? static_cast<const arrow::FloatArray&>(a).Value(i)
                                               : static_cast<const arrow::DoubleArray&>(a).Value(i);
      return std::isnan(v) ? json(nullptr) : json(v);  // pandas' NaN is "missing"
    }
    // pandas 3 writes str columns as large_string; HF datasets writes string.
    case T::STRING: return json(std::string(static_cast<const arrow::StringArray&>(a).GetView(i)));
    case T::LARGE_STRING: return json(std::string(static_cast<const arrow::LargeStringArray&>(a).GetView(i)));
    case T::STRING_VIEW: return json(std::string(static_cast<const arrow::StringViewArray&>(a).GetView(i)));
    case T::BINARY: return json(std::string(static_cast<const arrow::BinaryArray&>(a).GetView(i)));
    case T::LARGE_BINARY: return json(std::string(static_cast<const arrow::LargeBinaryArray&>(a).GetView(i)));
    case T::LIST: return list_value(static_cast<const arrow::ListArray&>(a), i);
    case T::LARGE_LIST: return list_value(static_cast<const arrow::LargeListArray&>(a), i);
    case T::FIXED_SIZE_LIST: return list_value(static_cast<const arrow::FixedSizeListArray&>(a), i);
    case T::STRUCT: {
      const auto& s = static_cast<const arrow::StructArray&>(a);
      const auto& type = static_cast<const arrow::StructType&>(*s.type());
      json out = json::object();
      for (int f = 0; f < type.num_fields(); ++f) {
        // field(f) applies the struct's own offset (values() would not).
        ARROW_ASSIGN_OR_RAISE(out[type.field(f)->name()], value_at(*s.field(f), i));
      }
      return out;
    }
    case T::MAP: {
      const auto& m = static_cast<const arrow::MapArray&>(a);
      json out = json::object();
      for (int64_t k = m.value_offset(i), e = k + m.value_length(i); k < e; ++k) {
        ARROW_ASSIGN_OR_RAISE(json key, value_at(*m.keys(), k));
        ARROW_ASSIGN_OR_RAISE(json value, value_at(*m.items(), k));
        out[key.is_string() ? key.get<std::string>() : key.dump()] = std::move(value);
      }
      return out;
    }
    case T::DICTIONARY: {
      const auto& d = static_cast<const arrow::DictionaryArray&>(a);
      return value_at(*d.dictionary(), d.GetValueIndex(i));
    }
    default:
      // Dates, times, decimals, unions...: not in verl's datasets; named rather than guessed.
      return arrow::Status::TypeError("values of type ", a.type()->ToString(), " cannot be read as dataset values");
  }
}

template <class ListArray>
arrow::Result<json> list_value(const ListArray& a, int64_t i) {
  json out = json::array();
  const arrow::Array& values = *a.values();
  for (int64_t k = a.value_offset(i), e = k + a.value_length(i); k < e; ++k) {
    ARROW_ASSIGN_OR_RAISE(json v, value_at(values, k));
    out.push_back(std::move(v));
  }
  return out;
}

Status from_arrow(const arrow::Status& st, const std::filesystem::path& path) {
  if (st.ok()) return Status();
  const ErrorCode code = st.IsIOError() ? ErrorCode::io_error : ErrorCode::corrupt_data;
  std::string msg = st.message();
  if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
  return make_error(code, "{}: {}", path.string(), msg);
}

}  // namespace

Status for_each_parquet_row(const std::filesystem::path& path,
                            const std::function<Status(const Record& row, const std::string& where)>& fn) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return make_error(ErrorCode::not_found, "{}: cannot open the file", path.string());
  }
  auto file = arrow::io::ReadableFile::Open(path.string());
  if (!file.ok()) return from_arrow(file.status(), path);
  // The system pool is malloc (and so Tessera's allocator), not Arrow's bundled mimalloc.
  auto reader = parquet::arrow::OpenFile(*file, arrow::system_memory_pool());
  if (!reader.ok()) return from_arrow(reader.status(), path);
  int64_t row = 0;
  for (int rg = 0; rg < (*reader)->num_row_groups(); ++rg) {
    auto table = (*reader)->ReadRowGroup(rg);
    if (!table.ok()) return from_arrow(table.status(), path);
    arrow::TableBatchReader batches(**table);
    for (;;) {
      std::shared_ptr<arrow::RecordBatch> batch;
      TESSERA_RETURN_IF_ERROR(from_arrow(batches.ReadNext(&batch), path));
      if (batch == nullptr) break;
      const auto& schema = *batch->schema();
      for (int64_t r = 0; r < batch->num_rows(); ++r, ++row) {
        const std::string where = fmt::format("{}:row {}", path.string(), row);
        json out = json::object();
        for (int c = 0; c < batch->num_columns(); ++c) {
          const std::string& name = schema.field(c)->name();
          if (name == "__index_level_0__") continue;  // pandas' saved index
          auto v = value_at(*batch->column(c), r);
          if (!v.ok()) return make_error(ErrorCode::corrupt_data, "{}: column '{}': {}", where, name, v.status().message());
          out[name] = std::move(*v);
        }
        TESSERA_RETURN_IF_ERROR(fn(out, where));
      }
    }
  }
  return Status();
}

}  // namespace tessera::driver::internal
