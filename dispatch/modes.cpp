#include "dispatch/modes.hpp"

#include <algorithm>
#include <cctype>
#include <optional>

#include "dispatch/internal/concat_collect.hpp"
#include "dispatch/internal/row_plan.hpp"

namespace tessera::dispatch {

// Note [Auto-padding]
// ~~~~~~~~~~~~~~~~~~~
// verl (§2.3): with DP_COMPUTE_PROTO / DP_COMPUTE_METRIC, every DataProto argument whose padding
// is enabled (meta_info["_verl_auto_padding"], or the global switch) is padded with copies of its
// last row to a multiple of the world size; all padded arguments must have the same length L, and
// pad = (N - L % N) % N rows are stripped from the concatenated output. Tessera keeps that rule
// and fixes three flaws:
//   * padding never mutates the caller's DataProto (verl's `padding` reassigns self.batch);
//   * a future's output is unpadded too: its pad is computed when its length becomes known
//     (SplitResult::pad == -1 tells the WorkerGroup to do so), where verl forgot to;
//   * DP_COMPUTE_METRIC returns one output per rank, so there is nothing row-shaped to strip:
//     verl drops the last `pad` *rank outputs*, losing real ranks' metrics; we keep all of them.
// n-d modes pad to the number of dp chunks when padding is enabled (verl's n-d path never pads).

const char* to_string(ExecuteMode mode) {
  return mode == ExecuteMode::all ? "ALL" : "RANK_ZERO";
}

Result<ExecuteMode> parse_execute_mode(const std::string& text) {
  std::string up(text);
  std::transform(up.begin(), up.end(), up.begin(), [](unsigned char c) { return std::toupper(c); });
  if (up == "ALL") return ExecuteMode::all;
  if (up == "RANK_ZERO") return ExecuteMode::rank_zero;
  return make_error(ErrorCode::invalid_argument, "unknown execute mode '{}' (known: ALL, RANK_ZERO)", text);
}

std::vector<int32_t> execute_ranks(ExecuteMode mode, int32_t world_size) {
  if (mode == ExecuteMode::rank_zero) return world_size > 0 ? std::vector<int32_t>{0} : std::vector<int32_t>{};
  std::vector<int32_t> ranks(static_cast<size_t>(std::max(world_size, 0)));
  for (int32_t r = 0; r < world_size; ++r) ranks[static_cast<size_t>(r)] = r;
  return ranks;
}

int64_t pad_size_for(int64_t length, int64_t world_size) {
  if (world_size <= 0) return 0;
  return (world_size - length % world_size) % world_size;
}

Result<std::vector<proto::DataProto>> chunk_proto(const proto::DataProto& data, int64_t pad_rows,
                                                  int32_t world_size) {
  if (pad_rows == 0) return data.chunk(world_size);
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto padded, data.padding(pad_rows));
  return padded.chunk(world_size);
}

Result<proto::DataProto> concat_and_unpad(const std::vector<const proto::DataProto*>& parts,
                                          int64_t pad) {
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto joined, proto::DataProto::concat(parts));
  if (pad == 0) return joined;
  return joined.unpad(pad);
}

namespace {

Args replicate(const Args& args) { return args; }

SplitResult replicate_to_all(const Args& args, int32_t world) {
  SplitResult out;
  out.per_rank.assign(static_cast<size_t>(world), replicate(args));
  return out;
}

SplitResult scatter_lists(const Args& args, int32_t world) {
  SplitResult out;
  out.per_rank.resize(static_cast<size_t>(world));
  for (int32_t r = 0; r < world; ++r)
    for (const auto& a : args) out.per_rank[static_cast<size_t>(r)].push_back(element(a, r));
  return out;
}

bool every_arg_is_list_of(const Args& args, int32_t world) {
  if (args.empty()) return false;
  return std::all_of(args.begin(), args.end(), [&](const Value& v) { return list_length(v) == world; });
}

Result<SplitResult> split_one_to_all(const Args& args, const SplitContext& ctx) {
  return replicate_to_all(args, ctx.world_size);
}

Result<SplitResult> split_all_to_all(const Args& args, const SplitContext& ctx) {
  if (every_arg_is_list_of(args, ctx.world_size)) return scatter_lists(args, ctx.world_size);
  return replicate_to_all(args, ctx.world_size);
}

Result<SplitResult> split_dp_compute(const Args& args, const SplitContext& ctx) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (list_length(args[i]) != ctx.world_size)
      return make_error(ErrorCode::invalid_argument,
                        "DP_COMPUTE: argument {} is a {} of length {}; expected a list of length {}",
                        i, kind(args[i]), list_length(args[i]), ctx.world_size);
  }
  return scatter_lists(args, ctx.world_size);
}

