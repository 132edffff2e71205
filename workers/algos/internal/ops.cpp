#include "workers/algos/internal/ops.hpp"

#include <torch/torch.h>

namespace tessera::algos::internal {

at::Tensor as_value_mask(const at::Tensor& mask, const at::Tensor& like) {
  return mask.scalar_type() == like.scalar_type() ? mask : mask.to(like.scalar_type());
}

at::Tensor masked_sum(const at::Tensor& values, const at::Tensor& mask, std::optional<int64_t> axis) {
  const at::Tensor m = as_value_mask(mask, values);
  // where() first so that NaN/inf in masked-out slots cannot leak through 0 * NaN.
  const at::Tensor valid = at::where(m != 0, values, at::zeros({}, values.options()));
  const at::Tensor prod = valid * m;
  return axis ? prod.sum(*axis) : prod.sum();
}

at::Tensor masked_mean(const at::Tensor& values, const at::Tensor& mask, std::optional<int64_t> axis) {
  const at::Tensor m = as_value_mask(mask, values);
  const at::Tensor count = axis ? m.sum(*axis) : m.sum();
  return masked_sum(values, m, axis) / (count + 1e-8);
}

Result<at::Tensor> masked_var(const at::Tensor& values, const at::Tensor& mask, bool unbiased) {
  const at::Tensor m = as_value_mask(mask, values);
  const at::Tensor mean = masked_mean(values, m, std::nullopt);
  const at::Tensor centered = values - mean;
  at::Tensor variance = masked_mean(centered * centered, m, std::nullopt);
  if (!unbiased) return variance;
  const double mask_sum = m.sum().item<double>();
  if (mask_sum == 0.0) {
    return make_error(ErrorCode::invalid_argument, "masked_var: at least one element in the mask has to be 1");
  }
  if (mask_sum == 1.0) {
    return make_error(ErrorCode::invalid_argument,
                      "masked_var: the sum of the mask is one, which can cause a division by zero");
  }
  return variance * (mask_sum / (mask_sum - 1.0));
}

Result<at::Tensor> masked_whiten(const at::Tensor& values, const at::Tensor& mask, bool shift_mean) {
  const at::Tensor mean = masked_mean(values, mask, std::nullopt);
  TESSERA_ASSIGN_OR_RETURN(at::Tensor var, masked_var(values, mask, /*unbiased=*/true));
  at::Tensor whitened = (values - mean) * at::rsqrt(var + 1e-8);
  if (!shift_mean) whitened = whitened + mean;
  return whitened;
}

}  // namespace tessera::algos::internal
