#include "workers/algos/internal/check.hpp"

#include <fmt/format.h>

namespace tessera::algos::internal {

std::string shape_str(const at::Tensor& t) {
  if (!t.defined()) return "undefined";
  return fmt::format("[{}]", fmt::join(t.sizes(), ", "));
}

static Status check_defined(const char* fn, const char* name, const at::Tensor& t) {
  if (t.defined()) return Status();
  return make_error(ErrorCode::invalid_argument, "{}: '{}' is undefined (a tensor is required)", fn, name);
}

Status check_dim(const char* fn, const char* name, const at::Tensor& t, int64_t dim) {
  TESSERA_RETURN_IF_ERROR(check_defined(fn, name, t));
  if (t.dim() == dim) return Status();
  return make_error(ErrorCode::invalid_argument, "{}: '{}' must have {} dims, got shape {}", fn, name, dim,
                    shape_str(t));
}

Status check_min_dim(const char* fn, const char* name, const at::Tensor& t, int64_t dim) {
  TESSERA_RETURN_IF_ERROR(check_defined(fn, name, t));
  if (t.dim() >= dim) return Status();
  return make_error(ErrorCode::invalid_argument, "{}: '{}' must have at least {} dims, got shape {}", fn,
                    name, dim, shape_str(t));
}

Status check_floating(const char* fn, const char* name, const at::Tensor& t) {
  TESSERA_RETURN_IF_ERROR(check_defined(fn, name, t));
  if (t.is_floating_point()) return Status();
  return make_error(ErrorCode::invalid_argument, "{}: '{}' must be floating point, got {}", fn, name,
                    std::string(c10::toString(t.scalar_type())));
}

Status check_same_shape(const char* fn, const char* a_name, const at::Tensor& a, const char* b_name,
                        const at::Tensor& b) {
  TESSERA_RETURN_IF_ERROR(check_defined(fn, a_name, a));
  TESSERA_RETURN_IF_ERROR(check_defined(fn, b_name, b));
  if (a.sizes() == b.sizes()) return Status();
  return make_error(ErrorCode::invalid_argument, "{}: '{}' has shape {} but '{}' has shape {}", fn, a_name,
                    shape_str(a), b_name, shape_str(b));
}

Status check_matrix(const char* fn, const char* name, const at::Tensor& t) {
  TESSERA_RETURN_IF_ERROR(check_dim(fn, name, t, 2));
  return check_floating(fn, name, t);
}

Status check_matrix_and_mask(const char* fn, const char* ref_name, const at::Tensor& ref,
                             const char* mask_name, const at::Tensor& mask) {
  TESSERA_RETURN_IF_ERROR(check_matrix(fn, ref_name, ref));
  return check_same_shape(fn, ref_name, ref, mask_name, mask);
}

}  // namespace tessera::algos::internal
