// data_proto_shape.cpp: fold/unfold of the batch dim, make_iterator and to(device).
#include "proto/data_proto.hpp"
#include "proto/device.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "proto/internal/tensor_ops.hpp"

namespace tessera::proto {

Result<DataProto> DataProto::fold_batch_dim(int64_t new_batch_size) const {
  const int64_t n = size();
  if (new_batch_size < 1 || n == 0 || n % new_batch_size != 0) {
    return make_error(ErrorCode::invalid_argument,
                      "fold_batch_dim: batch size {} is not divisible by new_batch_size {}", n,
                      new_batch_size);
  }
  const int64_t inner = n / new_batch_size;
  return internal::guard("fold_batch_dim", [&]() -> Result<DataProto> {
    TensorDict batch;
    for (const auto& [key, t] : batch_) {
      std::vector<int64_t> shape{new_batch_size, inner};
      for (int64_t d = 1; d < t.dim(); ++d) shape.push_back(t.size(d));
      batch.insert_or_assign(key, t.reshape(shape));
    }
    NonTensorBatch columns;
    for (const auto& [key, c] : non_tensor_batch_) columns.insert_or_assign(key, c.fold(inner));
    return DataProtoAccess::make(std::move(batch), std::move(columns), meta_info_);
  });
}

Result<DataProto> DataProto::unfold_batch_dim(int64_t batch_dims) const {
  if (batch_dims < 1) {
    return make_error(ErrorCode::invalid_argument, "unfold_batch_dim: batch_dims must be >= 1, got {}",
                      batch_dims);
  }
  if (batch_dims > 2 && !non_tensor_batch_.empty()) {
    return make_error(ErrorCode::invalid_argument,
                      "unfold_batch_dim: non-tensor columns are 2-D at most, batch_dims {} > 2",
                      batch_dims);
  }
  std::vector<int64_t> lead;
  std::string lead_key;
  for (const auto& [key, t] : batch_) {
    if (t.dim() < batch_dims) {
      return make_error(ErrorCode::invalid_argument,
                        "unfold_batch_dim: tensor '{}' has {} dims, fewer than batch_dims {}", key,
                        t.dim(), batch_dims);
    }
    std::vector<int64_t> mine(t.sizes().begin(), t.sizes().begin() + batch_dims);
    if (lead_key.empty()) {
      lead = mine;
      lead_key = key;
    } else if (mine != lead) {
      return make_error(ErrorCode::invalid_argument,
                        "unfold_batch_dim: tensors '{}' and '{}' disagree on the first {} dims",
                        lead_key, key, batch_dims);
    }
  }
  for (const auto& [key, c] : non_tensor_batch_) {
    if (batch_dims == 2 && !lead_key.empty() && c.width() != lead[1]) {
      return make_error(ErrorCode::invalid_argument,
                        "unfold_batch_dim: column '{}' has width {} but tensor '{}' has dim 1 = {}",
                        key, c.width(), lead_key, lead[1]);
    }
  }
  return internal::guard("unfold_batch_dim", [&]() -> Result<DataProto> {
    TensorDict batch;
    for (const auto& [key, t] : batch_) batch.insert_or_assign(key, t.flatten(0, batch_dims - 1));
    NonTensorBatch columns;
    for (const auto& [key, c] : non_tensor_batch_) {
      columns.insert_or_assign(key, batch_dims == 2 ? c.unfold() : c);
    }
    return DataProtoAccess::make(std::move(batch), std::move(columns), meta_info_);
  });
}

Result<DataProto> fold_batch_dim(const DataProto& data, int64_t new_batch_size) {
  return data.fold_batch_dim(new_batch_size);
}

Result<DataProto> unfold_batch_dim(const DataProto& data, int64_t batch_dims) {
  return data.unfold_batch_dim(batch_dims);
}

Result<DataProtoIterator> DataProto::make_iterator(int64_t mini_batch_size, int64_t epochs,
                                                   int64_t seed, bool shuffle) const {
  if (mini_batch_size < 1) {
    return make_error(ErrorCode::invalid_argument, "make_iterator: mini_batch_size must be >= 1, got {}",
                      mini_batch_size);
  }
  if (epochs < 0) {
    return make_error(ErrorCode::invalid_argument, "make_iterator: epochs must be >= 0, got {}", epochs);
  }
  if (size() % mini_batch_size != 0) {
    return make_error(ErrorCode::invalid_argument, "make_iterator: {} % {} != 0", size(), mini_batch_size);
  }
  return DataProtoIterator(*this, mini_batch_size, epochs, seed, shuffle);
}

DataProtoIterator::DataProtoIterator(DataProto data, int64_t mini_batch_size, int64_t epochs,
                                     int64_t seed, bool shuffle)
    : data_(std::move(data)),
      mini_batch_size_(mini_batch_size),
      epochs_(epochs),
      batches_per_epoch_(data_.size() / mini_batch_size),
      shuffle_(shuffle),
      generator_(at::detail::createCPUGenerator(static_cast<uint64_t>(seed))) {}

void DataProtoIterator::start_epoch() {
  ++epoch_;
  batch_in_epoch_ = 0;
  if (!shuffle_) return;
  // verl's make_iterator is a torch DataLoader over a RandomSampler with this generator. Per
  // epoch torch draws: the DataLoader's base seed (one int64), randperm(n) for the order, and a
  // second randperm(n) whose first num_samples % n (none) entries RandomSampler would yield
  // after it. The same draws here give verl's order in every epoch
  // (tests/workers/algos/verl_parity_test.cpp checks it against verl's Python).
  at::empty({}, at::kLong).random_(generator_);
  order_ = at::randperm(data_.size(), generator_, at::kLong);
  (void)at::randperm(data_.size(), generator_, at::kLong);
}

std::optional<DataProto> DataProtoIterator::next() {
  if (epoch_ < 0 || batch_in_epoch_ == batches_per_epoch_) {
    if (epoch_ + 1 >= epochs_ || batches_per_epoch_ == 0) return std::nullopt;
    start_epoch();
  }
  const int64_t start = batch_in_epoch_ * mini_batch_size_;
  ++batch_in_epoch_;
  if (!shuffle_) return internal::view_rows(data_, start, mini_batch_size_);
  const int64_t* p = order_.data_ptr<int64_t>() + start;
  // The rows are valid by construction, so gather_rows cannot fail here.
  auto batch = internal::gather_rows(data_, std::vector<int64_t>(p, p + mini_batch_size_), "make_iterator");
  if (!batch.ok()) return std::nullopt;
  return std::move(batch).value();
}

Status DataProto::to(const c10::Device& device, bool non_blocking) {
  TensorDict moved;
  std::optional<c10::Device> synchronize_on;  // a GPU whose copies to pinned memory are in flight
  for (const auto& kv : batch_) {
    const std::string& key = kv.first;
    const at::Tensor& t = kv.second;  // not a structured binding: the lambda captures it (C++17)
    std::string what = "to(" + device.str() + "): batch key '" + key + "'";
    TESSERA_RETURN_IF_ERROR(internal::guard(what.c_str(), [&]() -> Status {
      if (t.device() == device) {
        moved.insert_or_assign(key, t);
      } else if (non_blocking && device.is_cpu() && t.is_cuda()) {
        at::Tensor host = at::empty(t.sizes(), t.options().device(device).pinned_memory(true));
        host.copy_(t, /*non_blocking=*/true);
        synchronize_on = t.device();
        moved.insert_or_assign(key, std::move(host));
      } else {
        moved.insert_or_assign(key, t.to(device, /*non_blocking=*/non_blocking && device.is_cuda()));
      }
      return Status();
    }));
  }
  if (synchronize_on) synchronize(*synchronize_on);
  batch_ = std::move(moved);
  return Status();
}

}  // namespace tessera::proto
