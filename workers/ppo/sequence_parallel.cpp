// sequence_parallel.cpp: see sequence_parallel.hpp.
//
// Note [Ulysses sequence parallelism]
// verl's ulysses_sequence_parallel_size = S splits the world of W ranks into W / S data-parallel
// groups of S consecutive ranks (the (dp, sp) mesh). As verl v0.5.0 does it:
// * Dispatch is unchanged (every rank gets its chunk of the batch); a pass first gathers the
//   chunks of its group (gather_rows: verl's Ulysses sharding manager's preprocess_data), so the
//   S ranks of a group hold the same rows, and at the end keeps its own rows of the outputs
//   (local_rows: postprocess_data). Mini-batches are normalised by W / S, and a dynamic
//   micro-batch's token budget is max_token_len x S, as verl's.
// * Each micro-batch is packed without padding (use_remove_padding is required), its row of N
//   tokens padded to a multiple of S and cut into S slices, one per rank (pack_rows). A rank runs
//   the model on its slice; attention exchanges heads for tokens (Note [Ulysses attention] in
//   decoder.cpp). The head runs on the rank's own head positions only; their outputs (log-probs,
//   entropies, values) are placed on the rank's slice, all-gathered across the group
//   (gather_per_token) and picked at the row's head positions, so every rank of the group ends
//   with the whole micro-batch's outputs and computes the same loss.
// * The gather's backward hands each rank its slice's gradient times S, and FSDP averages the
//   gradients over all W ranks: the sum of a group's S partial gradients over W / S groups,
//   which is the data-parallel average of verl without sequence parallelism, as verl's
//   gather_outputs_and_unpad(grad_scaler=True) makes it.
// * SFT (roles/sft_worker.cpp) takes the other route to the same gradient: each rank's loss is
//   its own slice's tokens' (no gather), normalised by the batch's tokens counted once per group,
//   and the all-to-alls' backward carries each rank's loss into the others' activations. The
//   reward model only reads the gathered values at each row's last token.
// FSDP shards over all W ranks as before; only activations are split. The rollout is unaffected.
// DESIGN.md's n-d dispatch (the driver sending a group's chunk to each of its ranks) would save
// the gather; verl v0.5.0 gathers in the worker, and so does Tessera's rollout TP, which keeps
// dispatch and futures unchanged.
#include "workers/ppo/sequence_parallel.hpp"

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/collective/exchange.hpp"

namespace tessera::ppo {

namespace {

void throw_if_failed(const Status& st, const char* what) {
  if (!st.ok()) throw std::runtime_error(std::string("Ulysses ") + what + ": " + st.to_string());
}

// Both exchanges keep tokens outermost in memory ([tokens, heads, head_dim], shown to the model as
// the [1, heads, tokens, head_dim] view it computes with): the varlen flash-attention call takes
// that layout as it is, and the o_proj input is a view of it too, so each direction costs one
// copy besides the exchange (the pieces sent, or the pieces received, being strided).

// [1, H, n, D] (this rank's tokens, every head) -> [1, H / S, S * n, D] (every token, my heads).
at::Tensor tokens_to_heads(collective::Communicator& group, const at::Tensor& x) {
  const int64_t size = group.size();
  TORCH_CHECK(x.dim() == 4 && x.size(0) == 1 && x.size(1) % size == 0,
              "Ulysses all-to-all: expected [1, heads, tokens, head_dim] with heads divisible by ", size, ", got ",
              x.sizes());
  const at::Tensor tokens_first = x.squeeze(0).transpose(0, 1);  // [n, H, D]
  const int64_t n = tokens_first.size(0), heads = tokens_first.size(1) / size, d = tokens_first.size(2);
  at::Tensor landed = at::empty({size * n, heads, d}, x.options());  // every rank's tokens, in rank order
  std::vector<at::Tensor> send, recv;
  for (int64_t r = 0; r < size; ++r) {
    send.push_back(tokens_first.narrow(1, r * heads, heads).contiguous());  // rank r's heads of my tokens
    recv.push_back(landed.narrow(0, r * n, n));  // contiguous: a range of the outer dimension
  }
  throw_if_failed(collective::all_to_all_v(group, send, recv), "all-to-all (tokens to heads)");
  return landed.transpose(0, 1).unsqueeze(0);
}

// The inverse: [1, H / S, S * n, D] -> [1, H, n, D].
at::Tensor heads_to_tokens(collective::Communicator& group, const at::Tensor& y) {
  const int64_t size = group.size();
  TORCH_CHECK(y.dim() == 4 && y.size(0) == 1 && y.size(2) % size == 0,
              "Ulysses all-to-all: expected [1, heads, tokens, head_dim] with tokens divisible by ", size, ", got ",
              y.sizes());
  const at::Tensor tokens_first = y.squeeze(0).transpose(0, 1).contiguous();  // [S * n, H / S, D]
  const int64_t heads = tokens_first.size(1), n = tokens_first.size(0) / size, d = tokens_first.size(2);
  at::Tensor landed = at::empty({size, n, heads, d}, y.options());  // my tokens, rank r's heads at [r]
  std::vector<at::Tensor> send, recv;
  for (int64_t r = 0; r < size; ++r) {
    send.push_back(tokens_first.narrow(0, r * n, n));  // rank r's tokens: contiguous
    recv.push_back(landed[r]);
  }
  throw_if_failed(collective::all_to_all_v(group, send, recv), "all-to-all (heads to tokens)");
  return landed.permute({1, 0, 2, 3}).reshape({n, size * heads, d}).transpose(0, 1).unsqueeze(0);
}

// The communicator rides in the autograd context as an address: it is owned by the UlyssesGroup,
// which the actor, critic, reference, reward model or SFT worker running the forward owns (and
// every PackedBatch of the graph holds), so it outlives every graph built with it.
int64_t address_of(collective::Communicator* comm) { return static_cast<int64_t>(reinterpret_cast<intptr_t>(comm)); }
collective::Communicator* comm_of(torch::autograd::AutogradContext* ctx) {
  return reinterpret_cast<collective::Communicator*>(static_cast<intptr_t>(ctx->saved_data["comm"].toInt()));
}

struct ScatterTokens;

struct GatherTokens : torch::autograd::Function<GatherTokens> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t comm) {
    ctx->saved_data["comm"] = comm;
    return tokens_to_heads(*comm_of(ctx), x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad);
};

struct ScatterTokens : torch::autograd::Function<ScatterTokens> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& y, int64_t comm) {
    ctx->saved_data["comm"] = comm;
    return heads_to_tokens(*comm_of(ctx), y);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    return {GatherTokens::apply(grad[0], address_of(comm_of(ctx))), at::Tensor()};
  }
};

