// paged_kv.cpp: PagedKV's allocation (Note [Paged KV cache] in paged_kv.hpp).
#include "workers/rollout/paged_kv.hpp"

#include <torch/torch.h>

namespace tessera::rollout {

Result<PagedKV> PagedKV::create(const models::ModelConfig& config, c10::ScalarType dtype, int64_t num_blocks,
                                int64_t block_size, c10::Device device) {
  if (num_blocks < 2 || block_size < 1) {
    return make_error(ErrorCode::invalid_argument, "PagedKV: {} blocks of {} tokens (need >= 2 blocks, >= 1 token)",
                      num_blocks, block_size);
  }
  PagedKV kv;
  kv.block_size = block_size;
  const std::vector<int64_t> shape = {num_blocks, block_size, config.num_key_value_heads, config.head_dim};
  const auto options = at::TensorOptions().dtype(dtype).device(device);
  try {
    for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
      kv.keys.push_back(at::zeros(shape, options));
      kv.values.push_back(at::zeros(shape, options));
    }
  } catch (const std::exception& e) {
    const int64_t bytes = 2 * config.num_hidden_layers * num_blocks * block_size * config.num_key_value_heads *
                          config.head_dim * static_cast<int64_t>(c10::elementSize(dtype));
    return make_error(ErrorCode::resource_exhausted,
                      "rollout KV cache: cannot allocate {} blocks of {} tokens ({:.2f} GiB) on {}; lower "
                      "rollout.max_num_seqs or the prompt/response length: {}",
                      num_blocks, block_size, static_cast<double>(bytes) / (1 << 30), device.str(),
                      std::string(e.what()).substr(0, 200));
  }
  return kv;
}

int64_t PagedKV::bytes() const {
  int64_t total = 0;
  for (const auto& t : keys) total += t.numel() * static_cast<int64_t>(t.element_size());
  return 2 * total;
}

StepInputs step_inputs(const at::Tensor& table, int64_t width) {
  return StepInputs{table.narrow(1, width + kTokenId, 1), table.narrow(1, width + kPosition, 1),
                    PagedBatch{table.narrow(1, 0, width), table.select(1, width + kContextLen),
                               table.select(1, width + kSlot)}};
}

}  // namespace tessera::rollout
