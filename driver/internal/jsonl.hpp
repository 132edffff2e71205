// jsonl.hpp: reading JSON-lines files with FILE:LINE errors (private to driver/).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "proto/status.hpp"

namespace tessera::driver::internal {

/// Calls `fn(row, where)` for each non-blank line of `path`, where `where` is "FILE:LINE".
/// A line that is not a JSON object is an error "FILE:LINE: why"; errors from `fn` stop the scan.
Status for_each_jsonl(const std::filesystem::path& path,
                      const std::function<Status(const nlohmann::json& row, const std::string& where)>& fn);

/// A dataset row. Its objects keep their keys in file order (JSONL) or schema order (parquet), as
/// Python's dicts do: a chat template's `tojson` of tool-call arguments prints them in that order
/// in transformers, and so must ours.
using Record = nlohmann::ordered_json;

/// A dataset's rows: parquet files (by extension: .parquet) through Arrow, where "FILE:row N";
/// anything else as JSONL. A build without Arrow refuses parquet in one line naming the file.
Status for_each_record(const std::filesystem::path& path,
                       const std::function<Status(const Record& row, const std::string& where)>& fn);

}  // namespace tessera::driver::internal
