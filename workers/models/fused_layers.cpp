// fused_layers.cpp: see fused_layers.hpp.
//
// Note [Fused layers]
// verl's `model.use_liger` patches Liger's Triton kernels into the HF model: RMSNorm, rotary
// embedding and SwiGLU as one kernel each way instead of a chain of element-wise ops (an RMSNorm
// is seven ops forward: the fp32 copy, square, mean, add, rsqrt, multiply and the cast back).
// In a training step those chains are most of the kernels that run: ~150 per layer per
// micro-batch with the recomputed forward, each a full pass over the activations. With the switch
// on and the model on a GPU:
//   RMSNorm  PyTorch's fused kernel (at::_fused_rms_norm: fp32 inside, its own backward), then the
//            weight multiply in the input dtype as HF does (Gemma's (1 + weight) form stays unfused);
//   rotary   cuda/fused_layers.cu, one thread per rotated pair, forward and backward;
//   SwiGLU   cuda/fused_layers.cu, silu(gate) * up, and both input gradients in one pass.
// The rotary and SwiGLU forwards round where the op chains round, so their values are HF's bit for
// bit, and the rollout (fused) and the actor (unfused unless use_liger) compute the same
// activations; their backwards, and the fused RMSNorm's reduction, compute in fp32 and round once
// (about a unit in the last place of the dtype from the chains). The rollout engine runs them by
// default (engine_kwargs.tessera.fused_layers=true, as vLLM always runs its fused RMSNorm, rotary
// and SiluAndMul ops): in a decode step at 512 rows the op chains are ~13 small kernels per layer
// beside the attention and the matmuls. On the CPU the switch changes nothing. The kernels are new
// code: check_fused_layers compares them with the op chains once per process and (device, dtype)
// before first use, and a disagreement is an error naming the key.
//
// Note [Fused residual norm]
// Between two sublayers the decoder adds the sublayer's output to the residual stream and
// normalises the sum for the next sublayer: an add, the fused RMSNorm and the weight multiply,
// three kernels and three round trips of the activations. The rollout (inference only, no
// autograd) runs them as one kernel, as vLLM's fused_add_rms_norm does, also across the layer
// boundary (the MLP's output into the next layer's input norm, the last into the final norm), so
// a layer runs two such kernels where it ran six (fused_add_rms_norm; RMSNorm::add_forward picks
// it). It rounds where HF's ops round; the sum of squares is summed in another order, and the
// mean divides by H where torch multiplies by 1/H. It has a check of its own
// (check_fused_residual_norm), whose error names the rollout's key only.
#include "workers/models/fused_layers.hpp"

#include <string>
#include <vector>

#include <torch/torch.h>

#include "proto/cuda/launch.hpp"
#include "workers/models/decoder.hpp"

#if TESSERA_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>

#include "workers/models/cuda/fused_layers.hpp"
#endif

namespace tessera::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

#if TESSERA_WITH_CUDA
using proto::cuda::check_launch;
using proto::cuda::element_type_of;
using proto::cuda::stream_of;

// x (or the incoming gradient) [B, H, T, D] through the rotary kernel into a new contiguous tensor.
at::Tensor run_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool backward) {
  TORCH_CHECK(x.dim() == 4 && cos.dim() == 4 && x.size(3) % 2 == 0, "fused rotary: x ", x.sizes(), " cos ", cos.sizes());
  const at::Tensor c = cos.expand({x.size(0), 1, x.size(2), x.size(3)});
  const at::Tensor s = sin.expand_as(c);
  TORCH_CHECK(c.strides() == s.strides(), "fused rotary: cos and sin must share a layout");
  TORCH_CHECK(c.scalar_type() == x.scalar_type() && s.scalar_type() == x.scalar_type() &&
                  c.device() == x.device() && s.device() == x.device(),
              "fused rotary: cos and sin must have x's dtype and device (", x.scalar_type(), " on ", x.device(), ")");
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  cuda::RotaryArgs a;
  a.x = x.data_ptr();
  for (int i = 0; i < 4; ++i) a.x_stride[i] = x.stride(i);
  a.cos = c.data_ptr();
  a.sin = s.data_ptr();
  a.table_stride[0] = c.stride(0);
  a.table_stride[1] = c.stride(2);
  a.table_stride[2] = c.stride(3);
  a.out = out.data_ptr();
  a.batch = x.size(0);
  a.heads = x.size(1);
  a.tokens = x.size(2);
  a.head_dim = x.size(3);
  a.backward = backward;
  a.dtype = element_type_of(x, "fused rotary");
  check_launch("fused rotary", cuda::launch_rotary(a, stream_of(x)));
  return out;
}

