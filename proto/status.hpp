// status.hpp: Tessera's error vocabulary. Errors are values; no exception crosses a component
// or actor boundary (STYLE.md rule 6).
//
// These two types live in namespace `tessera` rather than `tessera::proto` because every layer
// uses them; proto/ is simply the lowest folder. runtime/ maps them onto a CAF error enum.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace tessera {

/// Error categories. Keep in sync with runtime's CAF error enum (same numeric values).
enum class ErrorCode : uint8_t {
  ok = 0,
  invalid_argument,  ///< Caller passed something that violates a documented precondition.
  out_of_range,      ///< An index, size or length is outside what is allowed.
  not_found,         ///< A key, file, method or actor does not exist.
  already_exists,    ///< A key or name is taken.
  corrupt_data,      ///< Bytes from disk or network do not decode (bad frame, bad checkpoint).
  io_error,          ///< The operating system refused a file or socket operation.
  timeout,           ///< A finite deadline expired.
  unavailable,       ///< A peer (rank, agent, host) is dead or unreachable.
  permission_denied, ///< Authentication failed or a file has unsafe permissions.
  unimplemented,     ///< The feature is not built (fails loudly instead of pretending).
  internal,          ///< An invariant broke inside Tessera, or a library threw unexpectedly.
  resource_exhausted,///< Memory (a device's, or the host's) ran out.
  cancelled,         ///< Given up unanswered because another part of the same call failed first.
};

/// Human-readable name of an ErrorCode ("invalid_argument", ...).
const char* to_string(ErrorCode code);

/// An error code plus a one-line message with context (key, file, rank...). Cheap when ok.
class Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }

  bool ok() const { return code_ == ErrorCode::ok; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }

  /// "invalid_argument: chunk(3): length 8 is not divisible by 3".
  std::string to_string() const;

  /// Returns a copy whose message is prefixed with `context + ": "`.
  Status with_context(const std::string& context) const;

 private:
  ErrorCode code_ = ErrorCode::ok;
  std::string message_;
};

/// Builds a Status from a fmt format string: make_error(ErrorCode::not_found, "key '{}'", k).
template <class... Args>
Status make_error(ErrorCode code, fmt::format_string<Args...> f, Args&&... args) {
  return Status(code, fmt::format(f, std::forward<Args>(args)...));
}

/// Either a T or a non-ok Status. A minimal `expected<T, Status>` (C++17 has none).
template <class T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT: implicit by design
    if (std::get<Status>(v_).ok()) v_ = Status(ErrorCode::internal, "Result built from an ok Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }

  /// REQUIRES: ok().
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  /// The error; an ok Status when a value is held.
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace tessera

#define TESSERA_CONCAT_INNER_(a, b) a##b
#define TESSERA_CONCAT_(a, b) TESSERA_CONCAT_INNER_(a, b)

/// Returns the Status from the enclosing function if `expr` (a Status) is not ok.
#define TESSERA_RETURN_IF_ERROR(expr)            \
  do {                                           \
    ::tessera::Status _tessera_st = (expr);      \
    if (!_tessera_st.ok()) return _tessera_st;   \
  } while (0)

/// `TESSERA_ASSIGN_OR_RETURN(auto x, f());` unwraps a Result or returns its Status.
#define TESSERA_ASSIGN_OR_RETURN(lhs, expr) \
  TESSERA_ASSIGN_OR_RETURN_IMPL_(TESSERA_CONCAT_(_tessera_r_, __LINE__), lhs, expr)
#define TESSERA_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) return tmp.status();                  \
  lhs = std::move(tmp).value()
