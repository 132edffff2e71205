// check.hpp: argument validation and exception fencing shared by the algos .cpp files.
//
// Every public algos function validates its tensors up front (so a bad shape gives a one-line
// invalid_argument naming the function and the argument), then runs its body inside `guarded`,
// which turns any c10::Error / std::exception that LibTorch still throws into an internal error.
// No exception leaves tessera::algos.
#pragma once

#include <exception>
#include <string>
#include <utility>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include "proto/status.hpp"

namespace tessera::algos::internal {

/// "[8, 6]" for error messages.
std::string shape_str(const at::Tensor& t);

/// Error unless `t` is defined and has exactly `dim` dimensions.
Status check_dim(const char* fn, const char* name, const at::Tensor& t, int64_t dim);

/// Error unless `t` is defined and has at least `dim` dimensions.
Status check_min_dim(const char* fn, const char* name, const at::Tensor& t, int64_t dim);

/// Error unless `t` is defined and floating point.
Status check_floating(const char* fn, const char* name, const at::Tensor& t);

/// Error unless both tensors are defined and have identical shapes.
Status check_same_shape(const char* fn, const char* a_name, const at::Tensor& a, const char* b_name,
                        const at::Tensor& b);

/// Error unless `t` is a defined (bs, T) floating tensor.
Status check_matrix(const char* fn, const char* name, const at::Tensor& t);

/// Error unless `mask` is defined, has `ref`'s shape, and `ref` is a floating (bs, T) matrix.
Status check_matrix_and_mask(const char* fn, const char* ref_name, const at::Tensor& ref,
                             const char* mask_name, const at::Tensor& mask);

/// Runs `body` (returning Result<T> or Status) and converts any exception into an internal error.
template <class F>
auto guarded(const char* fn, F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const c10::Error& e) {
    return make_error(ErrorCode::internal, "{}: LibTorch error: {}", fn, e.what_without_backtrace());
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, "{}: {}", fn, e.what());
  }
}

}  // namespace tessera::algos::internal
