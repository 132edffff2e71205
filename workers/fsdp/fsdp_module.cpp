// fsdp_module.cpp: wrapping, gather / reduce / release, forward and backward.
// The design is Note [FSDP engine] in fsdp_module.hpp.
#include "workers/fsdp/fsdp_module.hpp"
#include "workers/fsdp/internal/activation_stash.hpp"

#include <algorithm>
#include <iterator>

#include <torch/torch.h>

#include <set>

#include "proto/device.hpp"

namespace tessera::fsdp {
namespace {

using collective::ReduceOp;

at::Tensor empty_param(c10::ScalarType dtype, const c10::Device& device) {
  return at::empty({0}, at::TensorOptions(dtype).device(device));
}

// Note [FSDP on the module's device]: the engine lives where the wrapped module's parameters are.
// Every buffer it makes (flat shards, AdamW moments, gathered units, gradients) takes that device,
// so a module moved to cuda:i before wrap() trains wholly there, and a CPU module on the CPU.
// Parameters on two devices are refused: there is no silent mix.
Result<c10::Device> module_device(torch::nn::Module& module) {
  std::optional<c10::Device> device;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const c10::Device d = item.value().device();
    if (!device) device = d;
    if (d != *device) {
      return make_error(ErrorCode::invalid_argument, "FSDP wrap: parameter '{}' is on {} but the others are on {}",
                        item.key(), d.str(), device->str());
    }
  }
  return device.value_or(c10::Device(c10::DeviceType::CPU));
}

Status check_mesh(ShardingStrategy s, const collective::DeviceMesh& mesh) {
  bool two_d = mesh.ndim() == 2 && mesh.has_dim("ddp") && mesh.has_dim("fsdp");
  bool one_d = mesh.ndim() == 1 && mesh.has_dim("fsdp");
  if (s == ShardingStrategy::hybrid_shard && !two_d) {
    return make_error(ErrorCode::invalid_argument,
                      "HYBRID_SHARD needs a (ddp, fsdp) device mesh, got {}", mesh.to_string());
  }
  if (s != ShardingStrategy::hybrid_shard && !one_d) {
    return make_error(ErrorCode::invalid_argument, "{} needs a 1-D (fsdp) device mesh, got {}",
                      to_string(s), mesh.to_string());
  }
  return Status();
}

}  // namespace

FsdpOptions fsdp_options_from_config(const FsdpConfig& config, int world_size) {
  FsdpOptions o;
  o.strategy = resolve_strategy(config, world_size);
  o.mixed_precision = config.mixed_precision;
  o.model_dtype = config.model_dtype;
  o.param_offload = config.param_offload;
  o.optimizer_offload = config.optimizer_offload;
  o.forward_prefetch = config.forward_prefetch;
  return o;
}

FsdpModule::~FsdpModule() = default;

FsdpModule::UnitState& FsdpModule::unit_state(int unit) {
  units_[unit]->host_current = false;  // the caller may write the shard (Note [Clean offload])
  return *units_[unit];
}

const FsdpModule::UnitState& FsdpModule::unit_state(int unit) const { return *units_[unit]; }

const at::Tensor& FsdpModule::shard(int unit) const { return units_[unit]->shard; }

Result<int> FsdpModule::unit_index(const std::string& name) const {
  for (size_t i = 0; i < layouts_.size(); ++i) {
    if (layouts_[i].unit == name) return static_cast<int>(i);
  }
  return make_error(ErrorCode::not_found, "FSDP has no unit '{}'", name);
}

