// recompute.cpp: run_unit() and the autograd function behind FULL_SHARD's free-after-forward.
//
// Note [Recompute unit]
// With leaf parameters aliasing a gathered buffer (Note [FSDP engine]), autograd's saved tensors
// reference the full parameters, so a unit can only be freed after its forward if backward does
// not need what forward saved. RecomputeUnit achieves that, like torch.utils.checkpoint:
//   forward:  gather the unit (no gradient buffers), run fn(input) without building a graph,
//             release the unit; save only `input`.
//   backward: gather the unit again (with gradient buffers), rerun fn on a detached copy of
//             `input` with grad enabled, backpropagate grad_output through it (a re-entrant
//             autograd call, which accumulates into the flat gradient buffer), reduce the
//             unit's gradient right away (reduce-scatter; NO_SHARD all-reduces) and release it;
//             return the input's gradient.
// That is activation checkpointing, and it runs under every strategy: under SHARD_GRAD_OP and
// NO_SHARD the unit stays gathered from begin_forward() to its backward, so forward neither
// gathers nor releases it, and backward's gather only points the parameters at the gathered
// buffer again (no collective).
// With offload_activations the saved `input` waits in host memory instead (Note [Activation
// offload] in activation_stash.cpp), and the next unit's is prefetched when a recompute starts.
// A zero-size leaf `anchor` that requires grad is passed as a second input, so the node is in
// the graph even when `input` does not require grad. Errors inside backward can only leave
// autograd as exceptions; FsdpModule::backward() catches them and returns a Status. All ranks
// build the same graph, so the gathers and reductions issued from backward happen in the same
// order everywhere.
#include <torch/torch.h>

#include "workers/fsdp/fsdp_module.hpp"
#include "workers/fsdp/internal/activation_stash.hpp"

namespace tessera::fsdp {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct RecomputeUnit : public torch::autograd::Function<RecomputeUnit> {
  static variable_list forward(AutogradContext* ctx, at::Tensor input, at::Tensor anchor,
                               FsdpModule* engine, int64_t unit, int64_t fn_index) {
    ctx->saved_data["engine"] = reinterpret_cast<int64_t>(engine);
    ctx->saved_data["unit"] = unit;
    ctx->saved_data["fn"] = fn_index;
    // A host input stays as it is in its slot (the same bookkeeping on every device).
    const bool parked = engine->activations_ != nullptr;
    ctx->saved_data["parked"] = parked;
    ctx->saved_data["input_requires_grad"] = input.requires_grad();
    if (parked) {
      engine->activations_->put(static_cast<size_t>(fn_index), input);
    } else {
      ctx->save_for_backward({input});
    }
    // FULL_SHARD / HYBRID_SHARD gather the unit for its forward and free it after; the other
    // strategies keep it gathered from begin_forward() to backward.
    const bool frees = engine->recompute_in_backward();
    if (frees) {
      throw_if_error(engine->gather_unit(static_cast<int>(unit), /*train=*/false));
      throw_if_error(engine->prefetch_after(static_cast<int>(unit), /*backward=*/false));
    }
    at::Tensor out = engine->recompute_fns_[fn_index](input);
    if (frees) engine->release_unit(static_cast<int>(unit));
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto* engine = reinterpret_cast<FsdpModule*>(ctx->saved_data["engine"].toInt());
    int unit = static_cast<int>(ctx->saved_data["unit"].toInt());
    int64_t fn_index = ctx->saved_data["fn"].toInt();
    at::Tensor input;
    if (ctx->saved_data["parked"].toBool()) {
      input = engine->activations_->take(static_cast<size_t>(fn_index));
      // The unit whose backward comes next ran just before this one in forward.
      if (fn_index > 0) engine->activations_->prefetch(static_cast<size_t>(fn_index - 1));
    } else {
      input = ctx->get_saved_variables()[0];
    }
    const bool input_requires_grad = ctx->saved_data["input_requires_grad"].toBool();
    throw_if_error(engine->gather_unit(unit, /*train=*/true));
    throw_if_error(engine->prefetch_after(unit, /*backward=*/true));  // Note [FSDP overlap]
    at::Tensor x = input.detach().requires_grad_(input_requires_grad);
    at::Tensor out;
    {
      at::AutoGradMode enable(true);
      out = engine->recompute_fns_[fn_index](x);
    }
    if (out.requires_grad()) torch::autograd::backward({out}, {grad_outputs[0]});
    Status st = engine->reduce_unit(unit);
    engine->release_unit(unit);
    throw_if_error(st);
    at::Tensor grad_input = x.requires_grad() ? x.grad() : at::Tensor();
    return {grad_input, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }

  static void throw_if_error(const Status& st) {
    if (!st.ok()) throw std::runtime_error(st.to_string());
  }
};

Result<at::Tensor> FsdpModule::run_unit(int unit, std::function<at::Tensor(const at::Tensor&)> fn,
                                        const at::Tensor& input) {
  if (!in_forward_) {
    return make_error(ErrorCode::invalid_argument, "FSDP run_unit: call begin_forward() first");
  }
  if (unit < 0 || unit >= static_cast<int>(units_.size())) {
    return make_error(ErrorCode::out_of_range, "FSDP run_unit: unit {} is outside [0, {})", unit,
                      units_.size());
  }
  UnitState& s = *units_[unit];
  if (s.owner >= 0) {
    return make_error(ErrorCode::invalid_argument, "FSDP run_unit: unit '{}' is attached to '{}' and runs with it",
                      layouts_[unit].unit, layouts_[s.owner].unit);
  }
  try {
    const bool frees = recompute_in_backward();  // FULL_SHARD / HYBRID_SHARD
    const bool no_graph = mode_ == ForwardMode::eval || !at::GradMode::is_enabled();
    if (!s.recompute || (no_graph && !frees)) {
      if (!s.full.defined()) TESSERA_RETURN_IF_ERROR(gather_unit(unit, mode_ == ForwardMode::train));
      return fn(input);
    }
    if (no_graph) {
      TESSERA_RETURN_IF_ERROR(gather_unit(unit, /*train=*/false));
      TESSERA_RETURN_IF_ERROR(prefetch_after(unit, /*backward=*/false));
      at::Tensor out = fn(input);
      release_unit(unit);
      return out;
    }
    recompute_fns_.push_back(std::move(fn));
    forward_order_.push_back(unit);
    int64_t index = static_cast<int64_t>(recompute_fns_.size()) - 1;
    return RecomputeUnit::apply(input, s.anchor, this, static_cast<int64_t>(unit), index)[0];
  } catch (const std::exception& e) {
    std::string msg = e.what();
    if (const auto* ce = dynamic_cast<const c10::Error*>(&e)) msg = ce->what_without_backtrace();
    if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
    return make_error(ErrorCode::internal, "FSDP run_unit '{}': {}", layouts_[unit].unit, msg);
  }
}

}  // namespace tessera::fsdp