// Note [Auto-padding] for DataProto argument `i`: nullopt when it is not padded, else the rows
// of padding it gets. `padded_length` is the length of the arguments padded so far (-1: none),
// which must all be equal.
Result<std::optional<int64_t>> argument_pad(const proto::DataProto& data, size_t i, bool allow_padding,
                                            const SplitContext& ctx, int64_t chunks, const char* mode,
                                            int64_t& padded_length) {
  if (!allow_padding || !(ctx.auto_padding || data.is_padding_enabled())) return std::optional<int64_t>();
  if (padded_length >= 0 && padded_length != data.size())
    return make_error(ErrorCode::invalid_argument,
                      "{}: padded arguments must have equal lengths, argument {} has {} rows, "
                      "an earlier one {}", mode, i, data.size(), padded_length);
  padded_length = data.size();
  return std::optional<int64_t>(pad_size_for(data.size(), chunks));
}

// Chunks every DataProto / future argument into `chunks` pieces; piece_of_rank[r] selects which
// piece rank r receives. Non-data arguments are an error unless `passthrough_first` (the
// function name of DP_COMPUTE_PROTO_WITH_FUNC).
struct ProtoSplitSpec {
  const char* mode;
  bool allow_padding;
  bool passthrough_first;
  int64_t chunks;
  std::vector<int64_t> piece_of_rank;
};

Result<SplitResult> split_protos(const Args& args, const SplitContext& ctx, const ProtoSplitSpec& spec) {
  const auto world = static_cast<size_t>(ctx.world_size);
  SplitResult out;
  out.per_rank.resize(world);
  int64_t padded_length = -1;
  bool future_padded = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const Value& arg = args[i];
    if (i == 0 && spec.passthrough_first) {
      if (!arg.is_json() || !arg.json().is_string())
        return make_error(ErrorCode::invalid_argument,
                          "{}: argument 0 must be a function name (string), got {}", spec.mode, kind(arg));
      for (auto& a : out.per_rank) a.push_back(arg);
      continue;
    }
    if (is_future(arg)) {
      TESSERA_ASSIGN_OR_RETURN(FutureRef f, future_of(arg));
      f.auto_padding = spec.allow_padding && (f.auto_padding || ctx.auto_padding);
      future_padded = future_padded || f.auto_padding;
      f.consumer_world = static_cast<int32_t>(spec.chunks);
      for (size_t r = 0; r < world; ++r) {
        f.consumer_rank = static_cast<int32_t>(spec.piece_of_rank[r]);
        out.per_rank[r].push_back(make_future(f));
      }
      continue;
    }
    if (!arg.is_proto())
      return make_error(ErrorCode::invalid_argument, "{}: argument {} must be a DataProto, got {}",
                        spec.mode, i, kind(arg));
    const proto::DataProto& data = arg.proto();
    TESSERA_ASSIGN_OR_RETURN(std::optional<int64_t> padding,
                             argument_pad(data, i, spec.allow_padding, ctx, spec.chunks, spec.mode,
                                          padded_length));
    const int64_t pad = padding.value_or(0);
    if (padding) out.pad = pad;
    auto pieces = chunk_proto(data, pad, static_cast<int32_t>(spec.chunks));
    if (!pieces.ok()) return pieces.status().with_context(fmt::format("{}: argument {}", spec.mode, i));
    // A piece goes to every rank that takes it (TP/SP peers share one): moved into the last.
    std::vector<size_t> last(pieces->size(), world);
    for (size_t r = 0; r < world; ++r) last[static_cast<size_t>(spec.piece_of_rank[r])] = r;
    for (size_t r = 0; r < world; ++r) {
      auto piece = static_cast<size_t>(spec.piece_of_rank[r]);
      if (last[piece] == r) {
        out.per_rank[r].push_back(Value(std::move((*pieces)[piece])));
      } else {
        out.per_rank[r].push_back(Value((*pieces)[piece]));
      }
    }
  }
  if (padded_length < 0 && future_padded) out.pad = -1;
  return out;
}

