// tensor_parallel.cpp: Note [Rollout TP slicing] in tensor_parallel.hpp.
#include "workers/rollout/tensor_parallel.hpp"

#include <algorithm>

#include <torch/torch.h>

#include "proto/codec.hpp"
#include "runtime/collective/exchange.hpp"

namespace tessera::rollout {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
int64_t ceil_div(int64_t a, int64_t b) { return -floor_div(-a, b); }

// Elements of `b` at flat positions < x.
int64_t block_count_before(const TpBlock& b, int64_t x) {
  if (x <= b.begin || b.len == 0) return 0;
  const int64_t full = std::clamp<int64_t>(floor_div(x - b.begin - b.len, b.stride) + 1, 0, b.rows);
  int64_t partial = 0;
  if (full < b.rows) partial = std::clamp<int64_t>(x - (b.begin + full * b.stride), 0, b.len);
  return full * b.len + partial;
}

Status not_divisible(const std::string& what, int64_t value, int64_t tp) {
  return make_error(ErrorCode::invalid_argument,
                    "actor_rollout_ref.rollout.tensor_model_parallel_size={} does not divide {} = {}", tp, what, value);
}

}  // namespace

TpSplit tp_split_of(const std::string& name) {
  // The dense MLP's and Qwen2-MoE's shared expert's projections end in "<proj>.weight"; a MoE
  // layer's stacked experts are "mlp.experts.<proj>" [E, out, in], split the same way per expert.
  for (const char* s : {"self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight",
                        "self_attn.k_proj.bias", "self_attn.v_proj.weight", "self_attn.v_proj.bias",
                        "gate_proj.weight", "up_proj.weight", "mlp.experts.gate_proj", "mlp.experts.up_proj"}) {
    if (ends_with(name, s)) return TpSplit::rows;
  }
  for (const char* s : {"self_attn.o_proj.weight", "down_proj.weight", "mlp.experts.down_proj"}) {
    if (ends_with(name, s)) return TpSplit::columns;
  }
  // Norms (q_norm/k_norm are [head_dim], the same on every head), o_proj.bias (added once after the
  // all-reduce, step_model.hpp), embeddings, lm_head, a MoE router and Qwen2-MoE's
  // shared_expert_gate (its sigmoid scales every rank's partial sum alike).
  return TpSplit::replicated;
}

Result<models::ModelConfig> tp_rank_config(const models::ModelConfig& config, int64_t tp) {
  if (tp < 1) return make_error(ErrorCode::invalid_argument, "actor_rollout_ref.rollout.tensor_model_parallel_size={} must be >= 1", tp);
  if (config.num_attention_heads % tp != 0) return not_divisible("the model's num_attention_heads", config.num_attention_heads, tp);
  if (config.num_key_value_heads % tp != 0) return not_divisible("the model's num_key_value_heads", config.num_key_value_heads, tp);
  bool dense_layer = false;  // a MoE model's intermediate_size is only its dense layers'
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) dense_layer = dense_layer || !config.layer_is_sparse(i);
  if (dense_layer && config.intermediate_size % tp != 0) {
    return not_divisible("the model's intermediate_size", config.intermediate_size, tp);
  }
  models::ModelConfig c = config;
  c.num_attention_heads /= tp;
  c.num_key_value_heads /= tp;
  c.intermediate_size /= tp;
  models::MoeConfig& moe = c.moe;
  if (moe.num_experts > 0) {
    // The experts' grouped GEMMs need 8-element rows (Note [MoE experts] in decoder.cpp).
    if (moe.moe_intermediate_size % (8 * tp) != 0) {
      return make_error(ErrorCode::invalid_argument,
                        "actor_rollout_ref.rollout.tensor_model_parallel_size={}: the model's moe_intermediate_size = "
                        "{} must split into multiples of 8 per rank",
                        tp, moe.moe_intermediate_size);
    }
    if (moe.shared_expert_intermediate_size % tp != 0) {
      return not_divisible("the model's shared_expert_intermediate_size", moe.shared_expert_intermediate_size, tp);
    }
    moe.moe_intermediate_size /= tp;
    moe.shared_expert_intermediate_size /= tp;
  }
  return c;
}

namespace {

// The dimension a split cuts: rows the one before the last (a bias's only one), columns the last.
int64_t split_dim(TpSplit split, int64_t dims) { return split == TpSplit::rows ? std::max<int64_t>(dims - 2, 0) : dims - 1; }

}  // namespace

at::Tensor tp_slice(const at::Tensor& full, TpSplit split, int64_t tp, int64_t tp_rank) {
  if (split == TpSplit::replicated) return full;
  const int64_t dim = split_dim(split, full.dim());
  const int64_t width = full.size(dim) / tp;
  return full.narrow(dim, tp_rank * width, width);
}

