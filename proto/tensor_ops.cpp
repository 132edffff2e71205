// tensor_ops.cpp: row views, gathers, index normalisation and the O(1) re-join of adjacent views.
#include "proto/internal/tensor_ops.hpp"

#include <algorithm>
#include <typeinfo>
#include <utility>
#include <vector>

#include <c10/core/InferenceMode.h>
#include <torch/torch.h>

#include "proto/host_transfer.hpp"

namespace tessera::proto::internal {
namespace {

// Note [Fast row views]
// Dispatch cuts every batch into world-size row views on the caller's thread and joins the
// answers back, so each call costs 2 x ranks x keys views. A view through LibTorch (narrow,
// slice, as_strided) costs ~1 us here: the dispatcher, the autograd and ADInplaceOrView kernels
// and a DifferentiableViewMeta. For a tensor that autograd cannot see through a view (no grad
// required, outside InferenceMode) and that is exactly a dense strided TensorImpl (no subclass:
// not quantized, sparse, nested, wrapped, named), a view is only "same storage, other sizes,
// strides and offset": building that TensorImpl directly costs ~0.1 us. It shares the base's
// version counter, as a view must, so an in-place write through it still invalidates anything
// autograd saved of the base. Every other tensor takes LibTorch's own view op.
bool plain_dense(const at::Tensor& t) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  return t.defined() && typeid(*impl) == typeid(c10::TensorImpl) &&
         t.layout() == c10::kStrided && !t.requires_grad() && !t.has_names() &&
         !t.is_inference() && !c10::InferenceMode::is_enabled() && impl->has_storage();
}

// The view of `t`'s storage with these sizes, strides and offset. REQUIRES: plain_dense(t) and
// the view within the storage.
at::Tensor direct_view(const at::Tensor& t, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                       int64_t offset) {
  const c10::TensorImpl* src = t.unsafeGetTensorImpl();
  auto impl = c10::make_intrusive<c10::TensorImpl>(c10::Storage(src->storage()), src->key_set(),
                                                   src->dtype());
  impl->set_sizes_and_strides(sizes, strides);
  impl->set_storage_offset(offset);
  impl->set_version_counter(src->version_counter());
  return at::Tensor(std::move(impl));
}

// Rows start, start+step, ... (count of them) of `t` as a view (Note [Fast row views]);
// `plain` is plain_dense(t).
at::Tensor row_view(const at::Tensor& t, int64_t start, int64_t count, int64_t step, bool plain) {
  if (plain && t.dim() > 0) {
    c10::SmallVector<int64_t, 6> sizes(t.sizes().begin(), t.sizes().end());
    c10::SmallVector<int64_t, 6> strides(t.strides().begin(), t.strides().end());
    const int64_t offset = t.storage_offset() + start * strides[0];
    sizes[0] = count;
    strides[0] *= step;
    return direct_view(t, sizes, strides, offset);
  }
  // Tensor::slice keeps a view; end is exclusive and past the last row taken.
  int64_t end = count == 0 ? start : start + (count - 1) * step + 1;
  return step == 1 ? t.narrow(0, start, count) : t.slice(0, start, end, step);
}

}  // namespace

int64_t rows_of(const TensorDict& batch, const NonTensorBatch& columns) {
  if (!batch.empty()) return batch.begin()->second.size(0);
  if (!columns.empty()) return columns.begin()->second.size();
  return 0;
}

namespace {

// Rows start, start+step, ... (count of them) of `d`; plain[k] is plain_dense of d's k-th tensor.
DataProto cut_rows(const DataProto& d, const std::vector<bool>& plain, int64_t start, int64_t count,
                   int64_t step) {
  TensorDict batch;
  size_t k = 0;
  for (const auto& [key, t] : d.batch()) batch.insert_or_assign(key, row_view(t, start, count, step, plain[k++]));
  NonTensorBatch columns;
  for (const auto& [key, c] : d.non_tensor_batch()) columns.insert_or_assign(key, c.view(start, count, step));
  return DataProtoAccess::make(std::move(batch), std::move(columns), DataProtoAccess::stored_meta(d));
}

std::vector<bool> plain_tensors(const DataProto& d) {
  std::vector<bool> plain;
  plain.reserve(d.batch().size());
  for (const auto& kv : d.batch()) plain.push_back(plain_dense(kv.second));
  return plain;
}

}  // namespace

DataProto view_rows(const DataProto& d, int64_t start, int64_t count, int64_t step) {
  return cut_rows(d, plain_tensors(d), start, count, step);
}

std::vector<DataProto> view_row_ranges(const DataProto& d,
                                       const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  const std::vector<bool> plain = plain_tensors(d);
  std::vector<DataProto> out;
  out.reserve(ranges.size());
  for (const auto& [start, count] : ranges) out.push_back(cut_rows(d, plain, start, count, 1));
  return out;
}

