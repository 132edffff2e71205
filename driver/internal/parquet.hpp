// parquet.hpp (private to driver/): rows of a parquet file as JSON objects, the way verl's
// datasets read them with pandas/datasets: one object per row, column name -> value, nested
// lists and structs as JSON arrays and objects (verl's `prompt` messages, `reward_model` and
// `extra_info`), null for missing values. Read with Apache Arrow's C++ library (PyPI's pyarrow
// wheel ships it); its headers need C++20 and stay inside parquet.cpp.
#pragma once

#include <filesystem>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "driver/internal/jsonl.hpp"
#include "proto/status.hpp"

namespace tessera::driver::internal {

/// Calls `fn(row, where)` for every row in file order; `where` is "FILE:row N" (N counts from
/// 0, as pandas' index does). Errors, one line each: the file cannot be opened or is not
/// parquet, a column has a type with no JSON form (naming the column and type), or `fn`'s.
Status for_each_parquet_row(const std::filesystem::path& path,
                            const std::function<Status(const Record& row, const std::string& where)>& fn);

}  // namespace tessera::driver::internal
