#include "tests/runtime/test_workers.hpp"

#include <stdexcept>

#include <torch/torch.h>

#include <fcntl.h>
#include <unistd.h>

#include "runtime/internal/call_channel.hpp"

namespace tessera::runtime::testing {
namespace {

Result<Value> double_it(const WorkerContext& ctx, std::vector<Value>& args) {
  if (args.size() != 1) return make_error(ErrorCode::invalid_argument, "double_it takes 1 arg");
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto in, args[0].as_proto("double_it arg 0"));
  proto::TensorDict out;
  for (const auto& [key, t] : in.batch()) out.insert_or_assign(key, t * 2);
  nlohmann::json meta = in.meta_info();
  meta["rank"] = ctx.rank;
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto result,
                           proto::DataProto::from_dict(std::move(out), in.non_tensor_batch(), meta));
  return Value(std::move(result));
}

Result<Value> sum(std::vector<Value>& args) {
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto in, args.at(0).as_proto("sum arg 0"));
  double total = 0;
  for (const auto& [key, t] : in.batch()) total += t.sum().item<double>();
  return Value(nlohmann::json{{"sum", total}, {"rows", in.size()}});
}

// Blocks until someone writes a byte into the FIFO at `path` (a latch another thread or
// process controls), then returns rows x 32768 floats (128 KiB a row: above the inline size).
Result<Value> wait_fifo(std::vector<Value>& args) {
  std::string path = args.at(0).json().get<std::string>();
  int64_t rows = args.at(1).json().get<int64_t>();
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return make_error(ErrorCode::io_error, "wait_fifo: cannot open '{}'", path);
  char byte = 0;
  ssize_t n = ::read(fd, &byte, 1);
  ::close(fd);
  if (n != 1) return make_error(ErrorCode::io_error, "wait_fifo: nothing read from '{}'", path);
  auto x = torch::full({rows, 32768}, static_cast<float>(byte), torch::kFloat32);
  return Value(*proto::DataProto::from_dict({{"x", x}}));
}

class Echo : public Worker {
 public:
  explicit Echo(const WorkerContext& ctx) : ctx_(ctx) {
    register_method("double_it", [this](std::vector<Value>& a) { return double_it(ctx_, a); },
                    {{"dispatch_mode", "DP_COMPUTE_PROTO"}});
    register_method("identity", [](std::vector<Value>& a) -> Result<Value> { return a.at(0); });
    register_method("sum", [](std::vector<Value>& a) { return sum(a); });
    register_method("rank_info", [this](std::vector<Value>&) -> Result<Value> {
      return Value(nlohmann::json{{"rank", ctx_.rank}, {"world_size", ctx_.world_size},
                                  {"local_rank", ctx_.local_rank},
                                  {"local_world_size", ctx_.local_world_size},
                                  {"device", ctx_.device}, {"host", ctx_.host},
                                  {"master_addr", ctx_.master_addr},
                                  {"master_port", ctx_.master_port}, {"group", ctx_.group}});
    });
    register_method("fail", [](std::vector<Value>&) -> Result<Value> {
      throw std::runtime_error("boom");
    });
    register_method("torch_fail", [](std::vector<Value>&) -> Result<Value> {
      at::Tensor t = torch::ones({2});
      return Value(nlohmann::json(t.view({3}).sum().item<double>()));
    });
    register_method("wait_fifo", [](std::vector<Value>& a) { return wait_fifo(a); });
    register_method("add", [](std::vector<Value>& a) -> Result<Value> {
      return Value(nlohmann::json(a.at(0).json().get<double>() + a.at(1).json().get<double>()));
    });
    register_method("log", [this](std::vector<Value>& a) -> Result<Value> {
      log_.push_back(a.at(0).json());
      return Value(log_);
    });
  }

 private:
  WorkerContext ctx_;
  nlohmann::json log_ = nlohmann::json::array();  // every "log" argument, in arrival order
};

class Critic : public Worker {
 public:
  Critic() {
    register_method("value", [](std::vector<Value>& a) -> Result<Value> {
      TESSERA_ASSIGN_OR_RETURN(proto::DataProto in, a.at(0).as_proto("value arg 0"));
      return Value(nlohmann::json{{"role", "critic"}, {"rows", in.size()}});
    });
  }
};

Status check_config(const nlohmann::json& cfg) {
  if (cfg.value("throw", false)) throw std::logic_error("constructor threw on purpose");
  if (cfg.value("fail", false)) {
    return make_error(ErrorCode::invalid_argument, "init config asked to fail");
  }
  return Status();
}

}  // namespace

void register_test_workers(WorkerTypeRegistry& registry) {
  (void)registry.add("echo", [](const WorkerContext& ctx, const nlohmann::json& cfg)
                                 -> Result<std::unique_ptr<Worker>> {
    TESSERA_RETURN_IF_ERROR(check_config(cfg));
    return std::unique_ptr<Worker>(std::make_unique<Echo>(ctx));
  });
  (void)registry.add("critic", [](const WorkerContext&, const nlohmann::json& cfg)
                                   -> Result<std::unique_ptr<Worker>> {
    TESSERA_RETURN_IF_ERROR(check_config(cfg));
    return std::unique_ptr<Worker>(std::make_unique<Critic>());
  });
}

const WorkerTypeRegistry& test_registry() {
  static const WorkerTypeRegistry registry = [] {
    WorkerTypeRegistry r;
    register_test_workers(r);
    return r;
  }();
  return registry;
}

int connect_local_socket(const std::string& name) {
  Result<int> fd = internal::connect_local(name);
  return fd.ok() ? *fd : -1;
}

}  // namespace tessera::runtime::testing