// Each exchange's backward is the other exchange (they are each other's adjoint).
torch::autograd::variable_list GatherTokens::backward(torch::autograd::AutogradContext* ctx,
                                                      torch::autograd::variable_list grad) {
  return {ScatterTokens::apply(grad[0], address_of(comm_of(ctx))), at::Tensor()};
}

struct GatherPerToken : torch::autograd::Function<GatherPerToken> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            collective::Communicator* comm) {
    const int64_t size = comm->size();
    ctx->saved_data["rank"] = static_cast<int64_t>(comm->rank());
    ctx->saved_data["size"] = size;
    TORCH_CHECK(x.dim() >= 1, "Ulysses all-gather: expected per-token values [n, ...], got a scalar");
    std::vector<int64_t> shape = x.sizes().vec();
    shape[0] *= size;
    at::Tensor out = at::empty(shape, x.options());
    throw_if_failed(comm->all_gather(x.contiguous(), out), "all-gather of the per-token outputs");
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    const int64_t rank = ctx->saved_data["rank"].toInt(), size = ctx->saved_data["size"].toInt();
    const int64_t n = grad[0].size(0) / size;
    return {grad[0].narrow(0, rank * n, n) * static_cast<double>(size), at::Tensor()};
  }
};

}  // namespace

Status check_sequence_parallel_group(const std::string& role, int64_t size, bool use_remove_padding,
                                     const UlyssesGroup* group) {
  const int64_t have = group ? group->size() : 1;
  if (size != have) {
    return make_error(ErrorCode::invalid_argument, "{}.ulysses_sequence_parallel_size = {}, but the {} runs in a "
                      "sequence-parallel group of {}", role, size, role, have);
  }
  if (size > 1 && !use_remove_padding) {
    return make_error(ErrorCode::invalid_argument,
                      "{}.ulysses_sequence_parallel_size = {} > 1 requires use_remove_padding = true", role, size);
  }
  return Status();
}

Result<std::shared_ptr<UlyssesGroup>> UlyssesGroup::create(std::shared_ptr<collective::Communicator> group) {
  if (!group) return make_error(ErrorCode::invalid_argument, "UlyssesGroup: null communicator");
  return std::shared_ptr<UlyssesGroup>(new UlyssesGroup(std::move(group)));
}

at::Tensor UlyssesGroup::gather_tokens(const at::Tensor& x) const { return GatherTokens::apply(x, address_of(group_.get())); }

