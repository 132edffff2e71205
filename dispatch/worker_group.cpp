// worker_group.cpp: WorkerGroup calls, futures across groups, and the worker-type adapter.
#include "dispatch/worker_group.hpp"

#include <algorithm>
#include <atomic>
#include <optional>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "dispatch/futures.hpp"
#include "dispatch/internal/concat_collect.hpp"
#include "dispatch/internal/row_plan.hpp"
#include "runtime/wire.hpp"

namespace tessera::dispatch {

// ---- worker side -------------------------------------------------------------------------------

void WorkerBase::register_dispatch_collect_info(const std::string& mesh, int64_t dp_rank,
                                                bool is_collect) {
  mesh_info_[mesh] = {dp_rank, is_collect};
}

Result<std::pair<int64_t, bool>> WorkerBase::dispatch_collect_info(const std::string& mesh) const {
  auto it = mesh_info_.find(mesh);
  if (it != mesh_info_.end()) return it->second;
  return make_error(ErrorCode::not_found, "rank {} registered no dispatch info for mesh '{}'",
                    context_.rank, mesh);
}

nlohmann::json spec_to_json(const MethodSpec& s) {
  return {{"dispatch_mode", s.dispatch_mode}, {"execute_mode", to_string(s.execute_mode)},
          {"blocking", s.blocking}, {"materialize_futures", s.materialize_futures}};
}

Result<MethodSpec> spec_from_json(const std::string& name, const nlohmann::json& a) {
  MethodSpec s;
  s.name = name;
  try {
    s.dispatch_mode = a.value("dispatch_mode", std::string(Dispatch::ALL_TO_ALL));
    TESSERA_ASSIGN_OR_RETURN(s.execute_mode, parse_execute_mode(a.value("execute_mode", "ALL")));
    s.blocking = a.value("blocking", true);
    s.materialize_futures = a.value("materialize_futures", true);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::corrupt_data, "method '{}': bad attributes: {}", name, e.what());
  }
  return s;
}

namespace {

// The runtime worker that owns a WorkerBase.
class AdaptedWorker : public runtime::Worker {
 public:
  explicit AdaptedWorker(std::unique_ptr<WorkerBase> impl) : impl_(std::move(impl)) {
    for (const MethodSpec& spec : impl_->methods().specs()) {
      std::string name = spec.name;
      register_method(name, [this, name](Args& args) { return impl_->methods().invoke(name, args); },
                      spec_to_json(spec));
    }
    register_method(kDispatchInfoMethod, [this](Args& args) -> Result<Value> {
      if (args.size() != 1 || !args[0].is_json() || !args[0].json().is_string()) {
        return make_error(ErrorCode::invalid_argument, "{} takes one mesh name", kDispatchInfoMethod);
      }
      TESSERA_ASSIGN_OR_RETURN(auto info, impl_->dispatch_collect_info(args[0].json()));
      return Value(nlohmann::json{{"dp_rank", info.first}, {"is_collect", info.second}});
    });
  }

 private:
  std::unique_ptr<WorkerBase> impl_;
};

}  // namespace

Status register_worker_type(runtime::WorkerTypeRegistry& registry, const std::string& type_name,
                            WorkerBaseFactory factory) {
  return registry.add(type_name, [factory](const runtime::WorkerContext& ctx,
                                           const nlohmann::json& cfg)
                                     -> Result<std::unique_ptr<runtime::Worker>> {
    TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<WorkerBase> impl, factory(ctx, cfg));
    return std::unique_ptr<runtime::Worker>(std::make_unique<AdaptedWorker>(std::move(impl)));
  });
}

// ---- futures -----------------------------------------------------------------------------------

namespace {

// A non-blocking call's outputs, left on its ranks until consumed.
struct FutureState {
  runtime::Runtime* rt = nullptr;
  std::string producer;
  MethodSpec spec;
  std::shared_ptr<runtime::CallBatch> batch;
  std::vector<int32_t> ranks;               // ranks called
  CollectContext collect;                   // world, pad, mesh info
  std::vector<runtime::PayloadHandle> inputs;   // driver-published args, released when done
  std::vector<uint64_t> consumed;           // futures this call consumed
  std::optional<Result<std::vector<runtime::WireValue>>> results;
  std::mutex mu;  // guards results (a future may be waited on from several threads)
};

class FutureTable {
 public:
  static FutureTable& get() {
    static FutureTable table;
    return table;
  }
  uint64_t add(std::shared_ptr<FutureState> s) {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t id = next_++;
    states_[id] = std::move(s);
    return id;
  }
  Result<std::shared_ptr<FutureState>> find(const FutureRef& f) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = states_.find(f.id);
    if (it != states_.end()) return it->second;
    return make_error(ErrorCode::not_found,
                      "future {} of group '{}' was already consumed or released (futures are "
                      "single-use)", f.id, f.producer);
  }
  std::shared_ptr<FutureState> take(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = states_.find(id);
    if (it == states_.end()) return nullptr;
    auto s = std::move(it->second);
    states_.erase(it);
    return s;
  }

