#include "proto/status.hpp"

namespace tessera {

const char* to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::ok: return "ok";
    case ErrorCode::invalid_argument: return "invalid_argument";
    case ErrorCode::out_of_range: return "out_of_range";
    case ErrorCode::not_found: return "not_found";
    case ErrorCode::already_exists: return "already_exists";
    case ErrorCode::corrupt_data: return "corrupt_data";
    case ErrorCode::io_error: return "io_error";
    case ErrorCode::timeout: return "timeout";
    case ErrorCode::unavailable: return "unavailable";
    case ErrorCode::permission_denied: return "permission_denied";
    case ErrorCode::unimplemented: return "unimplemented";
    case ErrorCode::internal: return "internal";
    case ErrorCode::resource_exhausted: return "resource_exhausted";
    case ErrorCode::cancelled: return "cancelled";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(tessera::to_string(code_)) + ": " + message_;
}

Status Status::with_context(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

}  // namespace tessera