std::vector<int64_t> identity_pieces(int32_t world) {
  std::vector<int64_t> p(static_cast<size_t>(world));
  for (int32_t r = 0; r < world; ++r) p[static_cast<size_t>(r)] = r;
  return p;
}

Result<SplitResult> split_dp_proto(const Args& args, const SplitContext& ctx) {
  return split_protos(args, ctx, {Dispatch::DP_COMPUTE_PROTO, true, false, ctx.world_size,
                                  identity_pieces(ctx.world_size)});
}

Result<SplitResult> split_dp_proto_with_func(const Args& args, const SplitContext& ctx) {
  if (args.empty())
    return make_error(ErrorCode::invalid_argument, "DP_COMPUTE_PROTO_WITH_FUNC: a function name is required");
  return split_protos(args, ctx, {Dispatch::DP_COMPUTE_PROTO_WITH_FUNC, false, true, ctx.world_size,
                                  identity_pieces(ctx.world_size)});
}

Result<SplitResult> split_dp_metric(const Args& args, const SplitContext& ctx) {
  return split_protos(args, ctx, {Dispatch::DP_COMPUTE_METRIC, true, false, ctx.world_size,
                                  identity_pieces(ctx.world_size)});
}

Result<Value> collect_list(const ValueList& outputs, const CollectContext&) { return Value(outputs); }

Result<Value> collect_dp_compute(const ValueList& outputs, const CollectContext& ctx) {
  if (static_cast<int32_t>(outputs.size()) != ctx.world_size)
    return make_error(ErrorCode::internal, "DP_COMPUTE: {} outputs for world size {}", outputs.size(),
                      ctx.world_size);
  return Value(outputs);
}

Result<Value> collect_protos(const char* mode, const ValueList& outputs, const std::vector<size_t>& ranks,
                             int64_t pad) {
  std::vector<const proto::DataProto*> parts;
  parts.reserve(ranks.size());
  for (size_t r : ranks) {
    if (r >= outputs.size() || !outputs[r].is_proto())
      return make_error(ErrorCode::invalid_argument, "{}: rank {} returned {}, expected a DataProto", mode, r,
                        r < outputs.size() ? kind(outputs[r]) : "nothing");
    parts.push_back(&outputs[r].proto());
  }
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto joined, concat_and_unpad(parts, pad));
  return Value(std::move(joined));
}

std::vector<size_t> all_ranks(size_t n) {
  std::vector<size_t> r(n);
  for (size_t i = 0; i < n; ++i) r[i] = i;
  return r;
}

Result<Value> collect_dp_proto(const ValueList& outputs, const CollectContext& ctx) {
  return collect_protos(Dispatch::DP_COMPUTE_PROTO, outputs, all_ranks(outputs.size()), ctx.pad);
}

Result<Value> collect_dp_proto_with_func(const ValueList& outputs, const CollectContext& ctx) {
  return collect_protos(Dispatch::DP_COMPUTE_PROTO_WITH_FUNC, outputs, all_ranks(outputs.size()), 0);
}

Result<const MeshDispatchInfo*> mesh_info_for(const std::map<std::string, MeshDispatchInfo>& info,
                                              const std::string& mesh, int32_t world) {
  auto it = info.find(mesh);
  if (it == info.end())
    return make_error(ErrorCode::not_found, "nd:{}: no rank registered dispatch info for mesh '{}'", mesh, mesh);
  const auto& m = it->second;
  if (static_cast<int32_t>(m.dp_rank.size()) != world || static_cast<int32_t>(m.is_collect.size()) != world)
    return make_error(ErrorCode::invalid_argument, "nd:{}: dispatch info covers {} ranks, world size is {}",
                      mesh, m.dp_rank.size(), world);
  return &m;
}

}  // namespace