 private:
  std::mutex mu_;
  std::unordered_map<uint64_t, std::shared_ptr<FutureState>> states_;
  uint64_t next_ = 1;
};

void release_future_payloads(FutureState& s);

// Waits for the call behind `s` (once), then releases the driver-side inputs and the futures
// it consumed.
const Result<std::vector<runtime::WireValue>>& resolve(FutureState& s) {
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.results) {
    s.results = runtime::first_error(s.batch->wait());
    s.rt->release_all(s.inputs);
    s.inputs.clear();
    for (uint64_t id : s.consumed) {
      if (auto used = FutureTable::get().take(id)) release_future_payloads(*used);
    }
    s.consumed.clear();
  }
  return *s.results;
}

void release_future_payloads(FutureState& s) {
  const auto& results = resolve(s);
  if (!results.ok()) return;
  for (const auto& w : *results) s.rt->release_all(runtime::payload_handles(w));
}

// Whether called rank i's output is part of the data (n-d modes gather collect ranks only).
bool counts(const FutureState& s, size_t i) {
  auto mode = s.spec.dispatch_mode;
  if (mode.rfind("nd:", 0) != 0) return true;
  auto it = s.collect.mesh_info.find(mode.substr(3));
  int32_t rank = s.ranks[i];
  return it == s.collect.mesh_info.end() || it->second.is_collect.at(static_cast<size_t>(rank));
}

// The producer slices that hold the future's data, in order, and their row counts.
Result<std::vector<runtime::PayloadSlice>> producer_slices(FutureState& s) {
  const auto& results = resolve(s);
  if (!results.ok()) {
    return results.status().with_context(fmt::format("future of {}.{}", s.producer, s.spec.name));
  }
  std::vector<runtime::PayloadSlice> out;
  for (size_t i = 0; i < results->size(); ++i) {
    if (!counts(s, i)) continue;
    const runtime::WireValue& w = (*results)[i];
    if (w.kind != static_cast<uint8_t>(runtime::WireKind::proto_slices)) {
      return make_error(ErrorCode::invalid_argument,
                        "future of {}.{}: rank {} returned no DataProto, so it cannot be passed "
                        "on", s.producer, s.spec.name, s.ranks[i]);
    }
    out.insert(out.end(), w.slices.begin(), w.slices.end());
  }
  return out;
}

// Note [Futures across groups]: the consumer rank's chunk as producer row ranges.
Result<runtime::WireValue> future_to_wire(const FutureRef& f, int64_t& pad_out) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<FutureState> s, FutureTable::get().find(f));
  TESSERA_ASSIGN_OR_RETURN(std::vector<runtime::PayloadSlice> parts, producer_slices(*s));
  std::vector<int64_t> rows;
  for (const auto& p : parts) rows.push_back(p.row_end - p.row_begin);
  bool chunked = f.consumer_world > 0;
  TESSERA_ASSIGN_OR_RETURN(ChunkPlan plan,
                           plan_future_chunk(rows, s->collect.pad, chunked ? f.consumer_world : 1,
                                             chunked ? f.consumer_rank : 0,
                                             chunked && f.auto_padding));
  pad_out = plan.pad;
  runtime::WireValue w;
  w.kind = static_cast<uint8_t>(runtime::WireKind::proto_slices);
  for (const RowSource& src : plan.pieces) {
    const runtime::PayloadSlice& p = parts.at(static_cast<size_t>(src.producer_rank));
    for (int64_t k = 0; k < src.repeat; ++k) {
      w.slices.push_back({p.handle, p.row_begin + src.begin, p.row_begin + src.end});
    }
  }
  if (w.slices.empty()) {
    return make_error(ErrorCode::invalid_argument, "future of {}.{} holds no rows", s->producer,
                      s->spec.name);
  }
  return w;
}

}  // namespace

