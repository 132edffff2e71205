// communicator.cpp: the checked public wrappers shared by every backend, and the factory.
//
// Each public call: (1) fails fast if the group is broken, (2) validates the arguments without
// communicating, (3) handles the trivial cases (empty tensors, a group of one) locally, (4) runs
// the backend hook with exceptions converted to Status, and (5) prefixes the error with
// "op (rank r of n, group g)" and marks the group broken, because after a failed collective the
// peers may be anywhere in the op stream.
#include "runtime/collective/communicator.hpp"

#include <torch/torch.h>

#include <functional>
#include <map>

#include "runtime/collective/internal/backends.hpp"

namespace tessera::collective {
namespace {

Status check_tensor(const at::Tensor& t, const char* what) {
  if (!t.defined()) return make_error(ErrorCode::invalid_argument, "{} tensor is undefined", what);
  if (!t.is_contiguous()) {
    return make_error(ErrorCode::invalid_argument, "{} tensor must be contiguous (sizes {})", what,
                      fmt::join(t.sizes(), "x"));
  }
  return Status();
}

// `big` must hold `factor` times as many elements as `small`, with the same dtype and device.
Status check_scaled_pair(const at::Tensor& small, const char* small_name, const at::Tensor& big,
                         const char* big_name, int factor) {
  TESSERA_RETURN_IF_ERROR(check_tensor(small, small_name));
  TESSERA_RETURN_IF_ERROR(check_tensor(big, big_name));
  if (small.scalar_type() != big.scalar_type()) {
    return make_error(ErrorCode::invalid_argument, "{} dtype {} differs from {} dtype {}",
                      small_name, c10::toString(small.scalar_type()), big_name,
                      c10::toString(big.scalar_type()));
  }
  if (small.device() != big.device()) {
    return make_error(ErrorCode::invalid_argument, "{} is on {} but {} is on {}", small_name,
                      small.device().str(), big_name, big.device().str());
  }
  if (big.numel() != small.numel() * factor) {
    return make_error(ErrorCode::invalid_argument,
                      "{} has {} elements, expected group size {} x {} elements of {} = {}",
                      big_name, big.numel(), factor, small.numel(), small_name,
                      small.numel() * factor);
  }
  return Status();
}

Status check_reduce_op(const at::Tensor& t, ReduceOp op) {
  if (op == ReduceOp::avg && !at::isFloatingType(t.scalar_type())) {
    return make_error(ErrorCode::invalid_argument, "avg needs a floating dtype, got {}",
                      c10::toString(t.scalar_type()));
  }
  if (t.scalar_type() == at::kBool && op != ReduceOp::max) {
    return make_error(ErrorCode::invalid_argument, "{} is not defined for bool tensors",
                      to_string(op));
  }
  return Status();
}

Status check_peer(int peer, int rank, int size, const char* role) {
  if (peer < 0 || peer >= size) {
    return make_error(ErrorCode::out_of_range, "{} rank {} is outside [0, {})", role, peer, size);
  }
  if (peer == rank) {
    return make_error(ErrorCode::invalid_argument, "{} rank {} is this rank", role, peer);
  }
  return Status();
}

Status check_members(const std::vector<int>& members, int rank, int size) {
  if (members.empty()) return make_error(ErrorCode::invalid_argument, "member list is empty");
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] < 0 || members[i] >= size) {
      return make_error(ErrorCode::out_of_range, "member rank {} is outside [0, {})", members[i],
                        size);
    }
    if (i > 0 && members[i] <= members[i - 1]) {
      return make_error(ErrorCode::invalid_argument, "members [{}] are not strictly ascending",
                        fmt::join(members, ","));
    }
  }
  if (std::find(members.begin(), members.end(), rank) == members.end()) {
    return make_error(ErrorCode::invalid_argument, "members [{}] do not include this rank {}",
                      fmt::join(members, ","), rank);
  }
  return Status();
}

// Runs a backend hook; an escaped exception is a backend bug reported as an internal error.
Status guarded(const std::function<Status()>& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, "backend threw: {}", internal::first_line(e));
  }
}

}  // namespace

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
  }
  return "unknown";
}

