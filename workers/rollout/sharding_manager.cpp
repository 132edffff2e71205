// sharding_manager.cpp: FsdpShardingManager (Note [Colocated resharding] in sharding_manager.hpp).
#include "workers/rollout/sharding_manager.hpp"


#include <algorithm>
#include <chrono>
#include <mutex>
#include <set>
#include <utility>

#include <ATen/CPUGeneratorImpl.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "proto/device.hpp"
#include "runtime/collective/device_mesh.hpp"
#include "runtime/collective/exchange.hpp"
#include "workers/fsdp/units.hpp"
#include "workers/models/lora.hpp"

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
  const int64_t tp = options.config.tensor_model_parallel_size;
  const auto& group = options.tp_group;
  if (tp > 1 && (group == nullptr || group->size() != tp)) {
    return make_error(ErrorCode::invalid_argument,
                      "actor_rollout_ref.rollout.tensor_model_parallel_size={} but the rollout TP group has {} ranks", tp,
                      group ? group->size() : 0);
  }
  try {
    // A model shell in the rollout dtype (TP: one rank's shapes) whose parameters are one-element
    // views on the actor's device: enter() swaps in references to the gathered units there, and
    // the engine keeps its cache and sampling on the same device.
    models::ModelInit init;
    init.dtype = dtype;
    if (tp > 1) {
      TESSERA_ASSIGN_OR_RETURN(model_config, tp_rank_config(model_config, tp));
    }
    TESSERA_ASSIGN_OR_RETURN(auto model, models::CausalLM::create(std::move(model_config), init));
    drop_weight_storage(*model, fsdp.device());
    PartialSumHook all_reduce;
    if (tp > 1) {
      all_reduce = [group](at::Tensor& partial) {
        partial = partial.contiguous();
        Status st = group->all_reduce(partial, collective::ReduceOp::sum);
        if (!st.ok()) throw std::runtime_error(st.to_string());
      };
    }
    EngineOptions engine_options = options.engine;
    if (tp > 1) {  // the peers' KV caps agree (EngineOptions::agree_min): the largest of the negations
      const c10::Device device = fsdp.device();
      engine_options.agree_min = [group, device](int64_t value) {
        at::Tensor t = at::full({1}, -value, at::TensorOptions(at::kLong).device(device));
        Status st = group->all_reduce(t, collective::ReduceOp::max);
        if (!st.ok()) throw std::runtime_error(st.to_string());
        return -t.item<int64_t>();  // a host read of one value, once per engine call
      };
    }
    auto engine = KVCacheEngine::create(std::make_unique<CausalLMStepModel>(model, std::move(all_reduce), tp),
                                        options.config, engine_options);
    if (!engine.ok()) return engine.status().with_context("rollout engine");
    std::unique_ptr<FsdpShardingManager> m(
        new FsdpShardingManager(fsdp, std::move(model), std::move(*engine), dtype, options.generation_seed));
    if (tp > 1) TESSERA_RETURN_IF_ERROR(m->plan_tp(tp, group->rank()));
    m->lora_scaling_ = options.lora_scaling;
    return m;
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, "sharding manager: {}", e.what());
  }
}