Result<std::unique_ptr<FsdpModule>> FsdpModule::wrap(std::shared_ptr<torch::nn::Module> module,
                                                     std::vector<UnitSpec> units,
                                                     collective::DeviceMesh mesh,
                                                     const FsdpOptions& options,
                                                     const OptimizerOptions& optim) {
  if (!module) return make_error(ErrorCode::invalid_argument, "FSDP wrap: module is null");
  TESSERA_RETURN_IF_ERROR(check_mesh(options.strategy, mesh).with_context("FSDP wrap"));
  std::unique_ptr<FsdpModule> m(new FsdpModule(std::move(mesh)));
  m->module_ = std::move(module);
  TESSERA_ASSIGN_OR_RETURN(m->device_, module_device(*m->module_));
  m->options_ = options;
  if (options.offload_activations) m->activations_ = std::make_shared<internal::ActivationStash>();
  m->optim_ = optim;
  m->scheduler_ = LrScheduler(optim.adamw.lr, optim.schedule);
  auto fsdp = *m->mesh_.group("fsdp");
  if (options.strategy == ShardingStrategy::no_shard) {
    m->replicate_group_ = fsdp;  // the whole world on a 1-D mesh
  } else {
    m->shard_count_ = fsdp->size();
    m->shard_index_ = fsdp->rank();
    if (m->shard_count_ > 1) m->shard_group_ = fsdp;
    if (options.strategy == ShardingStrategy::hybrid_shard) m->replicate_group_ = *m->mesh_.group("ddp");
  }
  try {
    TESSERA_RETURN_IF_ERROR(m->init_units(units));
    for (auto& buffer : m->module_->buffers(/*recurse=*/true)) {
      if (at::isFloatingType(buffer.scalar_type())) {
        buffer.set_data(buffer.to(options.mixed_precision.buffer_dtype));
      }
    }
  } catch (...) {
    return proto::status_from_current_exception("FSDP wrap");
  }
  if (options.param_offload) TESSERA_RETURN_IF_ERROR(m->offload_params());
  m->optimizer_offloaded_ = options.optimizer_offload && !options.frozen;  // init_moments put them there
  return m;
}

// Looks up a unit's parameters, claiming each name once; fills `state` and the (name, shape) list.
// Units of a frozen module are never trainable.
static Status collect_unit_params(const UnitSpec& spec, const std::map<std::string, at::Tensor>& params,
                           std::set<std::string>& claimed, FsdpModule::UnitState& state,
                           std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes,
                           bool frozen) {
  for (const auto& name : spec.param_names) {
    auto it = params.find(name);
    if (it == params.end()) {
      return make_error(ErrorCode::not_found, "FSDP wrap: unit '{}' names unknown parameter '{}'",
                        spec.name, name);
    }
    if (!claimed.insert(name).second) {
      return make_error(ErrorCode::invalid_argument,
                        "FSDP wrap: parameter '{}' is in two units (second: '{}')", name, spec.name);
    }
    shapes.emplace_back(name, it->second.sizes().vec());
    state.params.push_back(it->second);
  }
  state.recompute = spec.recompute;
  if (frozen) {  // every parameter is treated as frozen: no gradient buffers
    state.trainable = false;
    return Status();
  }
  state.trainable = !state.params.empty() && state.params.front().requires_grad();
  for (const auto& p : state.params) {
    if (p.requires_grad() != state.trainable) {
      return make_error(ErrorCode::invalid_argument,
                        "FSDP wrap: unit '{}' mixes trainable and frozen parameters", spec.name);
    }
  }
  return Status();
}

