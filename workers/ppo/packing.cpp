// packing.cpp: see packing.hpp.
#include "workers/ppo/packing.hpp"

#include <torch/torch.h>

#include <vector>

#include "proto/host_transfer.hpp"

namespace tessera::ppo {

Result<PackedBatch> pack_rows(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                              const at::Tensor& position_ids, models::HeadRows window, const at::Tensor& host_mask) {
  const int64_t B = input_ids.size(0), T = input_ids.size(1), L = window.length, first = window.start;
  if (host_mask.defined() && host_mask.sizes() != attention_mask.sizes()) {
    return make_error(ErrorCode::internal, "pack_rows: the host mask does not match the attention mask");
  }
  // Host boundary: the segment offsets and gather indices are host data. A caller's host copy
  // (micro_batch_host_masks) makes this a no-op; otherwise it is one device read.
  const at::Tensor mask = (host_mask.defined() ? host_mask : attention_mask).ne(0).to(at::kCPU).contiguous();
  const auto m = mask.accessor<bool, 2>();
  auto segments = std::make_shared<models::PackedSegments>();
  segments->starts.reserve(static_cast<size_t>(B + 1));
  std::vector<int64_t> flat, head, response;
  flat.reserve(static_cast<size_t>(B * T));
  segments->starts.push_back(0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      if (!m[b][t]) continue;
      if (t >= first && t < first + L) {
        head.push_back(static_cast<int64_t>(flat.size()));
        response.push_back(b * L + t - first);
      }
      flat.push_back(b * T + t);
    }
    segments->starts.push_back(static_cast<int64_t>(flat.size()));
  }
  if (flat.empty()) return make_error(ErrorCode::invalid_argument, "use_remove_padding: the micro-batch has no tokens");
  const c10::Device device = input_ids.device();
  // Without blocking: the previous micro-batch's backward may still be running (Note [Host transfers]).
  auto to_device = [&](const std::vector<int64_t>& v) { return proto::upload(v, device); };
  if (device.is_cuda()) {  // the varlen attention's cumulative lengths, once for every layer
    segments->device_starts = proto::upload(std::vector<int32_t>(segments->starts.begin(), segments->starts.end()), device);
  }
  const at::Tensor flat_index = to_device(flat);
  PackedBatch p;
  p.input_ids = input_ids.reshape({-1}).index_select(0, flat_index).unsqueeze(0);
  p.position_ids = position_ids.reshape({-1}).index_select(0, flat_index).unsqueeze(0);
  p.segments = std::move(segments);
  p.head_index = to_device(head);
  p.response_index = to_device(response);
  p.rows = B;
  p.response_length = L;
  return p;
}

models::HeadRows response_rows(const SequenceBatch& seq) {
  return {seq.input_ids.size(1) - seq.response_length - 1, seq.response_length};
}

Result<PackedBatch> pack_sequences(const SequenceBatch& seq, const at::Tensor& host_mask) {
  return pack_rows(seq.input_ids, seq.attention_mask, seq.position_ids, response_rows(seq), host_mask);
}

Result<std::vector<at::Tensor>> micro_batch_host_masks(const proto::DataProto& data, const MicroBatches& micro,
                                                       bool remove_padding) {
  std::vector<at::Tensor> out(micro.batches.size());
  if (!remove_padding) return out;
  TESSERA_ASSIGN_OR_RETURN(at::Tensor mask, data.tensor("attention_mask"));
  // Host boundary: packing offsets are host data (the attention loops / cu_seqlens are built from
  // them), so the mask comes to the host once here, for every micro-batch of the call.
  const at::Tensor host = mask.to(at::kCPU);
  int64_t offset = 0;
  for (size_t i = 0; i < micro.batches.size(); ++i) {
    const int64_t rows = micro.batches[i].size();
    out[i] = micro.indices.empty() ? host.narrow(0, offset, rows)
                                   : host.index_select(0, at::tensor(micro.indices[i], at::kLong));
    offset += rows;
  }
  return out;
}

at::Tensor select_responses(const at::Tensor& per_response, const PackedBatch& packed) {
  return per_response.flatten(0, 1).index_select(0, packed.response_index);
}

at::Tensor unpack_responses(const at::Tensor& values, const PackedBatch& packed) {
  std::vector<int64_t> shape = {packed.rows * packed.response_length};
  for (int64_t d = 1; d < values.dim(); ++d) shape.push_back(values.size(d));
  at::Tensor grid = at::zeros(shape, values.options()).index_put({packed.response_index}, values);
  std::vector<int64_t> out = {packed.rows, packed.response_length};
  out.insert(out.end(), shape.begin() + 1, shape.end());
  return grid.view(out);
}

}  // namespace tessera::ppo
