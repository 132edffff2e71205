// sharding_manager.cpp: FsdpShardingManager (Note [Colocated resharding] in sharding_manager.hpp).
#include "workers/rollout/sharding_manager.hpp"

#include <chrono>
#include <mutex>
#include <utility>

#include <ATen/CPUGeneratorImpl.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "runtime/collective/device_mesh.hpp"

namespace tessera::rollout {

namespace {

// The default CPU generator's state is swapped under its own mutex (other threads of the process
// may draw from it).
at::Tensor swap_default_rng_state(const at::Tensor& new_state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  at::Tensor old = gen.get_state();
  gen.set_state(new_state);
  return old;
}

// Only one manager of the process holds the default generator swapped at a time (several ranks
// share one process in the embedded runtime; interleaved swaps would lose the training state).
std::mutex& swap_mutex() {
  static std::mutex mu;
  return mu;
}
bool& swap_held() {
  static bool held = false;
  return held;
}

at::Tensor seeded_rng_state(uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

}  // namespace

FsdpShardingManager::FsdpShardingManager(fsdp::FsdpModule& fsdp, std::shared_ptr<models::CausalLM> model,
                                         std::unique_ptr<KVCacheEngine> engine, c10::ScalarType dtype,
                                         uint64_t generation_seed)
    : fsdp_(fsdp),
      rollout_model_(std::move(model)),
      engine_(std::move(engine)),
      dtype_(dtype),
      generation_rng_state_(seeded_rng_state(generation_seed)) {}

FsdpShardingManager::~FsdpShardingManager() {
  Status st = exit();
  if (!st.ok()) spdlog::error("sharding manager exit at destruction: {}", st.to_string());
}

Result<std::unique_ptr<FsdpShardingManager>> FsdpShardingManager::create(fsdp::FsdpModule& fsdp,
                                                                         models::ModelConfig model_config,
                                                                         const ShardingManagerOptions& options) {
  TESSERA_ASSIGN_OR_RETURN(std::optional<c10::ScalarType> configured, rollout::rollout_dtype(options.config));
  const c10::ScalarType dtype = configured.value_or(fsdp.options().mixed_precision.param_dtype);
  try {
    // A model shell in the rollout dtype. Its weights are replaced by references at every enter();
    // the storage allocated here is released right after the engine has checked the model.
    models::ModelInit init;
    init.dtype = dtype;
    TESSERA_ASSIGN_OR_RETURN(auto model, models::CausalLM::create(std::move(model_config), init));
    auto engine = KVCacheEngine::create(model, options.config, options.engine);
    if (!engine.ok()) return engine.status().with_context("rollout engine");
    std::unique_ptr<FsdpShardingManager> m(
        new FsdpShardingManager(fsdp, std::move(model), std::move(*engine), dtype, options.generation_seed));
    m->free_rollout_weights();
    return m;
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, "sharding manager: {}", e.what());
  }
}

void FsdpShardingManager::free_rollout_weights() {
  // Each parameter keeps its HF shape (the next load checks it) as a broadcast view of one element.
  torch::NoGradGuard no_grad;
  for (auto& p : rollout_model_->parameters()) p.set_data(at::zeros({1}, p.options()).expand(p.sizes()));
}

Result<models::TensorMap> FsdpShardingManager::gather_units() {
  torch::NoGradGuard no_grad;
  const int K = fsdp_.shard_count();
  std::shared_ptr<collective::Communicator> group;
  if (K > 1) {
    TESSERA_ASSIGN_OR_RETURN(group, fsdp_.mesh().group("fsdp"));
  }
  models::TensorMap tensors;
  const auto& layouts = fsdp_.layouts();
  for (size_t u = 0; u < layouts.size(); ++u) {
    const fsdp::FlatLayout& layout = layouts[u];
    at::Tensor local = fsdp_.shard(static_cast<int>(u)).to(dtype_).contiguous();
    at::Tensor full = local;
    if (K > 1) {
      full = at::empty({layout.padded_numel}, local.options());
      Status st = group->all_gather(local, full, fsdp_.options().comm);
      if (!st.ok()) return st.with_context("rollout gather of unit '" + layout.unit + "'");
    }
    for (const auto& e : layout.params) tensors[e.name] = full.narrow(0, e.offset, e.numel).view(e.shape);
    gathered_.push_back(full);
    stats_.gathered_bytes += full.numel() * static_cast<int64_t>(full.element_size());
  }
  stats_.units = static_cast<int64_t>(layouts.size());
  return tensors;
}

int64_t FsdpShardingManager::bytes_outside_buffers() const {
  int64_t outside = 0;
  for (const auto& p : rollout_model_->parameters()) {
    const auto* begin = static_cast<const char*>(p.data_ptr());
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    bool inside = false;
    for (const auto& b : gathered_) {
      const auto* lo = static_cast<const char*>(b.data_ptr());
      const auto* hi = lo + b.numel() * static_cast<int64_t>(b.element_size());
      if (begin >= lo && begin + bytes <= hi) {
        inside = true;
        break;
      }
    }
    if (!inside) outside += bytes;
  }
  return outside;
}

Status FsdpShardingManager::enter() {
  if (entered_) return make_error(ErrorCode::invalid_argument, "sharding manager: enter() while already entered");
  const auto t0 = std::chrono::steady_clock::now();
  stats_ = ReshardStats{};
  const bool was_offloaded = fsdp_.params_offloaded();
  if (was_offloaded) TESSERA_RETURN_IF_ERROR(fsdp_.load_params());
  auto fail = [&](Status st) {
    gathered_.clear();
    free_rollout_weights();
    if (was_offloaded && !fsdp_.params_offloaded()) (void)fsdp_.offload_params();
    return st;
  };
  auto tensors = gather_units();
  if (!tensors.ok()) return fail(tensors.status());
  Status st = engine_->load_weights_by_reference(*tensors);
  if (!st.ok()) return fail(st.with_context("sharding manager"));
  stats_.handoff_copied_bytes = bytes_outside_buffers();
  if (stats_.handoff_copied_bytes != 0) {
    return fail(make_error(ErrorCode::internal, "sharding manager: {} bytes of engine weights are not views of the "
                                                "gathered buffers (the handoff copied)",
                           stats_.handoff_copied_bytes));
  }
  if (was_offloaded) {
    st = fsdp_.offload_params();
    if (!st.ok()) return fail(st);
  }
  {
    std::lock_guard<std::mutex> lock(swap_mutex());
    if (!swap_held()) {
      training_rng_state_ = swap_default_rng_state(generation_rng_state_);
      swap_held() = true;
      swapped_ = true;
    }
  }
  entered_ = true;
  stats_.reshard_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return Status();
}

Status FsdpShardingManager::exit() {
  if (!entered_) return Status();
  entered_ = false;
  try {
    if (swapped_) {
      std::lock_guard<std::mutex> lock(swap_mutex());
      generation_rng_state_ = swap_default_rng_state(training_rng_state_);
      training_rng_state_ = at::Tensor();
      swap_held() = false;
      swapped_ = false;
    }
    free_rollout_weights();
    gathered_.clear();
    return Status();
  } catch (const std::exception& e) {
    gathered_.clear();
    return make_error(ErrorCode::internal, "sharding manager exit: {}", e.what());
  }
}

}  // namespace tessera::rollout
