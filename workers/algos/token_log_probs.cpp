// token_log_probs.cpp: log-probabilities and entropies of tokens from logits, in fp32 chunks of
// rows, with a backward that recomputes each chunk's softmax (see torch_functional.hpp).
//
// Note [Chunked token log-probs]
// The PPO losses need, per response token, log_softmax(x)[label] and optionally the entropy of
// softmax(x), x = logits / temperature in fp32. Done over the whole [N, V] block (as
// logprobs_from_logits / entropy_from_logits do) that is several fp32 [N, V] buffers kept for
// backward: the fp32 copy, the scaled copy, the softmax and the product, 4-5x the bf16 logits
// (tens of GB for a 7B micro-batch with a 150k vocabulary). Here forward walks chunks of rows,
// keeping only the per-row logsumexp (and entropy); backward walks them again and rebuilds each
// chunk's softmax from the saved logits and logsumexp:
//   d lp / d x_i = [i == label] - p_i
//   d H  / d x_i = -p_i (x_i - mu),  mu = sum_j p_j x_j = lse - H
// and writes the chunk's gradient (divided by the temperature) straight into a logits-shaped,
// logits-dtype buffer. Peak extra memory is a few fp32 [chunk, V] buffers; the values are the
// same operations as the unchunked functions, row by row.
//
// Note [Fused token log-probs]
// On a GPU those chunks still cost ~10 fp32 passes over the logits each way (the copy to fp32,
// logsumexp's max / exp / sum, the gather, softmax and product for the entropy), which made the
// log-prob phases slower than HF's. For fp32 / fp16 / bf16 logits on a CUDA device the same
// maths runs as two kernels (cuda/token_log_probs.cu): forward reads each row once keeping an
// online max, sum of exp and sum of x exp (so lse and the entropy come from one pass), backward
// reads it once more and writes the gradient. No fp32 [N, V] buffer exists at all; the saved
// tensors are the same (logits, labels, lse, entropy). fp64 logits and the CPU keep the chunks.
#include <torch/torch.h>

#include <algorithm>

#include "workers/algos/internal/check.hpp"
#include "workers/algos/torch_functional.hpp"

#if TESSERA_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>

#include "proto/cuda/launch.hpp"
#include "workers/algos/cuda/token_log_probs.hpp"
#endif