class RotaryFunction : public torch::autograd::Function<RotaryFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return run_rotary(x, cos, sin, /*backward=*/false);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {run_rotary(grads[0], saved[0], saved[1], /*backward=*/true), at::Tensor(), at::Tensor()};
  }
};

class SwigluFunction : public torch::autograd::Function<SwigluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate_in, const at::Tensor& up_in) {
    TORCH_CHECK(gate_in.sizes() == up_in.sizes() && gate_in.scalar_type() == up_in.scalar_type(),
                "fused swiglu: gate ", gate_in.sizes(), " and up ", up_in.sizes(), " differ");
    const at::Tensor gate = gate_in.contiguous(), up = up_in.contiguous();
    ctx->save_for_backward({gate, up});
    const c10::cuda::CUDAGuard guard(gate.device());
    at::Tensor out = at::empty_like(gate, at::MemoryFormat::Contiguous);
    cuda::SwigluArgs a;
    a.gate = gate.data_ptr();
    a.up = up.data_ptr();
    a.out = out.data_ptr();
    a.n = gate.numel();
    a.dtype = element_type_of(gate, "fused swiglu");
    check_launch("fused swiglu", cuda::launch_swiglu(a, stream_of(gate)));
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& gate = saved[0];
    const at::Tensor& up = saved[1];
    const at::Tensor grad = grads[0].to(gate.scalar_type()).contiguous();
    const c10::cuda::CUDAGuard guard(gate.device());
    at::Tensor grad_gate = at::empty_like(gate), grad_up = at::empty_like(up);
    cuda::SwigluArgs a;
    a.gate = gate.data_ptr();
    a.up = up.data_ptr();
    a.grad = grad.data_ptr();
    a.out = grad_gate.data_ptr();
    a.out_up = grad_up.data_ptr();
    a.n = gate.numel();
    a.backward = true;
    a.dtype = element_type_of(gate, "fused swiglu");
    check_launch("fused swiglu backward", cuda::launch_swiglu(a, stream_of(gate)));
    return {grad_gate, grad_up};
  }
};

std::pair<at::Tensor, at::Tensor> run_add_rms_norm(const at::Tensor& residual, const at::Tensor& x,
                                                   const at::Tensor& weight, double eps) {
  const bool add = x.defined();
  TORCH_CHECK(!at::GradMode::is_enabled() ||
                  !(residual.requires_grad() || (add && x.requires_grad()) || weight.requires_grad()),
              "fused add_rms_norm: inference only (no autograd)");
  TORCH_CHECK(fused_add_rms_norm_takes(residual, x, weight), "fused add_rms_norm: residual ", residual.sizes(),
              ", x ", add ? x.sizes() : at::IntArrayRef(), " and weight ", weight.sizes(),
              " must be contiguous, of one dtype and device, x of the residual's shape, the weight [H]");
  const c10::cuda::CUDAGuard guard(residual.device());
  at::Tensor sum = add ? at::empty_like(residual) : residual;
  at::Tensor out = at::empty_like(residual);
  cuda::AddRmsNormArgs a;
  a.residual = residual.data_ptr();
  a.x = add ? x.data_ptr() : nullptr;
  a.sum = add ? sum.data_ptr() : nullptr;
  a.weight = weight.data_ptr();
  a.out = out.data_ptr();
  a.hidden = residual.size(-1);
  a.rows = a.hidden == 0 ? 0 : residual.numel() / a.hidden;
  a.eps = static_cast<float>(eps);
  a.dtype = element_type_of(residual, "fused add_rms_norm");
  check_launch("fused add_rms_norm", cuda::launch_add_rms_norm(a, stream_of(residual)));
  return {sum, out};
}
#endif

// max |got - want| / max |want| as a 0-d double tensor (a NaN stays NaN), left on the device.
at::Tensor relative_error(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor w = want.to(at::kDouble);
  return (got.to(at::kDouble) - w).abs().max() / w.abs().max().clamp_min(1e-30);
}