// ---- WorkerGroup -------------------------------------------------------------------------------

namespace {

// What encoding one call's arguments produced besides the wire values.
struct CallBuild {
  runtime::Runtime& rt;
  std::vector<runtime::PayloadHandle> published;
  std::vector<uint64_t> consumed;
  int64_t future_pad = -1;
};

// `v` is this call's own (split) argument: its DataProtos are moved, not copied.
Result<runtime::WireValue> encode(Value&& v, const runtime::WorkerRef& w, CallBuild& b) {
  if (is_future(v)) {
    TESSERA_ASSIGN_OR_RETURN(FutureRef f, future_of(v));
    int64_t pad = 0;
    TESSERA_ASSIGN_OR_RETURN(runtime::WireValue wire, future_to_wire(f, pad));
    b.future_pad = pad;
    if (std::find(b.consumed.begin(), b.consumed.end(), f.id) == b.consumed.end()) {
      b.consumed.push_back(f.id);
    }
    return wire;
  }
  if (v.is_list()) {
    runtime::WireValue out;
    out.kind = static_cast<uint8_t>(runtime::WireKind::list);
    for (Value& item : v.list()) {
      TESSERA_ASSIGN_OR_RETURN(runtime::WireValue wi, encode(std::move(item), w, b));
      out.items.push_back(std::move(wi));
    }
    return out;
  }
  runtime::EncodeOptions o{!w.local, 1, b.rt.config().inline_payload_max_bytes, w.local};
  return runtime::to_wire(std::move(v), b.rt.data_plane(), o, &b.published);
}

// Collects the outputs of a finished call of `spec` at the driver; `mode`, when given, is
// spec's dispatch mode (already looked up by the caller).
Result<Value> collect_state(FutureState& s, const MethodSpec& spec, bool consume,
                            const DispatchMode* mode = nullptr) {
  const auto& results = resolve(s);
  if (!results.ok()) return results.status();
  if (mode != nullptr && spec.execute_mode == ExecuteMode::all) {
    // Note [Replies joined in place] (dispatch/internal/concat_collect.hpp).
    if (std::optional<int64_t> pad = internal::concat_collect_pad(*mode, s.collect)) {
      std::vector<const proto::DataProto*> parts;
      parts.reserve(results->size());
      for (const runtime::WireValue& w : *results) {
        if (w.kind != static_cast<uint8_t>(runtime::WireKind::proto_local) || !w.local ||
            w.local_end >= 0) {
          break;
        }
        parts.push_back(w.local.get());
      }
      if (parts.size() == results->size() && !parts.empty()) {
        TESSERA_ASSIGN_OR_RETURN(proto::DataProto joined, concat_and_unpad(parts, *pad));
        return Value(std::move(joined));
      }
    }
  }
  TESSERA_ASSIGN_OR_RETURN(std::vector<Value> outputs,
                           runtime::from_wire_many(*results, s.rt->data_plane(), consume));
  if (mode != nullptr && spec.execute_mode == ExecuteMode::all) return mode->collect(outputs, s.collect);
  return collect_outputs(DispatchRegistry::global(), spec.dispatch_mode, spec.execute_mode,
                         outputs, s.collect);
}

std::string mesh_of(const std::string& mode) {
  return mode.rfind("nd:", 0) == 0 ? mode.substr(3) : std::string();
}

}  // namespace

Result<std::shared_ptr<WorkerGroup>> WorkerGroup::spawn(runtime::Runtime& rt,
                                                        const std::string& name,
                                                        const runtime::ResourcePool& pool,
                                                        const std::vector<runtime::RoleSpec>& roles,
                                                        WorkerGroupOptions options) {
  std::shared_ptr<WorkerGroup> wg(new WorkerGroup());
  wg->rt_ = &rt;
  wg->name_ = name;
  wg->options_ = options;
  TESSERA_ASSIGN_OR_RETURN(wg->workers_, rt.spawn_workers(name, pool, roles));
  TESSERA_ASSIGN_OR_RETURN(std::vector<runtime::MethodInfo> infos, rt.methods(wg->workers_[0]));
  for (const runtime::MethodInfo& m : infos) {
    nlohmann::json attrs = nlohmann::json::parse(m.attributes, nullptr, false);
    if (attrs.is_discarded()) attrs = nlohmann::json::object();
    TESSERA_ASSIGN_OR_RETURN(MethodSpec spec, spec_from_json(m.name, attrs));
    wg->specs_[m.name] = spec;
  }
  return wg;
}