// Caches every TP rank's plan of every unit, and the TP rank of each member of this rank's FSDP
// group (world ranks are laid out row-major in both meshes, so world rank w is TP rank w % tp).
Status FsdpShardingManager::plan_tp(int64_t tp, int64_t tp_rank) {
  const collective::DeviceMesh& mesh = fsdp_.mesh();
  const int world_rank = mesh.world()->rank();
  if (world_rank % tp != tp_rank) {
    return make_error(ErrorCode::invalid_argument,
                      "rollout TP: world rank {} is TP rank {}, expected {} (TP groups are consecutive world ranks)",
                      world_rank, tp_rank, world_rank % tp);
  }
  tp_rank_ = tp_rank;
  fsdp_peer_tp_rank_.clear();
  if (fsdp_.shard_count() > 1) {
    TESSERA_ASSIGN_OR_RETURN(int dim, mesh.dim_index("fsdp"));
    for (int member : mesh.group_members(dim)) fsdp_peer_tp_rank_.push_back(static_cast<int>(member % tp));
  }
  tp_plans_.assign(fsdp_.layouts().size(), {});
  for (size_t u = 0; u < fsdp_.layouts().size(); ++u) {
    for (int64_t t = 0; t < tp; ++t) {
      TESSERA_ASSIGN_OR_RETURN(TpUnitPlan plan, TpUnitPlan::create(fsdp_.layouts()[u], tp, t));
      tp_plans_[u].push_back(std::move(plan));
    }
  }
  return Status();
}

void drop_weight_storage(models::CausalLM& model, std::optional<c10::Device> device) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters()) {
    p.set_data(at::zeros({1}, p.options().device(device.value_or(p.device()))).expand(p.sizes()));
  }
}

void FsdpShardingManager::free_rollout_weights() { drop_weight_storage(*rollout_model_); }

Result<models::TensorMap> FsdpShardingManager::gather_units() {
  torch::NoGradGuard no_grad;
  const int K = fsdp_.shard_count();
  std::shared_ptr<collective::Communicator> group;
  if (K > 1) {
    TESSERA_ASSIGN_OR_RETURN(group, fsdp_.mesh().group("fsdp"));
  }
  models::TensorMap tensors;
  const auto& layouts = fsdp_.layouts();
  std::set<std::string> adapted;  // base weights that LoRA adapters merge into
  if (lora_scaling_ > 0) {
    for (const auto& l : layouts) {
      for (const auto& e : l.params) {
        if (auto weight = models::lora_adapted_weight(e.name)) adapted.insert(*weight);
      }
    }
  }
  for (size_t u = 0; u < layouts.size(); ++u) {
    const fsdp::FlatLayout& layout = layouts[u];
    // LoRA merges into the units holding adapted weights: their buffers must not be the shards
    // themselves (K == 1, same dtype).
    const bool own_copy = K == 1 && std::any_of(layout.params.begin(), layout.params.end(),
                                                [&](const auto& e) { return adapted.count(e.name) > 0; });
    // Adapters are gathered in fp32 (the merge computes in fp32); the rest in the rollout dtype.
    const c10::ScalarType unit_dtype = fsdp::is_adapter_unit(layout) ? at::kFloat : dtype_;
    at::Tensor local = fsdp_.shard(static_cast<int>(u)).to(unit_dtype, /*non_blocking=*/false, own_copy).contiguous();
    at::Tensor full = local;
    if (K > 1) {
      full = at::empty({layout.padded_numel}, local.options());
      Status st = group->all_gather(local, full, fsdp_.options().comm);
      if (!st.ok()) return st.with_context("rollout gather of unit '" + layout.unit + "'");
    }
    for (const auto& e : layout.params) tensors[e.name] = full.narrow(0, e.offset, e.numel).view(e.shape);
    gathered_.push_back(full);
    stats_.gathered_bytes += full.numel() * static_cast<int64_t>(full.element_size());
    if (K > 1) stats_.received_bytes += (full.numel() - local.numel()) * static_cast<int64_t>(full.element_size());
  }
  stats_.units = static_cast<int64_t>(layouts.size());
  if (lora_scaling_ > 0) return models::merge_lora_weights(tensors, lora_scaling_, /*in_place=*/true);
  return tensors;
}