namespace internal {

std::optional<int64_t> concat_collect_pad(const DispatchMode& mode, const CollectContext& ctx) {
  using Collect = Result<Value> (*)(const ValueList&, const CollectContext&);
  const Collect* fn = mode.collect.target<Collect>();
  if (fn == nullptr) return std::nullopt;
  if (*fn == &collect_dp_proto) return ctx.pad;
  if (*fn == &collect_dp_proto_with_func) return 0;
  return std::nullopt;
}

bool splits_rows_per_rank(const DispatchMode& mode) {
  using Split = Result<SplitResult> (*)(const Args&, const SplitContext&);
  const Split* fn = mode.split.target<Split>();
  return fn != nullptr && (*fn == &split_dp_proto || *fn == &split_dp_metric);
}

// split_protos' rules for these modes (every piece r of r, world chunks, padding allowed),
// restricted to the cases it answers with equal row runs (dispatch/internal/row_plan.hpp).
std::optional<RowPlan> plan_rows_per_rank(const Args& args, const SplitContext& ctx) {
  const int64_t world = ctx.world_size;
  if (world < 1) return std::nullopt;
  RowPlan plan;
  plan.sources.reserve(args.size());
  plan.rows_per_rank.reserve(args.size());
  int64_t padded_length = -1;
  for (size_t i = 0; i < args.size(); ++i) {
    const Value& arg = args[i];
    if (!arg.is_proto()) return std::nullopt;  // futures and non-data arguments: the split's
    const proto::DataProto& data = arg.proto();
    for (const auto& kv : data.batch()) {
      // Views of a tensor requiring grad are autograd ops: the caller's thread makes them.
      if (kv.second.requires_grad()) return std::nullopt;
    }
    // The split's own rule (both modes allow padding); its error is the split's to report.
    Result<std::optional<int64_t>> padding =
        argument_pad(data, i, /*allow_padding=*/true, ctx, world, "", padded_length);
    if (!padding.ok()) return std::nullopt;
    const int64_t pad = padding->value_or(0);
    if (*padding) plan.pad = pad;
    std::shared_ptr<const proto::DataProto> source;
    if (pad == 0) {
      if (data.size() % world != 0) return std::nullopt;
      source = std::make_shared<const proto::DataProto>(data);
    } else {
      Result<proto::DataProto> padded = data.padding(pad);
      if (!padded.ok()) return std::nullopt;
      source = std::make_shared<const proto::DataProto>(std::move(padded).value());
    }
    plan.rows_per_rank.push_back(source->size() / world);
    plan.sources.push_back(std::move(source));
  }
  return plan;
}

}  // namespace internal

DispatchMode make_nd_compute_dataproto_dispatch(const std::string& mesh_name) {
  const std::string name = "nd:" + mesh_name;
  SplitFn split = [mesh_name, name](const Args& args, const SplitContext& ctx) -> Result<SplitResult> {
    TESSERA_ASSIGN_OR_RETURN(const MeshDispatchInfo* m, mesh_info_for(ctx.mesh_info, mesh_name, ctx.world_size));
    int64_t dp_size = 0;
    for (int64_t d : m->dp_rank) {
      if (d < 0) return make_error(ErrorCode::invalid_argument, "{}: negative dp_rank {}", name, d);
      dp_size = std::max(dp_size, d + 1);
    }
    return split_protos(args, ctx, {name.c_str(), true, false, dp_size, m->dp_rank});
  };
  CollectFn collect = [mesh_name, name](const ValueList& outputs, const CollectContext& ctx) -> Result<Value> {
    TESSERA_ASSIGN_OR_RETURN(const MeshDispatchInfo* m, mesh_info_for(ctx.mesh_info, mesh_name, ctx.world_size));
    std::vector<size_t> ranks;
    for (size_t r = 0; r < m->is_collect.size(); ++r)
      if (m->is_collect[r]) ranks.push_back(r);
    return collect_protos(name.c_str(), outputs, ranks, ctx.pad);
  };
  return DispatchMode{name, std::move(split), std::move(collect)};
}

