// tokenizer_json.cpp: reading tokenizer files from disk.
#include "workers/tokenizer/tokenizer_json.hpp"

#include <fstream>
#include <sstream>
#include <system_error>
#include <filesystem>

namespace tessera::tokenizer::tokenizer_json {

Result<nlohmann::json> read_json_file(const std::string& file) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) {
    return make_error(ErrorCode::not_found, "{}: no such file", file);
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) return make_error(ErrorCode::io_error, "{}: cannot open for reading", file);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return make_error(ErrorCode::io_error, "{}: read failed", file);
  try {
    return nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::parse_error& e) {
    return make_error(ErrorCode::corrupt_data, "{}: not valid JSON (byte {}: {})", file, e.byte,
                      e.what());
  }
}

}  // namespace tessera::tokenizer::tokenizer_json