// Note [Rollout TP resharding]: one variable all-to-all per unit over the FSDP group.
Result<models::TensorMap> FsdpShardingManager::gather_tp_slices() {
  torch::NoGradGuard no_grad;
  const int K = fsdp_.shard_count();
  std::shared_ptr<collective::Communicator> group;
  if (K > 1) {
    TESSERA_ASSIGN_OR_RETURN(group, fsdp_.mesh().group("fsdp"));
  }
  const int me = K > 1 ? group->rank() : 0;
  models::TensorMap tensors;
  const auto& layouts = fsdp_.layouts();
  for (size_t u = 0; u < layouts.size(); ++u) {
    const fsdp::FlatLayout& layout = layouts[u];
    const TpUnitPlan& mine = tp_plans_[u][static_cast<size_t>(tp_rank_)];
    const c10::ScalarType unit_dtype = fsdp::is_adapter_unit(layout) ? at::kFloat : dtype_;  // as gather_units
    at::Tensor local = fsdp_.shard(static_cast<int>(u)).to(unit_dtype).contiguous();
    at::Tensor buffer;
    if (K == 1) {
      buffer = mine.pack(local, 0);  // a new buffer: LoRA's merge into it leaves the shard alone
    } else {
      buffer = at::empty({mine.numel()}, local.options());
      std::vector<at::Tensor> send(static_cast<size_t>(K)), recv(static_cast<size_t>(K)), packed(tp_plans_[u].size());
      for (int d = 0; d < K; ++d) {
        const int t = fsdp_peer_tp_rank_[static_cast<size_t>(d)];
        if (!packed[static_cast<size_t>(t)].defined()) {
          packed[static_cast<size_t>(t)] = tp_plans_[u][static_cast<size_t>(t)].pack(local, layout.shard_range(me).first);
        }
        send[static_cast<size_t>(d)] = packed[static_cast<size_t>(t)];
      }
      for (int s = 0; s < K; ++s) {
        const auto [a, b] = layout.shard_range(s);
        const int64_t lo = mine.count_before(a), hi = mine.count_before(b);
        recv[static_cast<size_t>(s)] = buffer.narrow(0, lo, hi - lo);
        if (s != me) stats_.received_bytes += (hi - lo) * static_cast<int64_t>(buffer.element_size());
      }
      Status st = collective::all_to_all_v(*group, send, recv, fsdp_.options().comm);
      if (!st.ok()) return st.with_context("rollout TP resharding of unit '" + layout.unit + "'");
    }
    for (const auto& p : mine.params()) {
      const int64_t numel = c10::multiply_integers(p.shape);
      tensors[p.name] = buffer.narrow(0, p.offset, numel).view(p.shape);
    }
    gathered_.push_back(buffer);
    stats_.gathered_bytes += buffer.numel() * static_cast<int64_t>(buffer.element_size());
  }
  stats_.units = static_cast<int64_t>(layouts.size());
  if (lora_scaling_ <= 0) return tensors;
  // The adapters are replicated on every TP rank (tp_split_of); each rank merges the slice of
  // B A * alpha / r that its slice of the weight holds: rows of W are rows of B, columns of W
  // columns of A.
  const int64_t tp = static_cast<int64_t>(tp_plans_.front().size());
  return models::merge_lora_weights(
      tensors, lora_scaling_, /*in_place=*/true, [&](const std::string& name, const at::Tensor& a, const at::Tensor& b) {
        const TpSplit split = tp_split_of(name);
        if (split == TpSplit::rows) return std::pair<at::Tensor, at::Tensor>(a, tp_slice(b, split, tp, tp_rank_));
        return std::pair<at::Tensor, at::Tensor>(tp_slice(a, split, tp, tp_rank_), b);
      });
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
  for (const auto& layout : fsdp_.layouts()) stats_.full_bytes += layout.numel * static_cast<int64_t>(c10::elementSize(dtype_));
  // A throw (a device OOM casting the shards) is a Status, so that fail() offloads again.
  auto tensors = [&]() -> Result<models::TensorMap> {
    try {
      return tp_plans_.empty() ? gather_units() : gather_tp_slices();
    } catch (...) {
      return proto::status_from_current_exception("sharding manager: gathering the rollout's weights");
    }
  }();
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
