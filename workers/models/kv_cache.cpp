#include "workers/models/kv_cache.hpp"

#include <torch/torch.h>

namespace tessera::models {

Result<KVCache> KVCache::create(const ModelConfig& config, const KVCacheOptions& options) {
  if (options.batch_size <= 0 || options.capacity <= 0) {
    return make_error(ErrorCode::invalid_argument, "KVCache: batch_size {} and capacity {} must be positive",
                      options.batch_size, options.capacity);
  }
  KVCache cache;
  cache.options_ = options;
  auto opts = at::TensorOptions().dtype(options.dtype).device(options.device);
  try {
    for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
      std::vector<int64_t> shape = {options.batch_size, config.num_key_value_heads, options.capacity, config.head_dim};
      cache.keys_.push_back(at::zeros(shape, opts));
      cache.values_.push_back(at::zeros(shape, opts));
    }
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, "KVCache: cannot allocate {} x {} columns: {}", options.batch_size,
                      options.capacity, e.what());
  }
  return cache;
}

Status KVCache::reset_row(int64_t row) {
  if (row < 0 || row >= options_.batch_size) {
    return make_error(ErrorCode::out_of_range, "KVCache::reset_row: row {} not in [0, {})", row, options_.batch_size);
  }
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < keys_.size(); ++i) {
    keys_[i].select(0, row).zero_();
    values_[i].select(0, row).zero_();
  }
  return Status();
}

}  // namespace tessera::models