at::Tensor UlyssesGroup::scatter_tokens(const at::Tensor& x) const { return ScatterTokens::apply(x, address_of(group_.get())); }

at::Tensor UlyssesGroup::gather_per_token(const at::Tensor& x) const { return GatherPerToken::apply(x, group_.get()); }

at::Tensor UlyssesGroup::local_rows(const at::Tensor& gathered) const {
  const int64_t rows = gathered.size(0) / size();
  return gathered.narrow(0, rank() * rows, rows);
}

namespace {

// Every rank's `values` (the same count on each), as one host array [size() x n]. Host boundary:
// the descriptors size and check the gathers that follow; two small reads per pass.
Result<std::vector<int64_t>> gather_descriptor(collective::Communicator& group, const std::vector<int64_t>& values,
                                               const c10::Device& device, const char* what) {
  const at::Tensor mine = at::tensor(values, at::kLong).to(device);
  at::Tensor all = at::empty({group.size() * static_cast<int64_t>(values.size())}, mine.options());
  TESSERA_RETURN_IF_ERROR(group.all_gather(mine, all).with_context(std::string("Ulysses: gathering ") + what));
  const at::Tensor host = all.to(at::kCPU);
  return std::vector<int64_t>(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
}

}  // namespace

Result<proto::DataProto> UlyssesGroup::gather_rows(const proto::DataProto& data) const {
  const std::vector<std::string> keys = data.batch().keys();
  if (keys.empty()) return make_error(ErrorCode::invalid_argument, "Ulysses: the batch has no tensors to gather");
  const c10::Device device = data.batch().find(keys.front())->device();
  // The ranks must agree on every tensor before any tensor moves (a mismatch would be a hang or
  // a garbled exchange, not an error): first the row and tensor counts, then per tensor its name,
  // dtype and elements per row.
  const auto n = static_cast<int64_t>(keys.size());
  TESSERA_ASSIGN_OR_RETURN(auto counts, gather_descriptor(*group_, {data.size(), n}, device, "the row counts"));
  for (int64_t r = 0; r < size(); ++r) {
    if (counts[2 * r] != data.size() || counts[2 * r + 1] != n) {
      return make_error(ErrorCode::invalid_argument,
                        "Ulysses: sequence-parallel rank {} holds {} rows and {} tensors, this rank (sp rank {}) {} and "
                        "{}; the ranks of a group must receive equal chunks",
                        r, counts[2 * r], counts[2 * r + 1], rank(), data.size(), n);
    }
  }
  std::vector<int64_t> mine;
  for (const std::string& key : keys) {
    const at::Tensor& t = *data.batch().find(key);
    mine.push_back(static_cast<int64_t>(std::hash<std::string>{}(key) >> 1));
    mine.push_back(static_cast<int64_t>(t.scalar_type()));
    mine.push_back(data.size() > 0 ? t.numel() / data.size() : 0);
  }
  TESSERA_ASSIGN_OR_RETURN(auto all, gather_descriptor(*group_, mine, device, "the tensor shapes"));
  for (int64_t r = 0; r < size(); ++r) {
    for (int64_t k = 0; k < n; ++k) {
      const int64_t* theirs = all.data() + (r * n + k) * 3;
      if (theirs[0] != mine[3 * k] || theirs[1] != mine[3 * k + 1] || theirs[2] != mine[3 * k + 2]) {
        return make_error(ErrorCode::invalid_argument,
                          "Ulysses: sequence-parallel rank {} holds another tensor than this rank's '{}' {} (sp rank "
                          "{}) at position {}; the ranks of a group must receive equal chunks",
                          r, keys[static_cast<size_t>(k)], c10::str(data.batch().find(keys[static_cast<size_t>(k)])->sizes()),
                          rank(), k);
      }
    }
  }
  proto::TensorDict out;
  for (const std::string& key : keys) {
    const at::Tensor t = data.batch().find(key)->contiguous();
    // NCCL has no bool: bool tensors travel as bytes.
    const at::Tensor wire = t.scalar_type() == at::kBool ? t.view(at::kByte) : t;
    std::vector<int64_t> full = wire.sizes().vec();
    full[0] *= size();
    at::Tensor gathered = at::empty(full, wire.options());
    TESSERA_RETURN_IF_ERROR(group_->all_gather(wire, gathered).with_context("Ulysses: gathering '" + key + "'"));
    out.insert_or_assign(key, t.scalar_type() == at::kBool ? gathered.view(at::kBool) : gathered);
  }
  return proto::DataProto::from_dict(std::move(out), {}, data.meta_info());
}

}  // namespace tessera::ppo