// max |fused - chain| / max |chain| of the residual add + RMSNorm (with and without the add)
// against the op chain (residual + x, then the unfused RMSNorm), as a 0-d double tensor (a NaN
// stays NaN). 1000 columns: each thread of the block loops, and every warp holds a partial sum.
at::Tensor fused_add_norm_error(c10::Device device, c10::ScalarType dtype) {
  const at::NoGradGuard no_grad;
  at::Generator gen = at::detail::createCPUGenerator(20261127);
  const auto on = [&](const at::Tensor& t) { return t.to(dtype).to(device); };
  const at::Tensor residual = on(at::randn({3, 5, 1000}, gen) * 2), x = on(at::randn({3, 5, 1000}, gen));
  RMSNorm chain(1000, 1e-6, residual.options());
  chain.weight.copy_(on(at::rand({1000}, gen) + 0.5));
  const at::Tensor sum = residual + x;
  const auto [fused_sum, fused_out] = fused_add_rms_norm(residual, x, chain.weight, 1e-6);
  const auto [same, fused_alone] = fused_add_rms_norm(residual, at::Tensor(), chain.weight, 1e-6);
  return at::stack({relative_error(fused_sum, sum), relative_error(fused_out, chain.forward(sum)),
                    relative_error(fused_alone, chain.forward(residual)), relative_error(same, residual)})
      .max();
}

// max |fused - chain| / max |chain| over the outputs and input gradients of the three ops, the
// chains being decoder.cpp's unfused paths (apply_rotary, an unfused RMSNorm, silu * up).
double fused_error(c10::Device device, c10::ScalarType dtype) {
  // The check differentiates, whatever the caller's mode: the first use is often a no-grad
  // forward (a rollout, a log-prob pass).
  const at::AutoGradMode grad_mode(true);
  at::Generator gen = at::detail::createCPUGenerator(20261126);
  const auto on = [&](const at::Tensor& t) { return t.to(dtype).to(device); };
  // Rotary on a transposed view (as the attention's split heads give it).
  const at::Tensor x0 = on(at::randn({2, 5, 3, 16}, gen)).transpose(1, 2);
  const at::Tensor angles = at::randn({2, 1, 5, 8}, gen).repeat({1, 1, 1, 2});
  const at::Tensor cos = on(angles.cos()), sin = on(angles.sin()), g_rot = on(at::randn({2, 3, 5, 16}, gen));
  // SwiGLU and RMSNorm on [3, 7, 24].
  const at::Tensor gate0 = on(at::randn({3, 7, 24}, gen) * 3), up0 = on(at::randn({3, 7, 24}, gen));
  const at::Tensor weight = on(at::rand({24}, gen) + 0.5), g_mlp = on(at::randn({3, 7, 24}, gen));
  RMSNorm chain_norm(24, 1e-6, weight.options());
  chain_norm.weight.data().copy_(weight);
  variable_list results[2];
  for (int fused = 0; fused < 2; ++fused) {
    at::Tensor x = x0.detach().clone().requires_grad_(true);
    at::Tensor gate = gate0.detach().clone().requires_grad_(true), up = up0.detach().clone().requires_grad_(true);
    at::Tensor n_in = gate0.detach().clone().requires_grad_(true);
    at::Tensor r = fused ? fused_rotary(x, cos, sin) : apply_rotary(x, RotaryTables{cos, sin, {}, {}});
    at::Tensor m = fused ? fused_swiglu(gate, up) : at::silu(gate) * up;
    // The fused RMSNorm as RMSNorm::forward runs it (calling forward with `fused` set would
    // re-enter this check).
    at::Tensor n = fused ? weight * std::get<0>(at::_fused_rms_norm(n_in, {24}, std::nullopt, 1e-6))
                         : chain_norm.forward(n_in);
    ((r * g_rot).sum() + (m * g_mlp).sum() + (n * g_mlp).sum()).backward();
    results[fused] = {r, m, n, x.grad(), gate.grad(), up.grad(), n_in.grad()};
  }
  std::vector<at::Tensor> errors;
  for (size_t i = 0; i < results[0].size(); ++i) errors.push_back(relative_error(results[1][i], results[0][i]));
  // Host boundary, deliberate: the one-time verdict of check_fused_layers, read once.
  return at::stack(errors).max().item<double>();
}

