// errors.cpp: errc <-> ErrorCode, Status <-> caf::error.
#include "runtime/errors.hpp"

#include <caf/deep_to_string.hpp>
#include <caf/exit_reason.hpp>
#include <caf/message.hpp>
#include <caf/sec.hpp>

namespace tessera::runtime {
namespace {

#define TESSERA_SAME_CODE(name) \
  static_assert(static_cast<uint8_t>(errc::name) == static_cast<uint8_t>(ErrorCode::name))
TESSERA_SAME_CODE(invalid_argument);
TESSERA_SAME_CODE(out_of_range);
TESSERA_SAME_CODE(not_found);
TESSERA_SAME_CODE(already_exists);
TESSERA_SAME_CODE(corrupt_data);
TESSERA_SAME_CODE(io_error);
TESSERA_SAME_CODE(timeout);
TESSERA_SAME_CODE(unavailable);
TESSERA_SAME_CODE(permission_denied);
TESSERA_SAME_CODE(unimplemented);
TESSERA_SAME_CODE(internal);
TESSERA_SAME_CODE(resource_exhausted);
TESSERA_SAME_CODE(cancelled);
#undef TESSERA_SAME_CODE
static_assert(static_cast<uint8_t>(errc::none) == static_cast<uint8_t>(ErrorCode::ok));

// The ErrorCode closest to a CAF system error.
ErrorCode from_sec(caf::sec code) {
  switch (code) {
    case caf::sec::request_timeout:
      return ErrorCode::timeout;
    case caf::sec::request_receiver_down:
    case caf::sec::no_route_to_receiving_node:
    case caf::sec::cannot_connect_to_node:
    case caf::sec::disconnect_during_handshake:
    case caf::sec::cannot_forward_to_invalid_actor:
    case caf::sec::no_actor_published_at_port:
    case caf::sec::socket_disconnected:
    case caf::sec::socket_invalid:
      return ErrorCode::unavailable;
    case caf::sec::cannot_open_port:
    case caf::sec::network_syscall_failed:
    case caf::sec::cannot_open_file:
      return ErrorCode::io_error;
    case caf::sec::unknown_type:
      return ErrorCode::not_found;
    case caf::sec::invalid_argument:
    case caf::sec::unexpected_actor_messaging_interface:
    case caf::sec::cannot_spawn_actor_from_arguments:
      return ErrorCode::invalid_argument;
    case caf::sec::feature_disabled:
      return ErrorCode::unimplemented;
    default:
      return ErrorCode::internal;
  }
}

// Text of a CAF error: "caf system error request_timeout (context)".
std::string describe(const caf::error& error, const std::string& code_name) {
  std::string text = "caf " + caf::to_string(error.category()) + " error " + code_name;
  if (!error.context().empty()) text += " " + caf::deep_to_string(error.context());
  return text;
}

}  // namespace

std::string to_string(errc code) {
  return tessera::to_string(static_cast<ErrorCode>(code));
}

caf::error to_caf_error(const Status& status) {
  if (status.ok()) return caf::error{};
  return caf::make_error(static_cast<errc>(status.code()), status.message());
}

Status to_status(const caf::error& error) {
  if (!error) return Status();
  if (error.category() == kErrorCategory) {
    auto code = static_cast<ErrorCode>(error.code());
    const caf::message& ctx = error.context();
    if (ctx.match_elements<std::string>()) return Status(code, ctx.get_as<std::string>(0));
    return Status(code, caf::deep_to_string(ctx));
  }
  if (error.category() == caf::atom("system")) {
    auto code = static_cast<caf::sec>(error.code());
    return Status(from_sec(code), describe(error, caf::to_string(code)));
  }
  if (error.category() == caf::atom("exit")) {
    auto reason = static_cast<caf::exit_reason>(error.code());
    return Status(ErrorCode::unavailable, describe(error, caf::to_string(reason)));
  }
  return Status(ErrorCode::internal, describe(error, std::to_string(error.code())));
}

}  // namespace tessera::runtime
