// errors.hpp: the runtime's CAF error enum and the Status <-> caf::error conversions.
//
// `errc` mirrors tessera::ErrorCode value for value (static_asserts in errors.cpp) and is
// registered with CAF under the category atom "tessera", so an error raised by a worker on one
// node arrives on another as the same code. The Status message travels as the error's context
// (one std::string), so it survives serialisation.
//
// CAF's own errors (category "system": sec, "exit": exit_reason) convert to the closest
// ErrorCode: request_timeout -> timeout, unreachable/disconnected peers -> unavailable, ...
//
// Thread-safety: free functions, no state.
#pragma once

#include <cstdint>
#include <string>

#include <caf/atom.hpp>
#include <caf/error.hpp>

#include "proto/status.hpp"

namespace tessera::runtime {

/// CAF error codes of the runtime; numerically identical to tessera::ErrorCode.
enum class errc : uint8_t {
  none = 0,
  invalid_argument,
  out_of_range,
  not_found,
  already_exists,
  corrupt_data,
  io_error,
  timeout,
  unavailable,
  permission_denied,
  unimplemented,
  internal,
  resource_exhausted,
  cancelled,
};

/// Name of an errc value ("invalid_argument", ...); used by CAF's error renderer.
std::string to_string(errc code);

/// The CAF error category atom of errc.
inline constexpr caf::atom_value kErrorCategory = caf::atom("tessera");

/// A caf::error carrying the Status code and its message. An ok Status gives an empty error.
caf::error to_caf_error(const Status& status);

/// The Status for a caf::error: the original Status for errors made by to_caf_error (also after
/// crossing nodes), the closest ErrorCode for CAF's own categories. An empty error gives ok.
Status to_status(const caf::error& error);

}  // namespace tessera::runtime

CAF_ERROR_CODE_ENUM(tessera::runtime::errc, "tessera")