constexpr const char* kFusedLayers = "fused layer kernels";
constexpr const char* kFusedLayersFix =
    "set model.use_liger=false (the actor) or actor_rollout_ref.rollout.engine_kwargs.tessera.fused_layers=false "
    "(the rollout)";

constexpr const char* kFusedResidualNorm = "the fused residual add + RMSNorm kernel";
constexpr const char* kFusedResidualNormFix = "set actor_rollout_ref.rollout.engine_kwargs.tessera.fused_layers=false";

// A check's worst relative error against the tolerance of `dtype`, as a Status naming the key.
Status within_tolerance(double worst, c10::Device device, c10::ScalarType dtype, const char* what, const char* fix) {
  const double tolerance = dtype == at::kFloat ? 1e-5 : dtype == at::kHalf ? 4e-3 : 3e-2;
  if (worst <= tolerance) return Status();  // a NaN fails
  return make_error(ErrorCode::internal, "{} disagree with the unfused ops on {} in {} (relative error {:.3g}); {}",
                    what, device.str(), c10::toString(dtype), worst, fix);
}

}  // namespace

void set_fused_layers(torch::nn::Module& root, bool on) {
  for (const auto& m : root.modules(/*include_self=*/true)) {
    if (auto* norm = dynamic_cast<RMSNorm*>(m.get())) norm->fused = on;
    if (auto* attn = dynamic_cast<Attention*>(m.get())) attn->fused_rotary = on;
    if (auto* mlp = dynamic_cast<MLP*>(m.get())) mlp->fused_swiglu = on;
    if (auto* moe = dynamic_cast<SparseMoeBlock*>(m.get())) moe->fused_swiglu = on;
  }
}

at::Tensor fused_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
#if TESSERA_WITH_CUDA
  return RotaryFunction::apply(x, cos, sin);
#else
  (void)x, (void)cos, (void)sin;
  TORCH_CHECK(false, "fused_rotary: this build has no CUDA");
#endif
}

at::Tensor fused_swiglu(const at::Tensor& gate, const at::Tensor& up) {
#if TESSERA_WITH_CUDA
  return SwigluFunction::apply(gate, up);
#else
  (void)gate, (void)up;
  TORCH_CHECK(false, "fused_swiglu: this build has no CUDA");
#endif
}

bool fused_add_rms_norm_takes(const at::Tensor& residual, const at::Tensor& x, const at::Tensor& weight) {
  const auto like_residual = [&](const at::Tensor& t) {
    return t.is_contiguous() && t.scalar_type() == residual.scalar_type() && t.device() == residual.device();
  };
  return residual.dim() >= 1 && residual.is_contiguous() && like_residual(weight) && weight.dim() == 1 &&
         weight.size(0) == residual.size(-1) && (!x.defined() || (like_residual(x) && x.sizes() == residual.sizes()));
}

std::pair<at::Tensor, at::Tensor> fused_add_rms_norm(const at::Tensor& residual, const at::Tensor& x,
                                                     const at::Tensor& weight, double eps) {
#if TESSERA_WITH_CUDA
  return run_add_rms_norm(residual, x, weight, eps);
#else
  (void)residual, (void)x, (void)weight, (void)eps;
  TORCH_CHECK(false, "fused_add_rms_norm: this build has no CUDA");
#endif
}

Status check_fused_layers(c10::Device device, c10::ScalarType dtype) {
  static proto::cuda::CheckOnce verdicts;
  return verdicts.get(device, dtype, kFusedLayers, kFusedLayersFix, [&] {
    return within_tolerance(fused_error(device, dtype), device, dtype, kFusedLayers, kFusedLayersFix);
  });
}

Status check_fused_residual_norm(c10::Device device, c10::ScalarType dtype) {
  static proto::cuda::CheckOnce verdicts;
  return verdicts.get(device, dtype, kFusedResidualNorm, kFusedResidualNormFix, [&] {
    // Host boundary, deliberate: the self-check's verdict must reach the host; it runs once per
    // process and (device, dtype), before any generation, never inside a step or a graph capture.
    const double worst = fused_add_norm_error(device, dtype).item<double>();
    return within_tolerance(worst, device, dtype, kFusedResidualNorm, kFusedResidualNormFix);
  });
}

}  // namespace tessera::models