// Validates coverage, builds layouts, and shards every unit.
Status FsdpModule::init_units(const std::vector<UnitSpec>& units) {
  std::map<std::string, at::Tensor> params;
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) params[item.key()] = item.value();
  std::set<std::string> claimed;
  for (const auto& spec : units) {
    std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
    auto state = std::make_unique<UnitState>();
    TESSERA_RETURN_IF_ERROR(collect_unit_params(spec, params, claimed, *state, shapes, options_.frozen));
    TESSERA_ASSIGN_OR_RETURN(FlatLayout layout, make_flat_layout(spec.name, shapes, shard_count_));
    TESSERA_RETURN_IF_ERROR(shard_unit(*state, layout));
    layouts_.push_back(std::move(layout));
    units_.push_back(std::move(state));
  }
  for (const auto& [name, tensor] : params) {
    if (!claimed.count(name)) {
      return make_error(ErrorCode::invalid_argument, "FSDP wrap: parameter '{}' is in no unit", name);
    }
  }
  for (size_t u = 0; u < units.size(); ++u) {  // Note [Attached units]
    if (units[u].owner.empty()) continue;
    auto owner = unit_index(units[u].owner);
    if (!owner.ok() || *owner == static_cast<int>(u) || !units[static_cast<size_t>(*owner)].owner.empty()) {
      return make_error(ErrorCode::invalid_argument,
                        "FSDP wrap: unit '{}' is attached to '{}', which is not a unit of its own", units[u].name,
                        units[u].owner);
    }
    if (units[u].recompute) {
      return make_error(ErrorCode::invalid_argument,
                        "FSDP wrap: unit '{}' is attached to '{}' and cannot be recomputed on its own",
                        units[u].name, units[u].owner);
    }
    units_[u]->owner = *owner;
    units_[static_cast<size_t>(*owner)]->attached.push_back(static_cast<int>(u));
  }
  return Status();
}

// Flattens the unit (world rank 0's values when syncing), keeps this rank's shard, allocates the
// AdamW moments (unless frozen) and frees the module's parameter storage.
Status FsdpModule::shard_unit(UnitState& state, const FlatLayout& layout) {
  const bool in_param_dtype = options_.frozen_units_in_param_dtype && !options_.frozen && !state.trainable;
  const c10::ScalarType dtype = in_param_dtype ? options_.mixed_precision.param_dtype : options_.model_dtype;
  at::Tensor flat = at::zeros({layout.padded_numel}, at::TensorOptions(dtype).device(device_));
  for (size_t i = 0; i < layout.params.size(); ++i) {
    const auto& e = layout.params[i];
    flat.narrow(0, e.offset, e.numel).copy_(state.params[i].detach().reshape(-1));
  }
  if (options_.sync_module_states && mesh_.world()->size() > 1) {
    TESSERA_RETURN_IF_ERROR(mesh_.world()->broadcast(flat, 0, options_.comm));
  }
  auto [begin, end] = layout.shard_range(shard_index_);
  state.shard = flat.narrow(0, begin, end - begin).clone();
  if (state.trainable) init_moments(state);
  state.anchor = at::empty({0}, at::TensorOptions(at::kFloat).device(device_)).requires_grad_(true);
  for (auto& p : state.params) p.set_data(empty_param(options_.mixed_precision.param_dtype, device_));
  return Status();
}

Status FsdpModule::check_device(const c10::Device& device) const {
  const std::string name = options_.name.empty() ? "<unnamed>" : options_.name;
  auto check = [&](const at::Tensor& t, const std::string& unit, const char* what) -> Status {
    if (!t.defined() || t.device() == device) return Status();
    return make_error(ErrorCode::internal, "FSDP module '{}': {} of unit '{}' is on {}, not on {}", name, what, unit,
                      t.device().str(), device.str());
  };
  for (size_t u = 0; u < units_.size(); ++u) {
    const UnitState& s = *units_[u];
    const std::string& unit = layouts_[u].unit;
    TESSERA_RETURN_IF_ERROR(check(s.shard, unit, "the shard"));
    TESSERA_RETURN_IF_ERROR(check(s.shard_grad, unit, "the shard gradient"));
    TESSERA_RETURN_IF_ERROR(check(s.adam.exp_avg, unit, "AdamW exp_avg"));
    TESSERA_RETURN_IF_ERROR(check(s.adam.exp_avg_sq, unit, "AdamW exp_avg_sq"));
    TESSERA_RETURN_IF_ERROR(check(s.full, unit, "the gathered parameters"));
  }
  for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
    if (item.value().device() != device) {
      return make_error(ErrorCode::internal, "FSDP module '{}': parameter '{}' is on {}, not on {}", name, item.key(),
                        item.value().device().str(), device.str());
    }
  }
  for (const auto& item : module_->named_buffers(/*recurse=*/true)) {
    if (item.value().defined() && item.value().device() != device) {
      return make_error(ErrorCode::internal, "FSDP module '{}': buffer '{}' is on {}, not on {}", name, item.key(),
                        item.value().device().str(), device.str());
    }
  }
  return Status();
}

