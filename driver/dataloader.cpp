// StatefulDataLoader (driver/data.hpp).
#include "driver/data.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <torch/torch.h>

namespace tessera::driver {

Result<StatefulDataLoader> StatefulDataLoader::create(int64_t dataset_size, const DataLoaderOptions& options) {
  if (options.batch_size < 1) {
    return make_error(ErrorCode::invalid_argument, "dataloader batch size {} must be >= 1", options.batch_size);
  }
  if (dataset_size < 0) return make_error(ErrorCode::invalid_argument, "dataset size {} is negative", dataset_size);
  if (options.drop_last && dataset_size < options.batch_size) {
    return make_error(ErrorCode::invalid_argument,
                      "the dataset has {} rows, fewer than one batch of {} (drop_last): no batch would be produced",
                      dataset_size, options.batch_size);
  }
  StatefulDataLoader d;
  d.options_ = options;
  d.dataset_size_ = dataset_size;
  d.compute_order();
  return d;
}

int64_t StatefulDataLoader::size() const {
  const int64_t b = options_.batch_size;
  return options_.drop_last ? dataset_size_ / b : (dataset_size_ + b - 1) / b;
}

// Note [Sampler order]: torch's RandomSampler with a seeded generator (verl's create_rl_sampler)
// yields randperm(n) and then `randperm(n)[:num_samples % n]`, i.e. it draws TWO permutations per
// exhausted epoch from one stream, and the DataLoader always exhausts it. So epoch e's order is
// draw 2e (tests/driver/data_test.cpp checks it against PyTorch's RandomSampler).
// Replaying the earlier draws is what makes a restored loader continue the exact sequence.
void StatefulDataLoader::compute_order() {
  order_.resize(static_cast<size_t>(dataset_size_));
  if (!options_.shuffle) {
    for (int64_t i = 0; i < dataset_size_; ++i) order_[static_cast<size_t>(i)] = i;
    return;
  }
  at::Generator gen = at::detail::createCPUGenerator(options_.seed);
  at::Tensor perm;
  for (int64_t e = 0; e <= epoch_; ++e) {
    perm = at::randperm(dataset_size_, gen, at::kLong);
    at::randperm(dataset_size_, gen, at::kLong);  // the sampler's trailing [:0] draw
  }
  auto a = perm.accessor<int64_t, 1>();
  for (int64_t i = 0; i < dataset_size_; ++i) order_[static_cast<size_t>(i)] = a[i];
}

std::optional<std::vector<int64_t>> StatefulDataLoader::next() {
  if (batch_index_ >= size()) {
    ++epoch_;
    batch_index_ = 0;
    compute_order();
    return std::nullopt;
  }
  const int64_t start = batch_index_ * options_.batch_size;
  const int64_t stop = std::min(start + options_.batch_size, dataset_size_);
  ++batch_index_;
  return std::vector<int64_t>(order_.begin() + start, order_.begin() + stop);
}

nlohmann::json StatefulDataLoader::state_dict() const {
  return {{"epoch", epoch_},
          {"batch_index", batch_index_},
          {"seed", options_.seed},
          {"shuffle", options_.shuffle},
          {"drop_last", options_.drop_last},
          {"batch_size", options_.batch_size},
          {"dataset_size", dataset_size_}};
}

Status StatefulDataLoader::load_state_dict(const nlohmann::json& state) {
  auto field = [&](const char* key) -> Result<nlohmann::json> {
    if (!state.is_object() || !state.contains(key)) {
      return make_error(ErrorCode::corrupt_data, "dataloader state: missing '{}'", key);
    }
    return state[key];
  };
  auto must_equal = [&](const char* key, const nlohmann::json& mine) -> Status {
    TESSERA_ASSIGN_OR_RETURN(nlohmann::json v, field(key));
    if (v != mine) {
      return make_error(ErrorCode::invalid_argument, "dataloader state: '{}' is {} but this loader has {}", key,
                        v.dump(), mine.dump());
    }
    return Status();
  };
  for (const char* key : {"seed", "shuffle", "drop_last", "batch_size", "dataset_size"}) {
    TESSERA_RETURN_IF_ERROR(must_equal(key, state_dict()[key]));
  }
  TESSERA_ASSIGN_OR_RETURN(nlohmann::json epoch, field("epoch"));
  TESSERA_ASSIGN_OR_RETURN(nlohmann::json index, field("batch_index"));
  if (!epoch.is_number_integer() || epoch.get<int64_t>() < 0 || !index.is_number_integer() ||
      index.get<int64_t>() < 0 || index.get<int64_t>() > size()) {
    return make_error(ErrorCode::corrupt_data, "dataloader state: epoch {} / batch_index {} out of range (0..{})",
                      epoch.dump(), index.dump(), size());
  }
  epoch_ = epoch.get<int64_t>();
  batch_index_ = index.get<int64_t>();
  compute_order();
  return Status();
}

}  // namespace tessera::driver
