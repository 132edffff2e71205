// packing.cpp: see packing.hpp.
#include "workers/ppo/packing.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <vector>

#include "proto/host_transfer.hpp"
#include "workers/ppo/sequence_parallel.hpp"

namespace tessera::ppo {

Result<PackedBatch> pack_rows(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                              const at::Tensor& position_ids, models::HeadRows window, const at::Tensor& host_mask,
                              std::shared_ptr<const UlyssesGroup> sequence_parallel) {
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
  PackedBatch p;
  p.rows = B;
  p.response_length = L;
  p.response_index = to_device(response);
  const int64_t N = static_cast<int64_t>(flat.size());
  // Note [Ulysses sequence parallelism]: pad the row to a multiple of the group size (the padding
  // is a segment of its own, as verl's position ids restarting at 0 make it) and keep this rank's
  // slice, with the head positions that fall inside it.
  int64_t first_token = 0, tokens = N, pad = 0;
  if (sequence_parallel) {
    const int64_t size = sequence_parallel->size();
    pad = (size - N % size) % size;
    tokens = (N + pad) / size;
    first_token = sequence_parallel->rank() * tokens;
    if (pad > 0) segments->starts.push_back(N + pad);
    segments->sequence_parallel = sequence_parallel;
    // Dynamic RoPE scales by the whole row's longest position, not the slice's (on the device).
    segments->max_position = position_ids.masked_fill(attention_mask.eq(0), 0).max();
    const auto lo = std::lower_bound(head.begin(), head.end(), first_token);
    const auto hi = std::lower_bound(head.begin(), head.end(), first_token + tokens);
    p.row_head_index = to_device(head);
    p.head_begin = lo - head.begin();
    std::vector<int64_t> local(lo, hi);
    for (int64_t& h : local) h -= first_token;
    head = std::move(local);
    p.sequence_parallel = std::move(sequence_parallel);
  }
  if (device.is_cuda()) {  // the varlen attention's cumulative lengths, once for every layer
    segments->device_starts = proto::upload(std::vector<int32_t>(segments->starts.begin(), segments->starts.end()), device);
  }
  // The slice's real tokens [begin, begin + real); the rest of it (to `tokens`) is padding. The last
  // ranks' slices may lie wholly past the N real tokens.
  const int64_t begin = std::min(first_token, N), real = std::min(first_token + tokens, N) - begin;
  const at::Tensor flat_index = to_device(std::vector<int64_t>(flat.begin() + begin, flat.begin() + begin + real));
  p.input_ids = input_ids.reshape({-1}).index_select(0, flat_index).unsqueeze(0);
  p.position_ids = position_ids.reshape({-1}).index_select(0, flat_index).unsqueeze(0);
  if (real < tokens) {  // this slice ends in the padding: token 0 at positions 0, 1, ... (verl's ulysses_pad)
    const int64_t from = first_token + real - N;  // the padding's first position in this slice
    p.input_ids = at::cat({p.input_ids, at::zeros({1, tokens - real}, p.input_ids.options())}, 1);
    p.position_ids = at::cat({p.position_ids, at::arange(from, from + tokens - real, p.position_ids.options()).unsqueeze(0)}, 1);
  }
  p.segments = std::move(segments);
  p.head_index = to_device(head);
  return p;
}

models::HeadRows response_rows(const SequenceBatch& seq) {
  return {seq.input_ids.size(1) - seq.response_length - 1, seq.response_length};
}

Result<PackedBatch> pack_sequences(const SequenceBatch& seq, const at::Tensor& host_mask,
                                   std::shared_ptr<const UlyssesGroup> sequence_parallel) {
  return pack_rows(seq.input_ids, seq.attention_mask, seq.position_ids, response_rows(seq), host_mask,
                   std::move(sequence_parallel));
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
  at::Tensor all = per_response.flatten(0, 1).index_select(0, packed.response_index);
  return packed.sequence_parallel ? all.narrow(0, packed.head_begin, packed.head_index.size(0)) : all;
}

at::Tensor unpack_responses(const at::Tensor& values, const PackedBatch& packed) {
  std::vector<int64_t> shape = {packed.rows * packed.response_length};
  for (int64_t d = 1; d < values.dim(); ++d) shape.push_back(values.size(d));
  at::Tensor all = values;
  if (packed.sequence_parallel) {
    // Note [Ulysses sequence parallelism]: this rank's values on its slice, the group's slices
    // gathered into the whole row, then the row's head positions.
    std::vector<int64_t> slice = {packed.input_ids.size(1)};
    slice.insert(slice.end(), shape.begin() + 1, shape.end());
    at::Tensor mine = at::zeros(slice, values.options()).index_put({packed.head_index}, values);
    all = packed.sequence_parallel->gather_per_token(mine).index_select(0, packed.row_head_index);
  }
  at::Tensor grid = at::zeros(shape, values.options()).index_put({packed.response_index}, all);
  std::vector<int64_t> out = {packed.rows, packed.response_length};
  out.insert(out.end(), shape.begin() + 1, shape.end());
  return grid.view(out);
}

}  // namespace tessera::ppo