Status FsdpModule::check_loaded(const char* what) const {
  if (params_offloaded_) {
    return make_error(ErrorCode::invalid_argument,
                      "FSDP {}: parameters are offloaded to CPU; call load_params() first", what);
  }
  return Status();
}

Status FsdpModule::check_trainable(const char* what) const {
  if (!options_.frozen) return Status();
  std::string units = layouts_.empty() ? std::string("no units")
                                       : fmt::format("{} units '{}' .. '{}'", layouts_.size(),
                                                     layouts_.front().unit, layouts_.back().unit);
  return make_error(ErrorCode::invalid_argument,
                    "FSDP {}: module '{}' is frozen (wrapped without an optimizer; {}): it has no "
                    "gradients or optimizer state",
                    what, options_.name.empty() ? "<unnamed>" : options_.name, units);
}

std::vector<int> FsdpModule::gathered_units() const {
  std::vector<int> out;
  for (size_t u = 0; u < units_.size(); ++u) {
    if (units_[u]->full.defined()) out.push_back(static_cast<int>(u));
  }
  return out;
}

bool FsdpModule::recompute_in_backward() const {
  return options_.strategy == ShardingStrategy::full_shard ||
         options_.strategy == ShardingStrategy::hybrid_shard;
}

Status FsdpModule::start_gather(int u) {
  UnitState& s = *units_[u];
  if (s.full.defined()) return Status();  // gathered, or its gather is under way
  const FlatLayout& layout = layouts_[u];
  const auto param_dtype = options_.mixed_precision.param_dtype;
  at::Tensor local = s.shard.to(param_dtype);
  at::Tensor full = at::empty({layout.padded_numel}, at::TensorOptions(param_dtype).device(device_));
  if (shard_group_) {
    auto started = shard_group_->start_all_gather(local, full, options_.comm);
    if (!started.ok()) return started.status().with_context("FSDP gather of unit '" + layout.unit + "'");
    s.gathering = std::move(*started);
  } else {
    full.copy_(local);
  }
  s.full = full;
  for (int a : s.attached) TESSERA_RETURN_IF_ERROR(start_gather(a));
  return Status();
}

Status FsdpModule::gather_unit(int u, bool train) {
  TESSERA_RETURN_IF_ERROR(start_gather(u));
  UnitState& s = *units_[u];
  const FlatLayout& layout = layouts_[u];
  Status gathered = s.gathering.wait();
  if (!gathered.ok()) return gathered.with_context("FSDP gather of unit '" + layout.unit + "'");
  const bool with_grad = train && s.trainable;
  for (size_t i = 0; i < layout.params.size(); ++i) {
    const auto& e = layout.params[i];
    s.params[i].set_data(s.full.narrow(0, e.offset, e.numel).view(e.shape));
    s.params[i].mutable_grad() = at::Tensor();  // Note [Gradients taken over]
  }
  s.pending_reduce = s.pending_reduce || with_grad;
  for (int a : s.attached) TESSERA_RETURN_IF_ERROR(gather_unit(a, train));
  return Status();
}

Status FsdpModule::prefetch_after(int unit, bool backward) {
  int next = -1;
  if (backward) {  // the unit that ran before `unit` in this forward
    auto it = std::find(forward_order_.rbegin(), forward_order_.rend(), unit);
    if (it != forward_order_.rend() && std::next(it) != forward_order_.rend()) next = *std::next(it);
  } else if (options_.forward_prefetch) {  // the next recomputed unit in module order
    for (size_t v = static_cast<size_t>(unit) + 1; v < units_.size() && next < 0; ++v) {
      if (units_[v]->recompute) next = static_cast<int>(v);
    }
  }
  return next < 0 ? Status() : start_gather(next);
}