namespace tessera::algos {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Rows per chunk: an fp32 [rows, V] buffer of about 256 MiB.
int64_t default_chunk_rows(int64_t vocab) {
  constexpr int64_t kChunkBytes = int64_t{256} << 20;
  return std::max<int64_t>(1, kChunkBytes / (4 * std::max<int64_t>(vocab, 1)));
}

// The dtype the maths runs in: fp32, or fp64 for fp64 logits.
c10::ScalarType math_dtype(const at::Tensor& logits) {
  return logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

at::Tensor scaled_fp32(const at::Tensor& logits_chunk, double temperature) {
  at::Tensor x = logits_chunk.to(math_dtype(logits_chunk));
  return temperature == 1.0 ? x : x / temperature;
}

// Whether the fused kernels take `logits` [N, V] and `labels` [N] (Note [Fused token log-probs]).
bool fused(const at::Tensor& logits, const at::Tensor& labels) {
#if TESSERA_WITH_CUDA
  const auto t = logits.scalar_type();
  return logits.is_cuda() && labels.device() == logits.device() &&
         (t == at::kFloat || t == at::kHalf || t == at::kBFloat16) && logits.stride(1) == 1;
#else
  (void)logits, (void)labels;
  return false;
#endif
}

#if TESSERA_WITH_CUDA
// The kernels' arguments for logits [N, V] and int64 labels [N] (contiguous).
cuda::TokenLogProbArgs kernel_args(const at::Tensor& logits, const at::Tensor& labels, double temperature) {
  cuda::TokenLogProbArgs a;
  a.logits = logits.data_ptr();
  a.row_stride = logits.stride(0);
  a.labels = labels.data_ptr<int64_t>();
  a.rows = logits.size(0);
  a.vocab = logits.size(1);
  a.temperature = static_cast<float>(temperature);
  a.dtype = proto::cuda::element_type_of(logits, "token_log_probs");
  return a;
}
#endif

// See Note [Chunked token log-probs]. Inputs: logits [N, V], labels [N] (int64). Outputs: log-probs
// [N] and, when `with_entropy`, entropies [N], both fp32.
class ChunkedLogSoftmax : public torch::autograd::Function<ChunkedLogSoftmax> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& labels,
                               double temperature, bool with_entropy, int64_t chunk) {
    const int64_t n = logits.size(0);
    const auto f32 = logits.options().dtype(math_dtype(logits));
    at::Tensor lp = at::empty({n}, f32), lse = at::empty({n}, f32);
    at::Tensor ent = with_entropy ? at::empty({n}, f32) : at::Tensor();
    const bool use_kernel = fused(logits, labels);
#if TESSERA_WITH_CUDA
    if (use_kernel) {
      const c10::cuda::CUDAGuard guard(logits.device());
      const at::Tensor ids = labels.contiguous();
      cuda::TokenLogProbArgs a = kernel_args(logits, ids, temperature);
      a.log_probs = lp.data_ptr<float>();
      a.lse = lse.data_ptr<float>();
      a.entropy = with_entropy ? ent.data_ptr<float>() : nullptr;
      proto::cuda::check_launch("token_log_probs forward",
                                cuda::launch_token_log_probs_forward(a, proto::cuda::stream_of(logits)));
    }
#endif
    for (int64_t start = 0; !use_kernel && start < n; start += chunk) {
      const int64_t len = std::min(chunk, n - start);
      at::Tensor x = scaled_fp32(logits.narrow(0, start, len), temperature);
      at::Tensor l = at::logsumexp(x, {-1});
      lse.narrow(0, start, len).copy_(l);
      lp.narrow(0, start, len).copy_(x.gather(-1, labels.narrow(0, start, len).unsqueeze(-1)).squeeze(-1) - l);
      if (with_entropy) ent.narrow(0, start, len).copy_(l - (at::softmax(x, -1) * x).sum(-1));
    }
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({logits, labels, lse, with_entropy ? ent : at::Tensor()});
    ctx->saved_data["temperature"] = temperature;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["fused"] = use_kernel;
    if (!with_entropy) return {lp};
    return {lp, ent};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& logits = saved[0];
    const at::Tensor& labels = saved[1];
    const at::Tensor& lse = saved[2];
    const at::Tensor& ent = saved[3];
    const double temperature = ctx->saved_data["temperature"].toDouble();
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const at::Tensor grad_lp = grads[0];
    const at::Tensor grad_ent = grads.size() > 1 ? grads[1] : at::Tensor();
    if (ctx->saved_data["fused"].toBool() && (grad_lp.defined() || grad_ent.defined())) {
#if TESSERA_WITH_CUDA
      const c10::cuda::CUDAGuard guard(logits.device());
      // The gradients of a sum arrive expanded (stride 0): the kernel reads them contiguous.
      const auto rows = [](const at::Tensor& g) { return g.defined() ? g.to(at::kFloat).contiguous() : g; };
      const at::Tensor ids = labels.contiguous(), g_lp = rows(grad_lp), g_ent = rows(grad_ent);
      at::Tensor grad_logits = at::empty(logits.sizes(), logits.options());
      cuda::TokenLogProbArgs a = kernel_args(logits, ids, temperature);
      a.saved_lse = lse.data_ptr<float>();
      a.saved_entropy = g_ent.defined() ? ent.data_ptr<float>() : nullptr;
      a.grad_log_probs = g_lp.defined() ? g_lp.data_ptr<float>() : nullptr;
      a.grad_entropy = g_ent.defined() ? g_ent.data_ptr<float>() : nullptr;
      a.grad_logits = grad_logits.data_ptr();
      proto::cuda::check_launch("token_log_probs backward",
                                cuda::launch_token_log_probs_backward(a, proto::cuda::stream_of(logits)));
      return {grad_logits, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
#endif
    }
    at::Tensor grad_logits = at::zeros_like(logits);
    if (grad_lp.defined() || grad_ent.defined()) {
      const int64_t n = logits.size(0);
      for (int64_t start = 0; start < n; start += chunk) {
        const int64_t len = std::min(chunk, n - start);
        at::Tensor x = scaled_fp32(logits.narrow(0, start, len), temperature);
        at::Tensor l = lse.narrow(0, start, len).unsqueeze(-1);
        at::Tensor p = at::exp(x - l);
        at::Tensor gx;
        if (grad_ent.defined()) {
          at::Tensor mu = l - ent.narrow(0, start, len).unsqueeze(-1);
          gx = p * (x - mu) * grad_ent.narrow(0, start, len).neg().unsqueeze(-1);
        }
        if (grad_lp.defined()) {
          at::Tensor g = grad_lp.narrow(0, start, len).unsqueeze(-1);
          at::Tensor term = p * g.neg();
          gx = gx.defined() ? gx.add_(term) : term;
          gx.scatter_add_(-1, labels.narrow(0, start, len).unsqueeze(-1), g);
        }
        if (temperature != 1.0) gx.div_(temperature);
        grad_logits.narrow(0, start, len).copy_(gx);
      }
    }
    return {grad_logits, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

Status check_labels_in_vocab(const char* fn, const char* name, const at::Tensor& labels, int64_t vocab) {
  return internal::guarded(fn, [&]() -> Status {
    if (labels.numel() == 0) return Status();
    // Host boundary, deliberate: a bad id must be a one-line error, and on a GPU an out-of-range
    // gather is a device assert that kills the context. Callers check a whole batch once per call;
    // both bounds come back in one read.
    const auto [lo_t, hi_t] = at::aminmax(labels.to(at::kLong));
    const at::Tensor both = at::stack({lo_t, hi_t}).cpu();
    const int64_t lo = both.data_ptr<int64_t>()[0], hi = both.data_ptr<int64_t>()[1];
    if (lo < 0 || hi >= vocab) {
      return make_error(ErrorCode::out_of_range, "{}: '{}' holds token id {} outside the vocabulary [0, {})", fn, name,
                        lo < 0 ? lo : hi, vocab);
    }
    return Status();
  });
}

Result<TokenLogProbs> token_log_probs(const at::Tensor& logits, const at::Tensor& labels, double temperature,
                                      bool with_entropy, int64_t chunk_rows) {
  constexpr const char* fn = "token_log_probs";
  TESSERA_RETURN_IF_ERROR(internal::check_min_dim(fn, "logits", logits, 1));
  TESSERA_RETURN_IF_ERROR(internal::check_floating(fn, "logits", logits));
  if (labels.sizes() != logits.sizes().slice(0, logits.dim() - 1) || at::isFloatingType(labels.scalar_type()) ||
      labels.scalar_type() == at::kBool) {
    return make_error(ErrorCode::invalid_argument, "{}: 'labels' {} must be integers shaped like 'logits' {} minus the vocab dim",
                      fn, internal::shape_str(labels), internal::shape_str(logits));
  }
  if (!(temperature > 0)) return make_error(ErrorCode::invalid_argument, "{}: temperature {} must be > 0", fn, temperature);
  if (chunk_rows < 0) return make_error(ErrorCode::invalid_argument, "{}: chunk_rows {} must be >= 0", fn, chunk_rows);
  return internal::guarded(fn, [&]() -> Result<TokenLogProbs> {
    const int64_t vocab = logits.size(-1);
    const int64_t chunk = chunk_rows > 0 ? chunk_rows : default_chunk_rows(vocab);
    at::Tensor flat = logits.reshape({-1, vocab});
    at::Tensor flat_labels = labels.reshape({-1}).to(at::kLong);
    variable_list out = ChunkedLogSoftmax::apply(flat, flat_labels, temperature, with_entropy, chunk);
    TokenLogProbs r;
    r.log_probs = out[0].view(labels.sizes());
    if (with_entropy) r.entropy = out[1].view(labels.sizes());
    return r;
  });
}

}  // namespace tessera::algos