Communicator::Communicator(int rank, int size, std::string group_name,
                           std::chrono::milliseconds default_timeout)
    : rank_(rank), size_(size), group_name_(std::move(group_name)),
      default_timeout_(default_timeout) {}

Communicator::~Communicator() = default;

bool Communicator::broken() const {
  std::lock_guard<std::mutex> lock(broken_mu_);
  return !broken_reason_.empty();
}

std::chrono::milliseconds Communicator::resolve(const CollectiveOptions& opts) const {
  return opts.timeout.count() > 0 ? opts.timeout : default_timeout_;
}

std::string Communicator::context(const char* op) const {
  return std::string(op) + " " + internal::rank_context(rank_, size_, group_name_);
}

Status Communicator::fail_if_broken(const char* op) const {
  std::lock_guard<std::mutex> lock(broken_mu_);
  if (broken_reason_.empty()) return Status();
  return make_error(ErrorCode::unavailable, "{}: group is broken by an earlier failure: {}",
                    context(op), broken_reason_);
}

Status Communicator::finish(const char* op, Status st) {
  if (st.ok()) return st;
  Status out = st.with_context(context(op));
  std::lock_guard<std::mutex> lock(broken_mu_);
  if (broken_reason_.empty()) broken_reason_ = out.message();
  return out;
}

PendingCollective::PendingCollective() = default;
PendingCollective::PendingCollective(std::function<Status()> wait) : wait_(std::move(wait)) {}
PendingCollective::PendingCollective(PendingCollective&& other) noexcept : wait_(std::move(other.wait_)) {
  other.wait_ = nullptr;
}
PendingCollective& PendingCollective::operator=(PendingCollective&& other) noexcept {
  if (this != &other) {
    (void)wait();
    wait_ = std::move(other.wait_);
    other.wait_ = nullptr;
  }
  return *this;
}
PendingCollective::~PendingCollective() { (void)wait(); }

Status PendingCollective::wait() {
  if (!wait_) return Status();
  std::function<Status()> fn = std::move(wait_);
  wait_ = nullptr;
  return fn();
}

Status Communicator::all_gather(const at::Tensor& input, const at::Tensor& output,
                                const CollectiveOptions& opts) {
  return all_gather_impl(input, output, opts, nullptr);
}

Result<PendingCollective> Communicator::start_all_gather(const at::Tensor& input, const at::Tensor& output,
                                                         const CollectiveOptions& opts) {
  PendingCollective pending;
  TESSERA_RETURN_IF_ERROR(all_gather_impl(input, output, opts, &pending));
  return pending;
}

Status Communicator::all_gather_impl(const at::Tensor& input, const at::Tensor& output,
                                     const CollectiveOptions& opts, PendingCollective* pending) {
  const char* op = "all_gather";
  TESSERA_RETURN_IF_ERROR(fail_if_broken(op));
  Status v = check_scaled_pair(input, "input", output, "output", size_);
  if (!v.ok()) return v.with_context(context(op));
  if (input.numel() == 0) return Status();
  if (size_ == 1) {
    if (output.data_ptr() != input.data_ptr()) output.copy_(input);
    return Status();
  }
  if (pending == nullptr) return finish(op, guarded([&] { return do_all_gather(input, output, resolve(opts)); }));
  return finish(op, guarded([&] { return do_start_all_gather(input, output, resolve(opts), *pending); }));
}

Status Communicator::reduce_scatter(const at::Tensor& input, const at::Tensor& output, ReduceOp rop,
                                    const CollectiveOptions& opts) {
  return reduce_scatter_impl(input, output, rop, opts, nullptr);
}

Result<PendingCollective> Communicator::start_reduce_scatter(const at::Tensor& input, const at::Tensor& output,
                                                             ReduceOp rop, const CollectiveOptions& opts) {
  PendingCollective pending;
  TESSERA_RETURN_IF_ERROR(reduce_scatter_impl(input, output, rop, opts, &pending));
  return pending;
}