Status FsdpModule::reduce_unit(int u) {
  UnitState& s = *units_[u];
  const FlatLayout& layout = layouts_[u];
  for (int a : s.attached) TESSERA_RETURN_IF_ERROR(reduce_unit(a));
  if (!s.pending_reduce) return Status();
  s.pending_reduce = false;
  // The reductions started by the units before this one have run beside this unit's backward:
  // their results are added now (Note [FSDP overlap]).
  TESSERA_RETURN_IF_ERROR(finish_reductions());
  std::string ctx = "FSDP gradient reduction of unit '" + layout.unit + "'";
  // Note [Gradients taken over]: the flat gradient is the parameters' own gradients laid end to
  // end, zeros where one got none, and the layout's padding.
  const auto param_dtype = options_.mixed_precision.param_dtype;
  const auto zeros = [&](int64_t n) { return at::zeros({n}, at::TensorOptions(param_dtype).device(device_)); };
  std::vector<at::Tensor> parts;
  parts.reserve(layout.params.size() + 1);
  for (size_t i = 0; i < layout.params.size(); ++i) {
    const at::Tensor& grad = s.params[i].grad();
    parts.push_back(grad.defined() ? grad.reshape({-1}).to(param_dtype) : zeros(layout.params[i].numel));
  }
  if (layout.padded_numel > layout.numel) parts.push_back(zeros(layout.padded_numel - layout.numel));
  at::Tensor g = at::cat(parts).to(options_.mixed_precision.reduce_dtype);
  for (auto& p : s.params) p.mutable_grad() = at::Tensor();
  at::Tensor reduced = g;
  if (shard_group_) {
    reduced = at::empty({layout.shard_numel()}, g.options());
    if (replicate_group_) {  // the all-reduce needs the reduce-scatter's result: both blocking
      Status st = shard_group_->reduce_scatter(g, reduced, ReduceOp::avg, options_.comm);
      if (!st.ok()) return st.with_context(ctx);
    } else {
      auto started = shard_group_->start_reduce_scatter(g, reduced, ReduceOp::avg, options_.comm);
      if (!started.ok()) return started.status().with_context(ctx);
      s.reducing = std::move(*started);
    }
  }
  if (replicate_group_) {
    Status st = replicate_group_->all_reduce(reduced, ReduceOp::avg, options_.comm);
    if (!st.ok()) return st.with_context(ctx);
  }
  s.reduced = reduced;
  return Status();
}

Status FsdpModule::finish_reductions() {
  for (size_t u = 0; u < units_.size(); ++u) {
    UnitState& s = *units_[u];
    if (!s.reduced.defined()) continue;
    Status st = s.reducing.wait();
    const at::Tensor reduced = std::move(s.reduced);
    s.reduced = at::Tensor();
    if (!st.ok()) return st.with_context("FSDP gradient reduction of unit '" + layouts_[u].unit + "'");
    if (s.shard_grad.defined()) {
      s.shard_grad.add_(reduced.to(options_.model_dtype));
    } else {
      s.shard_grad = reduced.to(options_.model_dtype, /*non_blocking=*/false, /*copy=*/true);
    }
  }
  return Status();
}

void FsdpModule::release_unit(int u) {
  UnitState& s = *units_[u];
  (void)s.gathering.wait();  // a failure has broken the group: its next call reports it
  for (auto& p : s.params) {
    p.set_data(empty_param(options_.mixed_precision.param_dtype, device_));
    p.mutable_grad() = at::Tensor();
  }
  s.full = at::Tensor();
  s.pending_reduce = false;
  for (int a : s.attached) release_unit(a);
}

