#include "driver/internal/jsonl.hpp"

#include <fstream>

#if TESSERA_WITH_PARQUET
#include "driver/internal/parquet.hpp"
#endif

namespace tessera::driver::internal {
namespace {

template <typename Json>
Status scan_jsonl(const std::filesystem::path& path,
                  const std::function<Status(const Json& row, const std::string& where)>& fn) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::not_found, "{}: cannot open the file", path.string());
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    std::string where = path.string() + ":" + std::to_string(lineno);
    Json row = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (row.is_discarded()) return make_error(ErrorCode::corrupt_data, "{}: not valid JSON", where);
    if (!row.is_object()) return make_error(ErrorCode::corrupt_data, "{}: expected a JSON object", where);
    TESSERA_RETURN_IF_ERROR(fn(row, where));
  }
  if (in.bad()) return make_error(ErrorCode::io_error, "{}: read error", path.string());
  return Status();
}

}  // namespace

Status for_each_jsonl(const std::filesystem::path& path,
                      const std::function<Status(const nlohmann::json& row, const std::string& where)>& fn) {
  return scan_jsonl<nlohmann::json>(path, fn);
}

Status for_each_record(const std::filesystem::path& path,
                       const std::function<Status(const Record& row, const std::string& where)>& fn) {
  if (path.extension() != ".parquet") return scan_jsonl<Record>(path, fn);
#if TESSERA_WITH_PARQUET
  return for_each_parquet_row(path, fn);
#else
  return make_error(ErrorCode::unimplemented,
                    "{}: this build reads no parquet (configured without pyarrow's Arrow; deploy/dev.sh deps installs "
                    "it): convert the file to JSONL or rebuild", path.string());
#endif
}

}  // namespace tessera::driver::internal