Result<std::shared_ptr<WorkerGroup>> WorkerGroup::role(const std::string& role) const {
  std::shared_ptr<WorkerGroup> view(new WorkerGroup(*this));
  view->prefix_ = prefix_ + role + "_";
  view->specs_.clear();
  view->name_ = name_ + "/" + role;
  view->mesh_cache_ = std::make_shared<std::map<std::string, MeshDispatchInfo>>();
  std::vector<MethodSpec> all;
  for (const auto& [n, s] : specs_) all.push_back(s);
  for (const MethodSpec& s : role_view(all, role)) view->specs_[s.name] = s;
  if (view->specs_.empty()) {
    return make_error(ErrorCode::not_found, "group '{}' has no methods of role '{}'", name_, role);
  }
  return view;
}

std::vector<MethodSpec> WorkerGroup::methods() const {
  std::vector<MethodSpec> out;
  for (const auto& [n, s] : specs_) {
    if (n.find(kDispatchInfoMethod) == std::string::npos) out.push_back(s);
  }
  return out;
}

Result<MethodSpec> WorkerGroup::find_spec(const std::string& method) const {
  auto it = specs_.find(method);
  if (it != specs_.end()) return it->second;
  std::vector<std::string> names;
  for (const MethodSpec& s : methods()) names.push_back(s.name);
  return make_error(ErrorCode::not_found, "group '{}' has no method '{}' (has: {})", name_, method,
                    fmt::join(names, ", "));
}

Result<MeshDispatchInfo> WorkerGroup::mesh_info(const std::string& mesh) {
  std::lock_guard<std::mutex> lock(*mesh_mutex_);
  auto cached = mesh_cache_->find(mesh);
  if (cached != mesh_cache_->end()) return cached->second;
  std::vector<std::vector<Value>> args(workers_.size(), {Value(nlohmann::json(mesh))});
  runtime::CallOptions co;
  co.timeout = options_.timeout;
  auto out = rt_->call(workers_, prefix_ + kDispatchInfoMethod, args, co);
  if (!out.ok()) return out.status().with_context(fmt::format("group '{}', mesh '{}'", name_, mesh));
  MeshDispatchInfo info;
  for (const Value& v : *out) {
    info.dp_rank.push_back(v.json().at("dp_rank").get<int64_t>());
    info.is_collect.push_back(v.json().at("is_collect").get<bool>());
  }
  (*mesh_cache_)[mesh] = info;
  return info;
}