Status Communicator::reduce_scatter_impl(const at::Tensor& input, const at::Tensor& output, ReduceOp rop,
                                         const CollectiveOptions& opts, PendingCollective* pending) {
  const char* op = "reduce_scatter";
  TESSERA_RETURN_IF_ERROR(fail_if_broken(op));
  Status v = check_scaled_pair(output, "output", input, "input", size_);
  if (v.ok()) v = check_reduce_op(input, rop);
  if (!v.ok()) return v.with_context(context(op));
  if (output.numel() == 0) return Status();
  if (size_ == 1) {
    if (output.data_ptr() != input.data_ptr()) output.copy_(input);
    return Status();
  }
  if (pending == nullptr) {
    return finish(op, guarded([&] { return do_reduce_scatter(input, output, rop, resolve(opts)); }));
  }
  return finish(op, guarded([&] { return do_start_reduce_scatter(input, output, rop, resolve(opts), *pending); }));
}

Status Communicator::do_start_all_gather(const at::Tensor& input, const at::Tensor& output,
                                         std::chrono::milliseconds timeout, PendingCollective&) {
  return do_all_gather(input, output, timeout);
}

Status Communicator::do_start_reduce_scatter(const at::Tensor& input, const at::Tensor& output, ReduceOp op,
                                             std::chrono::milliseconds timeout, PendingCollective&) {
  return do_reduce_scatter(input, output, op, timeout);
}

Status Communicator::all_reduce(const at::Tensor& tensor, ReduceOp rop,
                                const CollectiveOptions& opts) {
  const char* op = "all_reduce";
  TESSERA_RETURN_IF_ERROR(fail_if_broken(op));
  Status v = check_tensor(tensor, "input");
  if (v.ok()) v = check_reduce_op(tensor, rop);
  if (!v.ok()) return v.with_context(context(op));
  if (tensor.numel() == 0 || size_ == 1) return Status();
  return finish(op, guarded([&] { return do_all_reduce(tensor, rop, resolve(opts)); }));
}

Status Communicator::broadcast(const at::Tensor& tensor, int root, const CollectiveOptions& opts) {
  const char* op = "broadcast";
  TESSERA_RETURN_IF_ERROR(fail_if_broken(op));
  Status v = check_tensor(tensor, "input");
  if (v.ok() && (root < 0 || root >= size_)) {
    v = make_error(ErrorCode::out_of_range, "root rank {} is outside [0, {})", root, size_);
  }
  if (!v.ok()) return v.with_context(context(op));
  if (tensor.numel() == 0 || size_ == 1) return Status();
  return finish(op, guarded([&] { return do_broadcast(tensor, root, resolve(opts)); }));
}

Status Communicator::barrier(const CollectiveOptions& opts) {
  const char* op = "barrier";
  TESSERA_RETURN_IF_ERROR(fail_if_broken(op));
  if (size_ == 1) return Status();
  return finish(op, guarded([&] { return do_barrier(resolve(opts)); }));
}

Status Communicator::send(const at::Tensor& tensor, int dst, const CollectiveOptions& opts) {
  const char* op = "send";
  TESSERA_RETURN_IF_ERROR(fail_if_broken(op));
  Status v = check_tensor(tensor, "input");
  if (v.ok()) v = check_peer(dst, rank_, size_, "destination");
  if (!v.ok()) return v.with_context(context(op));
  return finish(op, guarded([&] { return do_send(tensor, dst, resolve(opts)); }));
}

Status Communicator::recv(const at::Tensor& tensor, int src, const CollectiveOptions& opts) {
  const char* op = "recv";
  TESSERA_RETURN_IF_ERROR(fail_if_broken(op));
  Status v = check_tensor(tensor, "output");
  if (v.ok()) v = check_peer(src, rank_, size_, "source");
  if (!v.ok()) return v.with_context(context(op));
  return finish(op, guarded([&] { return do_recv(tensor, src, resolve(opts)); }));
}