Result<TpUnitPlan> TpUnitPlan::create(const fsdp::FlatLayout& layout, int64_t tp, int64_t tp_rank) {
  std::vector<fsdp::FlatParamEntry> entries = layout.params;
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.offset < b.offset; });
  TpUnitPlan plan;
  for (const auto& e : entries) {
    TpSplit split = e.numel == 0 ? TpSplit::replicated : tp_split_of(e.name);
    TpBlock block{e.offset, 1, e.numel, std::max<int64_t>(e.numel, 1)};
    std::vector<int64_t> shape = e.shape;
    if (split == TpSplit::rows) {
      // [outer..., out, inner...]: each of the `outer` blocks (the experts of a stacked MoE
      // tensor; 1 otherwise) gives its rows [t*out/T, (t+1)*out/T).
      const size_t d = static_cast<size_t>(split_dim(split, static_cast<int64_t>(e.shape.size())));
      const int64_t out = e.shape.at(d);
      int64_t outer = 1;
      for (size_t i = 0; i < d; ++i) outer *= e.shape[i];
      const int64_t inner = e.numel / (outer * out);
      if (out % tp != 0) return not_divisible("rows of '" + e.name + "'", out, tp);
      shape[d] = out / tp;
      const int64_t len = shape[d] * inner;
      block = TpBlock{e.offset + tp_rank * len, outer, len, out * inner};
    } else if (split == TpSplit::columns) {
      if (e.shape.size() < 2) {
        return make_error(ErrorCode::invalid_argument, "rollout TP: '{}' has {} dimensions, a column split needs 2 or 3",
                          e.name, e.shape.size());
      }
      const int64_t in = e.shape.back();
      if (in % tp != 0) return not_divisible("columns of '" + e.name + "'", in, tp);
      shape.back() = in / tp;
      block = TpBlock{e.offset + tp_rank * shape.back(), e.numel / in, shape.back(), in};
    }
    plan.params_.push_back(TpParamSlice{e.name, shape, plan.numel_});
    plan.numel_ += block.rows * block.len;
    plan.blocks_.push_back(block);
  }
  return plan;
}

int64_t TpUnitPlan::count_before(int64_t x) const {
  int64_t n = 0;
  for (const auto& b : blocks_) n += block_count_before(b, x);
  return n;
}

at::Tensor TpUnitPlan::pack(const at::Tensor& shard, int64_t s0) const {
  const int64_t s1 = s0 + shard.numel();
  at::Tensor out = at::empty({count_before(s1) - count_before(s0)}, shard.options());
  int64_t cursor = 0;
  auto put = [&](const at::Tensor& piece) {
    out.narrow(0, cursor, piece.numel()).view(piece.sizes()).copy_(piece);
    cursor += piece.numel();
  };
  for (const auto& b : blocks_) {
    if (b.len == 0) continue;
    // Rows intersecting [s0, s1): [lo, hi). Only the first and the last can be cut by the shard.
    const int64_t lo = std::clamp<int64_t>(floor_div(s0 - b.begin - b.len, b.stride) + 1, 0, b.rows);
    const int64_t hi = std::clamp<int64_t>(ceil_div(s1 - b.begin, b.stride), 0, b.rows);
    auto row_piece = [&](int64_t i) {
      const int64_t a = std::max(b.begin + i * b.stride, s0), e = std::min(b.begin + i * b.stride + b.len, s1);
      if (e > a) put(shard.narrow(0, a - s0, e - a));
    };
    if (lo >= hi) continue;
    row_piece(lo);
    if (hi - lo > 2) {
      const int64_t first = b.begin + (lo + 1) * b.stride - s0;
      put(shard.as_strided({hi - lo - 2, b.len}, {b.stride, 1}, shard.storage_offset() + first));
    }
    if (hi - lo > 1) row_piece(hi - 1);
  }
  TORCH_CHECK(cursor == out.numel(), "TpUnitPlan::pack: packed ", cursor, " of ", out.numel(), " elements");
  return out;
}

Result<proto::DataProto> all_gather_data_proto(collective::Communicator& tp_group, const proto::DataProto& data,
                                               std::vector<int64_t>& offsets) {
  // The rows travel as a frame of host memory; a worker on a GPU holds them on its device, where
  // the gathered batch goes back.
  const auto ids = data.tensor("input_ids");
  const c10::Device device = ids.ok() ? ids->device() : c10::Device(c10::kCPU);
  proto::DataProto host = data;
  TESSERA_RETURN_IF_ERROR(host.to(c10::Device(c10::kCPU)));
  TESSERA_ASSIGN_OR_RETURN(proto::EncodedFrame frame, proto::encode(host));
  at::Tensor bytes = at::empty({static_cast<int64_t>(frame.size())}, at::kByte);
  frame.flatten_into(bytes.data_ptr<uint8_t>());
  auto all = collective::all_gather_bytes(tp_group, bytes);
  if (!all.ok()) return all.status().with_context("rollout TP all-gather of the prompts");
  std::vector<proto::DataProto> parts;
  offsets.assign(1, 0);
  for (int r = 0; r < tp_group.size(); ++r) {
    const at::Tensor& b = (*all)[static_cast<size_t>(r)];
    proto::DataProto part = host;
    if (r != tp_group.rank()) {
      auto decoded = proto::decode_copy(b.data_ptr<uint8_t>(), static_cast<size_t>(b.numel()));
      if (!decoded.ok()) return decoded.status().with_context(fmt::format("prompts from TP rank {}", r));
      part = std::move(*decoded);
    }
    part.meta_info() = nlohmann::json::object();
    offsets.push_back(offsets.back() + part.size());
    parts.push_back(std::move(part));
  }
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto gathered, proto::DataProto::concat(parts));
  gathered.meta_info() = data.meta_info();
  if (!device.is_cpu()) TESSERA_RETURN_IF_ERROR(gathered.to(device));
  return gathered;
}

}  // namespace tessera::rollout