Result<DataProto> gather_rows(const DataProto& d, const std::vector<int64_t>& idx,
                              const char* what) {
  return guard(what, [&]() -> Result<DataProto> {
    at::Tensor index = torch::tensor(idx, torch::kLong);
    std::vector<std::pair<c10::Device, at::Tensor>> uploaded;  // once per device, without blocking
    TensorDict batch;
    for (const auto& [key, t] : d.batch()) {
      at::Tensor on_device = index;
      if (const c10::Device device = t.device(); device != index.device()) {
        // (a named copy: C++17 lambdas cannot capture the structured binding `t`; clang refuses it)
        auto it = std::find_if(uploaded.begin(), uploaded.end(), [&](const auto& u) { return u.first == device; });
        if (it == uploaded.end()) it = uploaded.insert(uploaded.end(), {device, upload(idx, device)});
        on_device = it->second;
      }
      batch.insert_or_assign(key, t.index_select(0, on_device));
    }
    NonTensorBatch columns;
    for (const auto& [key, c] : d.non_tensor_batch()) columns.insert_or_assign(key, c.take(idx));
    return DataProtoAccess::make(std::move(batch), std::move(columns), DataProtoAccess::stored_meta(d));
  });
}

Result<std::vector<int64_t>> normalize_indices(const std::vector<int64_t>& idx, int64_t n,
                                               const char* what) {
  std::vector<int64_t> out(idx.size());
  for (size_t i = 0; i < idx.size(); ++i) {
    int64_t v = idx[i];
    if (v < -n || v >= n) {
      return make_error(ErrorCode::out_of_range, "{}: index {} (position {}) is out of range for {} rows",
                        what, v, i, n);
    }
    out[i] = v < 0 ? v + n : v;
  }
  return out;
}

Result<std::vector<int64_t>> indices_from_tensor(const at::Tensor& idx, int64_t n,
                                                 const char* what) {
  if (!idx.defined()) {
    return make_error(ErrorCode::invalid_argument, "{}: index tensor is undefined", what);
  }
  if (idx.dim() != 1) {
    return make_error(ErrorCode::invalid_argument, "{}: index tensor must be 1-D, got {} dims",
                      what, idx.dim());
  }
  return guard(what, [&]() -> Result<std::vector<int64_t>> {
    at::Tensor cpu = idx.to(torch::kCPU);
    if (cpu.scalar_type() == torch::kBool) {
      if (cpu.size(0) != n) {
        return make_error(ErrorCode::invalid_argument, "{}: bool mask has {} entries for {} rows",
                          what, cpu.size(0), n);
      }
      cpu = cpu.nonzero().flatten();
    } else if (!at::isIntegralType(cpu.scalar_type(), /*includeBool=*/false)) {
      return make_error(ErrorCode::invalid_argument, "{}: index tensor must be integer or bool, got {}",
                        what, c10::toString(cpu.scalar_type()));
    }
    cpu = cpu.to(torch::kLong).contiguous();
    const int64_t* p = cpu.data_ptr<int64_t>();
    return normalize_indices(std::vector<int64_t>(p, p + cpu.numel()), n, what);
  });
}

bool tensors_equal_nan(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  if (a.numel() == 0) return true;
  bool same_view = a.device() == b.device() && a.storage().is_alias_of(b.storage()) &&
                   a.storage_offset() == b.storage_offset() && a.strides() == b.strides();
  if (same_view) return true;  // the same bytes: equal, NaN included
  at::Tensor bb = b.device() == a.device() ? b : b.to(a.device());
  if (!a.is_floating_point()) return a.equal(bb);
  return at::logical_or(a.eq(bb), at::logical_and(a.isnan(), bb.isnan())).all().item<bool>();
}

at::Tensor try_join_adjacent(const std::vector<at::Tensor>& parts) {
  // Note [Zero-copy chunk/concat] (data_proto_views.cpp). Runs on the caller's thread once per
  // key of every DP collect: the checks read the TensorImpls' fields (no Storage or Device
  // copies, no dispatch).
  if (parts.empty()) return {};
  const at::Tensor& first = parts.front();
  if (!first.defined() || first.dim() == 0 || first.requires_grad()) return {};
  const c10::TensorImpl* head = first.unsafeGetTensorImpl();
  if (!head->has_storage()) return {};
  const c10::StorageImpl* storage = head->storage().unsafeGetStorageImpl();
  const c10::IntArrayRef strides = head->strides();
  const c10::IntArrayRef trailing = head->sizes().slice(1);
  int64_t rows = 0;
  int64_t next_offset = head->storage_offset();
  for (const at::Tensor& p : parts) {
    if (!p.defined()) return {};
    const c10::TensorImpl* impl = p.unsafeGetTensorImpl();
    if (p.requires_grad() || !impl->has_storage() ||
        impl->storage().unsafeGetStorageImpl() != storage || impl->dtype() != head->dtype() ||
        impl->device() != head->device() || impl->dim() != head->dim() ||
        impl->strides() != strides || impl->sizes().slice(1) != trailing ||
        impl->storage_offset() != next_offset) {
      return {};
    }
    const int64_t n = impl->size(0);
    rows += n;
    next_offset += n * strides[0];
  }
  c10::SmallVector<int64_t, 6> sizes(head->sizes().begin(), head->sizes().end());
  sizes[0] = rows;
  if (plain_dense(first)) return direct_view(first, sizes, strides, head->storage_offset());
  return first.as_strided(sizes, strides, head->storage_offset());
}

}  // namespace tessera::proto::internal