Result<std::shared_ptr<Communicator>> Communicator::new_subgroup(const std::vector<int>& members,
                                                                 const std::string& name,
                                                                 const CollectiveOptions& opts) {
  const char* op = "new_subgroup";
  TESSERA_RETURN_IF_ERROR(fail_if_broken(op));
  Status v = check_members(members, rank_, size_);
  if (!v.ok()) return v.with_context(context(op));
  int sub_rank = static_cast<int>(std::find(members.begin(), members.end(), rank_) -
                                  members.begin());
  Result<std::shared_ptr<Communicator>> out = Status(ErrorCode::internal, "unset");
  Status st = guarded([&] {
    out = do_new_subgroup(members, sub_rank, name, resolve(opts));
    return out.status();
  });
  if (!st.ok()) return finish(op, st);
  return out;
}

// ---- factory ---------------------------------------------------------------------------------

namespace {

using Maker = Result<std::shared_ptr<Communicator>> (*)(const CommunicatorOptions&);

const std::map<std::string, Maker>& backend_table() {
  static const std::map<std::string, Maker> table = {
      {"inproc", &internal::make_inproc_communicator},
      {"gloo", &internal::make_gloo_communicator},
#ifdef TESSERA_WITH_CUDA
      {"nccl", &internal::make_nccl_communicator},
#endif
  };
  return table;
}

Status check_options(const CommunicatorOptions& o) {
  if (o.world_size < 1) {
    return make_error(ErrorCode::invalid_argument, "world_size {} must be >= 1", o.world_size);
  }
  if (o.rank < 0 || o.rank >= o.world_size) {
    return make_error(ErrorCode::out_of_range, "rank {} is outside [0, {})", o.rank, o.world_size);
  }
  if (o.timeout.count() <= 0) {
    return make_error(ErrorCode::invalid_argument, "timeout {} ms must be positive",
                      o.timeout.count());
  }
  if (o.master_port < 0 || o.master_port > 65535) {
    return make_error(ErrorCode::out_of_range, "master_port {} is not a TCP port", o.master_port);
  }
  return Status();
}

}  // namespace

std::vector<std::string> available_backends() {
  std::vector<std::string> names;
  for (const auto& [name, maker] : backend_table()) names.push_back(name);
  return names;
}

Result<std::shared_ptr<Communicator>> make_communicator(const CommunicatorOptions& options) {
  const auto& table = backend_table();
  auto it = table.find(options.backend);
  if (it == table.end()) {
    if (options.backend == "nccl") {
      return make_error(ErrorCode::unimplemented,
                        "make_communicator: backend 'nccl' is not built (configure with "
                        "-DTESSERA_WITH_CUDA=ON on a CUDA machine)");
    }
    return make_error(ErrorCode::invalid_argument,
                      "make_communicator: unknown backend '{}' (available: {})", options.backend,
                      fmt::join(available_backends(), ", "));
  }
  Status v = check_options(options);
  if (!v.ok()) return v.with_context("make_communicator(" + options.backend + ")");
  try {
    return it->second(options);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::internal, "make_communicator({}) {}: backend threw: {}",
                      options.backend,
                      internal::rank_context(options.rank, options.world_size, options.group_name),
                      internal::first_line(e));
  }
}

// ---- shared helpers --------------------------------------------------------------------------

namespace internal {

std::string rank_context(int rank, int size, const std::string& group) {
  return fmt::format("(rank {} of {}, group {})", rank, size, group);
}

std::string describe_peers(const std::vector<int>& ranks) {
  return fmt::format("peer rank{} {}", ranks.size() == 1 ? "" : "s", fmt::join(ranks, ","));
}

std::string first_line(const std::exception& e) {
  std::string msg;
  if (const auto* ce = dynamic_cast<const c10::Error*>(&e)) {
    msg = ce->what_without_backtrace();
  } else {
    msg = e.what();
  }
  auto nl = msg.find('\n');
  if (nl != std::string::npos) msg.resize(nl);
  return msg;
}

at::ScalarType accumulate_dtype(at::ScalarType dtype) {
  if (dtype == at::kHalf || dtype == at::kBFloat16) return at::kFloat;
  return dtype;
}

}  // namespace internal
}  // namespace tessera::collective