Result<Value> WorkerGroup::invoke(const MethodSpec& spec, const Args& args, bool blocking) {
  auto where = [&] { return fmt::format("{}.{}", name_, spec.name); };  // errors only
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<const DispatchMode> found,
                           DispatchRegistry::global().find_shared(spec.dispatch_mode));
  const DispatchMode& mode = *found;
  SplitContext sctx;
  sctx.world_size = world_size();
  sctx.auto_padding = options_.auto_padding;
  std::string mesh = mesh_of(spec.dispatch_mode);
  if (!mesh.empty()) {
    TESSERA_ASSIGN_OR_RETURN(sctx.mesh_info[mesh], mesh_info(mesh));
  }
  std::vector<int32_t> ranks = execute_ranks(spec.execute_mode, world_size());
  CallBuild b{*rt_, {}, {}, -1};
  std::vector<runtime::WorkerRef> targets;  // built only when not every rank executes
  const bool all_ranks = ranks.size() == workers_.size();
  const std::string method = prefix_ + spec.name;
  std::vector<runtime::CallRequest> requests;
  requests.reserve(ranks.size());
  int64_t pad = 0;
  // Note [Chunks cut by the receiver] (runtime/wire.hpp): in-process ranks cut their own rows.
  // It takes ~14k instructions per 8-rank call off the caller's serial path and adds a little
  // to each rank's, so it can pay only where the ranks run at once. Where 8 ranks share 2 vCPUs
  // it shows no gain: 10 interleaved runs each, medians 21.25 us against 20.15 us with the
  // caller cutting; bench/run's ratio of the two read 1.08x and 0.95x. Hence the default: only
  // with a hardware thread for the caller and each rank.
  // hardware_concurrency() reads /sys (three system calls, ~7 us here): once per process.
  static const unsigned hardware_threads = std::thread::hardware_concurrency();
  const bool receivers_cut = options_.cut_rows_on_receivers.value_or(hardware_threads > workers_.size());
  std::optional<internal::RowPlan> rows;
  if (receivers_cut && all_ranks && internal::splits_rows_per_rank(mode) &&
      std::all_of(workers_.begin(), workers_.end(), [](const runtime::WorkerRef& w) { return w.local; })) {
    rows = internal::plan_rows_per_rank(args, sctx);
  }
  if (rows) {
    for (int32_t r : ranks) {
      runtime::CallRequest req;
      req.method = method;
      req.args.reserve(rows->sources.size());
      for (size_t i = 0; i < rows->sources.size(); ++i) {
        const int64_t k = rows->rows_per_rank[i];
        req.args.push_back(runtime::local_rows_wire(rows->sources[i], r * k, (r + 1) * k));
      }
      requests.push_back(std::move(req));
    }
    pad = rows->pad;
  } else {
    Result<SplitResult> split = mode.split(args, sctx);
    if (!split.ok()) return split.status().with_context(where());
    for (int32_t r : ranks) {
      runtime::CallRequest req;
      req.method = method;
      std::vector<Value>& rank_args = split->per_rank.at(static_cast<size_t>(r));
      req.args.reserve(rank_args.size());
      for (Value& a : rank_args) {
        Result<runtime::WireValue> w = encode(std::move(a), workers_[r], b);
        if (!w.ok()) {
          rt_->release_all(b.published);
          return w.status().with_context(fmt::format("{}: rank {}", where(), r));
        }
        req.args.push_back(std::move(w).value());
      }
      if (!all_ranks) targets.push_back(workers_[r]);
      requests.push_back(std::move(req));
    }
    pad = split->pad < 0 ? std::max<int64_t>(0, b.future_pad) : split->pad;
  }
  rows.reset();  // the requests hold the sources
  // A blocking call's state lives here; a future's in the FutureTable until it is consumed.
  std::optional<FutureState> local;
  std::shared_ptr<FutureState> shared;
  FutureState* state = blocking ? &local.emplace() : (shared = std::make_shared<FutureState>()).get();
  state->rt = rt_;
  if (!blocking) {
    state->spec = spec;
    state->producer = name_;
    state->ranks = ranks;
  }
  state->collect = CollectContext{world_size(), pad, std::move(sctx.mesh_info)};
  state->inputs = std::move(b.published);
  state->consumed = std::move(b.consumed);
  runtime::CallOptions co;
  co.timeout = options_.timeout;
  co.keep_results = !blocking;
  state->batch = rt_->call_wire(all_ranks ? workers_ : targets, std::move(requests), co);
  if (!blocking) return make_future(FutureRef{FutureTable::get().add(shared), name_});
  Result<Value> out = collect_state(*state, spec, /*consume=*/true, &mode);
  if (!out.ok()) return out.status().with_context(where());
  return out;
}

Result<Value> WorkerGroup::call(const std::string& method, const Args& args) {
  TESSERA_ASSIGN_OR_RETURN(MethodSpec spec, find_spec(method));
  return invoke(spec, args, spec.blocking);
}

Result<FutureRef> WorkerGroup::call_async(const std::string& method, const Args& args) {
  TESSERA_ASSIGN_OR_RETURN(MethodSpec spec, find_spec(method));
  TESSERA_ASSIGN_OR_RETURN(Value f, invoke(spec, args, /*blocking=*/false));
  return future_of(f);
}

Status WorkerGroup::wait(const FutureRef& future) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<FutureState> s, FutureTable::get().find(future));
  return resolve(*s).status();
}

Result<Value> WorkerGroup::get(const FutureRef& future) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<FutureState> s, FutureTable::get().find(future));
  FutureTable::get().take(future.id);
  Result<Value> out = collect_state(*s, s->spec, /*consume=*/false);
  release_future_payloads(*s);
  if (!out.ok()) return out.status().with_context(fmt::format("{}.{}", s->producer, s->spec.name));
  return out;
}

Status WorkerGroup::release(const FutureRef& future) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<FutureState> s, FutureTable::get().find(future));
  FutureTable::get().take(future.id);
  release_future_payloads(*s);
  return Status();
}

}  // namespace tessera::dispatch