Status FsdpModule::begin_forward(ForwardMode mode) {
  TESSERA_RETURN_IF_ERROR(check_loaded("begin_forward"));
  if (mode == ForwardMode::train) TESSERA_RETURN_IF_ERROR(check_trainable("begin_forward(train)"));
  if (in_forward_) {
    return make_error(ErrorCode::invalid_argument,
                      "FSDP begin_forward: the previous forward has not ended (call backward() "
                      "or end_forward())");
  }
  in_forward_ = true;
  mode_ = mode;
  recompute_fns_.clear();
  forward_order_.clear();
  if (activations_) activations_->clear();
  Status st;
  try {
    for (size_t u = 0; u < units_.size() && st.ok(); ++u) {
      if (units_[u]->recompute && recompute_in_backward()) continue;  // run_unit gathers it
      if (units_[u]->owner >= 0) continue;  // gathered with its owner
      st = gather_unit(static_cast<int>(u), mode == ForwardMode::train);
    }
  } catch (...) {
    st = proto::status_from_current_exception("FSDP begin_forward");
  }
  if (!st.ok()) (void)end_forward();  // nothing stays gathered; the next forward may start
  return st;
}

Status FsdpModule::end_forward() {
  for (size_t u = 0; u < units_.size(); ++u) {
    release_unit(static_cast<int>(u));
    UnitState& s = *units_[u];  // an abandoned backward's reductions are dropped
    (void)s.reducing.wait();
    s.reduced = at::Tensor();
  }
  recompute_fns_.clear();
  forward_order_.clear();
  if (activations_) activations_->clear();
  in_forward_ = false;
  return Status();
}

Status FsdpModule::reduce_pending() {
  for (size_t u = 0; u < units_.size(); ++u) {
    TESSERA_RETURN_IF_ERROR(reduce_unit(static_cast<int>(u)));
    release_unit(static_cast<int>(u));
  }
  return finish_reductions();
}

Status FsdpModule::backward(const at::Tensor& loss) {
  TESSERA_RETURN_IF_ERROR(check_trainable("backward"));
  if (!in_forward_ || mode_ != ForwardMode::train) {
    return make_error(ErrorCode::invalid_argument,
                      "FSDP backward: no training forward is in progress (begin_forward(train))");
  }
  Status st;
  try {
    loss.backward();
  } catch (...) {
    st = proto::status_from_current_exception("FSDP backward");
  }
  if (st.ok()) {
    try {
      st = reduce_pending();
    } catch (...) {
      st = proto::status_from_current_exception("FSDP backward");
    }
  }
  end_forward();
  return st;
}

void FsdpModule::zero_grad() {
  for (auto& s : units_) s->shard_grad = at::Tensor();
}

Result<std::map<std::string, at::Tensor>> FsdpModule::full_state_dict(
    c10::ScalarType dtype, const std::function<bool(const FlatLayout&)>& include) {
  std::map<std::string, at::Tensor> out;
  try {
    for (size_t u = 0; u < units_.size(); ++u) {
      const FlatLayout& layout = layouts_[u];
      if (include && !include(layout)) continue;
      // Offloaded shards are read from their host buffers, a unit at a time.
      const at::Tensor shard = params_offloaded_ ? units_[u]->offload_shard.to(device_) : units_[u]->shard;
      at::Tensor full = shard;
      if (shard_group_) {
        full = at::empty({layout.padded_numel}, shard.options());
        Status st = shard_group_->all_gather(shard, full, options_.comm);
        if (!st.ok()) return st.with_context("FSDP full_state_dict of unit '" + layout.unit + "'");
      }
      for (const auto& e : layout.params) {
        out[e.name] = full.narrow(0, e.offset, e.numel).view(e.shape).to(dtype, false, /*copy=*/true);
      }
    }
  } catch (...) {
    return proto::status_from_current_exception("FSDP full_state_dict");
  }
  return out;
}

}  // namespace tessera::fsdp
