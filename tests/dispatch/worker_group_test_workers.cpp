#include "tests/dispatch/worker_group_test_workers.hpp"

#include <torch/torch.h>

#include "dispatch/worker_group.hpp"

namespace tessera::dispatch::testing {
namespace {

Result<Value> tag(int32_t rank, const Args& args) {
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto in, args.at(0).as_proto("tag arg 0"));
  proto::DataProto out = in;
  TESSERA_RETURN_IF_ERROR(out.set_tensor("y", *in.tensor("y") * 2));
  TESSERA_RETURN_IF_ERROR(out.set_tensor("rank", torch::full({in.size()}, rank, torch::kInt64)));
  return Value(out);
}

Result<Value> with_func(const Args& args) {
  std::string fn = args.at(0).json();
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto in, args.at(1).as_proto("with_func arg 1"));
  proto::DataProto out = in;
  at::Tensor y = *in.tensor("y");
  if (fn == "negate") y = -y;
  else if (fn == "double") y = y * 2;
  else return make_error(ErrorCode::invalid_argument, "unknown function '{}'", fn);
  TESSERA_RETURN_IF_ERROR(out.set_tensor("y", y));
  return Value(out);
}

int64_t rows_of(const Args& args) {
  return !args.empty() && args[0].is_proto() ? args[0].proto().size() : -1;
}

class DpWorker : public WorkerBase {
 public:
  explicit DpWorker(const runtime::WorkerContext& ctx) : WorkerBase(ctx) {
    int32_t r = ctx.rank;
    auto& m = methods();
    (void)m.add("tag", Dispatch::DP_COMPUTE_PROTO, [r](const Args& a) { return tag(r, a); });
    (void)m.add(MethodSpec{"tag_async", Dispatch::DP_COMPUTE_PROTO, ExecuteMode::all, false},
                [r](const Args& a) { return tag(r, a); });
    (void)m.add("info", Dispatch::ONE_TO_ALL, [r](const Args& a) -> Result<Value> {
      return Value(nlohmann::json{{"rank", r}, {"rows", rows_of(a)}, {"nargs", a.size()}});
    });
    (void)m.add("info_all", Dispatch::ALL_TO_ALL, [r](const Args& a) -> Result<Value> {
      return Value(nlohmann::json{{"rank", r}, {"arg", a.at(0).json()}});
    });
    (void)m.add("scale", Dispatch::DP_COMPUTE, [r](const Args& a) -> Result<Value> {
      return Value(nlohmann::json(a.at(0).json().get<int64_t>() * 10 + r));
    });
    (void)m.add("with_func", Dispatch::DP_COMPUTE_PROTO_WITH_FUNC, with_func);
    (void)m.add("metric", Dispatch::DP_COMPUTE_METRIC, [r](const Args& a) -> Result<Value> {
      return Value(nlohmann::json{{"rank", r}, {"rows", rows_of(a)}});
    });
    (void)m.add(MethodSpec{"leader", Dispatch::ONE_TO_ALL, ExecuteMode::rank_zero, true},
                [r](const Args&) -> Result<Value> { return Value(nlohmann::json{{"rank", r}}); });
    (void)m.add("tag_but_rank_1", Dispatch::DP_COMPUTE_PROTO, [r](const Args& a) -> Result<Value> {
      if (r == 1) return Value(nlohmann::json{{"rank", r}});
      return tag(r, a);
    });
    (void)m.add("nd_tag", "nd:tp", [r](const Args& a) { return tag(r, a); });
    register_dispatch_collect_info("tp", r / 2, r % 2 == 0);
  }
};

}  // namespace

void register_dp_workers(runtime::WorkerTypeRegistry& registry) {
  (void)register_worker_type(registry, "dp_worker",
                             [](const runtime::WorkerContext& ctx, const nlohmann::json&)
                                 -> Result<std::unique_ptr<WorkerBase>> {
                               return std::unique_ptr<WorkerBase>(std::make_unique<DpWorker>(ctx));
                             });
}

const runtime::WorkerTypeRegistry& dp_registry() {
  static const runtime::WorkerTypeRegistry registry = [] {
    runtime::WorkerTypeRegistry r;
    register_dp_workers(r);
    return r;
  }();
  return registry;
}

Result<DpGroup> start_dp_group(const runtime::RuntimeConfig& config) {
  DpGroup out;
  TESSERA_ASSIGN_OR_RETURN(out.runtime, runtime::Runtime::start(config, dp_registry()));
  TESSERA_ASSIGN_OR_RETURN(out.group,
                           WorkerGroup::spawn(*out.runtime, "dp", *out.runtime->resource_pool(), {{"", "dp_worker", "{}"}}));
  return out;
}

}  // namespace tessera::dispatch::testing
