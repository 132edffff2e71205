#include "driver/internal/jsonl.hpp"

#include <fstream>

namespace tessera::driver::internal {

Status for_each_jsonl(const std::filesystem::path& path,
                      const std::function<Status(const nlohmann::json& row, const std::string& where)>& fn) {
  if (path.extension() == ".parquet") {
    return make_error(ErrorCode::unimplemented,
                      "{}: parquet is not supported; convert it to JSONL (one JSON object per line)", path.string());
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::not_found, "{}: cannot open the file", path.string());
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    std::string where = path.string() + ":" + std::to_string(lineno);
    nlohmann::json row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (row.is_discarded()) return make_error(ErrorCode::corrupt_data, "{}: not valid JSON", where);
    if (!row.is_object()) return make_error(ErrorCode::corrupt_data, "{}: expected a JSON object", where);
    TESSERA_RETURN_IF_ERROR(fn(row, where));
  }
  if (in.bad()) return make_error(ErrorCode::io_error, "{}: read error", path.string());
  return Status();
}

}  // namespace tessera::driver::internal