DispatchRegistry::DispatchRegistry() {
  auto add = [this](const char* n, SplitFn s, CollectFn c) {
    modes_[n] = std::make_shared<const DispatchMode>(DispatchMode{n, std::move(s), std::move(c)});
  };
  add(Dispatch::ONE_TO_ALL, split_one_to_all, collect_list);
  add(Dispatch::ALL_TO_ALL, split_all_to_all, collect_list);
  add(Dispatch::DP_COMPUTE, split_dp_compute, collect_dp_compute);
  add(Dispatch::DP_COMPUTE_PROTO, split_dp_proto, collect_dp_proto);
  add(Dispatch::DP_COMPUTE_PROTO_WITH_FUNC, split_dp_proto_with_func, collect_dp_proto_with_func);
  add(Dispatch::DP_COMPUTE_METRIC, split_dp_metric, collect_list);
}

DispatchRegistry& DispatchRegistry::global() {
  static DispatchRegistry registry;
  return registry;
}

Status DispatchRegistry::register_mode(DispatchMode mode) {
  if (mode.name.empty() || !mode.split || !mode.collect)
    return make_error(ErrorCode::invalid_argument, "dispatch mode '{}' needs a name, a split and a collect function",
                      mode.name);
  if (mode.name.rfind("nd:", 0) == 0)
    return make_error(ErrorCode::invalid_argument, "dispatch mode names starting with 'nd:' are reserved ('{}')",
                      mode.name);
  std::lock_guard<std::mutex> lock(mu_);
  if (modes_.count(mode.name))
    return make_error(ErrorCode::already_exists, "dispatch mode '{}' is already registered", mode.name);
  std::string name = mode.name;
  modes_[name] = std::make_shared<const DispatchMode>(std::move(mode));
  return Status();
}

Status DispatchRegistry::update_mode(DispatchMode mode) {
  if (!mode.split || !mode.collect)
    return make_error(ErrorCode::invalid_argument, "dispatch mode '{}' needs a split and a collect function", mode.name);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = modes_.find(mode.name);
  if (it == modes_.end())
    return make_error(ErrorCode::not_found, "cannot update unknown dispatch mode '{}'", mode.name);
  it->second = std::make_shared<const DispatchMode>(std::move(mode));
  return Status();
}

Result<DispatchMode> DispatchRegistry::find(const std::string& name) const {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<const DispatchMode> mode, find_shared(name));
  return *mode;
}

Result<std::shared_ptr<const DispatchMode>> DispatchRegistry::find_shared(const std::string& name) const {
  if (name.rfind("nd:", 0) == 0 && name.size() > 3) {
    return std::make_shared<const DispatchMode>(make_nd_compute_dataproto_dispatch(name.substr(3)));
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = modes_.find(name);
  if (it != modes_.end()) return it->second;
  std::string known;
  for (const auto& [n, m] : modes_) known += (known.empty() ? "" : ", ") + n;
  return make_error(ErrorCode::not_found, "unknown dispatch mode '{}' (known: {}, nd:<mesh>)", name, known);
}

bool DispatchRegistry::contains(const std::string& name) const { return find(name).ok(); }

std::vector<std::string> DispatchRegistry::names() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const auto& [n, m] : modes_) out.push_back(n);
  return out;
}

Result<SplitResult> split_args(const DispatchRegistry& registry, const std::string& mode, const Args& args,
                               const SplitContext& ctx) {
  if (ctx.world_size < 1)
    return make_error(ErrorCode::invalid_argument, "{}: world size {} < 1", mode, ctx.world_size);
  TESSERA_ASSIGN_OR_RETURN(DispatchMode m, registry.find(mode));
  TESSERA_ASSIGN_OR_RETURN(SplitResult out, m.split(args, ctx));
  if (static_cast<int32_t>(out.per_rank.size()) != ctx.world_size)
    return make_error(ErrorCode::internal, "{}: split produced {} rank argument lists for world size {}", mode,
                      out.per_rank.size(), ctx.world_size);
  return out;
}

Result<Value> collect_outputs(const DispatchRegistry& registry, const std::string& mode, ExecuteMode execute,
                              const ValueList& outputs, const CollectContext& ctx) {
  if (execute == ExecuteMode::rank_zero) {
    if (outputs.size() != 1)
      return make_error(ErrorCode::internal, "{}: RANK_ZERO call produced {} outputs", mode, outputs.size());
    return outputs[0];
  }
  TESSERA_ASSIGN_OR_RETURN(DispatchMode m, registry.find(mode));
  return m.collect(outputs, ctx);
}

}  // namespace tessera::dispatch
