// inproc_communicator.cpp: the in-process backend (threads as ranks), the fake beside Gloo/NCCL.
//
// Note [In-process collective protocol]
// Every collective is two counting barriers over one shared InprocGroup:
//   exchange: each rank deposits its Contribution (op kind, input handle, reduce op, root); the
//             last one to arrive publishes the snapshot of all contributions.
//   compute:  each rank checks that all contributions agree (same op, dtype, sizes, root) and
//             computes its own result into a fresh tensor, reading the other ranks' inputs.
//   depart:   a second barrier; only after it does any rank write its output. Inputs may alias
//             outputs (in-place all_reduce, all_gather from a view of the output), so writing
//             earlier could corrupt what a slower rank is still reading.
// A barrier that reaches its deadline marks the whole group broken, naming the ranks that never
// arrived; the ranks still waiting wake up and fail with the same message. Reductions run in rank
// order 0..n-1 and accumulate half/bfloat16 in fp32, so results are deterministic.
// send/recv use per-(src, dst) FIFO mailboxes; send copies the tensor and returns at once.
#include <torch/torch.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <optional>

#include "runtime/collective/communicator.hpp"
#include "runtime/collective/internal/backends.hpp"

namespace tessera::collective::internal {
namespace {

using Clock = std::chrono::steady_clock;

enum class OpKind : uint8_t { all_gather, reduce_scatter, all_reduce, broadcast, barrier, subgroup };

const char* op_name(OpKind k) {
  static const char* names[] = {"all_gather", "reduce_scatter", "all_reduce",
                                "broadcast",  "barrier",        "new_subgroup"};
  return names[static_cast<int>(k)];
}

/// What one rank brings to a collective.
struct Contribution {
  OpKind kind = OpKind::barrier;
  at::Tensor input;  // flat view; undefined for barrier/subgroup
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  std::string key;  // subgroup: the sub-group's registry key
};

/// State shared by the members of one in-process group. Thread-safe.
class InprocGroup {
 public:
  explicit InprocGroup(int size) : size_(size), slots_(size), departed_(size, false) {}
  int size() const { return size_; }

  /// Barrier 1: deposits `c`, waits for every rank, returns all contributions by rank.
  Result<std::vector<Contribution>> exchange(int rank, Contribution c, Clock::time_point deadline,
                                             std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    TESSERA_RETURN_IF_ERROR(broken_status());
    slots_[rank] = std::move(c);
    uint64_t gen = exchange_gen_;
    if (++arrived_ == size_) {
      snapshot_.clear();
      for (auto& s : slots_) snapshot_.push_back(std::move(*s)), s.reset();
      arrived_ = 0;
      ++exchange_gen_;
      cv_.notify_all();
      return snapshot_;
    }
    bool done = cv_.wait_until(lock, deadline, [&] { return exchange_gen_ != gen || !broken_.empty(); });
    if (done && exchange_gen_ != gen) return snapshot_;
    if (!done) {
      std::vector<int> missing;
      for (int r = 0; r < size_; ++r) if (!slots_[r]) missing.push_back(r);
      break_group(fmt::format("{} timed out after {} ms", describe_peers(missing), timeout.count()));
    }
    return broken_status();
  }

  /// Barrier 2: returns once every rank has finished reading the snapshot.
  Status depart(int rank, Clock::time_point deadline, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    TESSERA_RETURN_IF_ERROR(broken_status());
    departed_[rank] = true;
    uint64_t gen = depart_gen_;
    if (++departed_count_ == size_) {
      departed_count_ = 0;
      std::fill(departed_.begin(), departed_.end(), false);
      snapshot_.clear();
      ++depart_gen_;
      cv_.notify_all();
      return Status();
    }
    bool done = cv_.wait_until(lock, deadline, [&] { return depart_gen_ != gen || !broken_.empty(); });
    if (done && depart_gen_ != gen) return Status();
    if (!done) {
      std::vector<int> missing;
      for (int r = 0; r < size_; ++r) if (!departed_[r]) missing.push_back(r);
      break_group(fmt::format("{} timed out after {} ms", describe_peers(missing), timeout.count()));
    }
    return broken_status();
  }

  /// Appends a copy of `t` to the (src, dst) mailbox.
  Status post(int src, int dst, const at::Tensor& t) {
    std::lock_guard<std::mutex> lock(mu_);
    TESSERA_RETURN_IF_ERROR(broken_status());
    mail_[{src, dst}].push_back(t.clone());
    cv_.notify_all();
    return Status();
  }

  /// Pops the oldest message of the (src, dst) mailbox, waiting until `deadline`.
  Result<at::Tensor> take(int src, int dst, Clock::time_point deadline,
                          std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    auto& box = mail_[{src, dst}];
    bool got = cv_.wait_until(lock, deadline, [&] { return !box.empty() || !broken_.empty(); });
    if (!box.empty()) {
      at::Tensor t = std::move(box.front());
      box.pop_front();
      return t;
    }
    if (!got) {
      return make_error(ErrorCode::timeout, "peer rank {} timed out after {} ms (no message sent)",
                        src, timeout.count());
    }
    return broken_status();
  }

 private:
  void break_group(std::string reason) {
    if (broken_.empty()) broken_ = std::move(reason);
    cv_.notify_all();
  }
  Status broken_status() const {
    if (broken_.empty()) return Status();
    return Status(ErrorCode::timeout, broken_);
  }

  std::mutex mu_;
  std::condition_variable cv_;
  const int size_;
  std::vector<std::optional<Contribution>> slots_;
  int arrived_ = 0;
  uint64_t exchange_gen_ = 0;
  std::vector<Contribution> snapshot_;
  std::vector<bool> departed_;
  int departed_count_ = 0;
  uint64_t depart_gen_ = 0;
  std::string broken_;
  std::map<std::pair<int, int>, std::deque<at::Tensor>> mail_;
};

/// Process-wide rendezvous: groups by key, alive while any member holds them.
class Registry {
 public:
  static Registry& instance() {
    static Registry r;
    return r;
  }
  Result<std::shared_ptr<InprocGroup>> get_or_create(const std::string& key, int size) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = groups_[key];
    auto group = slot.lock();
    if (group && group->size() != size) {
      return make_error(ErrorCode::invalid_argument,
                        "inproc group '{}' already exists with size {}, not {}", key,
                        group->size(), size);
    }
    if (!group) slot = group = std::make_shared<InprocGroup>(size);
    return group;
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::weak_ptr<InprocGroup>> groups_;
};

// ---- per-op consistency checks and results (pure functions of the snapshot) -----------------

Status check_agreement(const std::vector<Contribution>& all, int self) {
  const Contribution& me = all[self];
  for (size_t r = 0; r < all.size(); ++r) {
    const Contribution& c = all[r];
    if (c.kind != me.kind) {
      return make_error(ErrorCode::invalid_argument, "rank {} called {} while this rank called {}",
                        r, op_name(c.kind), op_name(me.kind));
    }
    if (me.input.defined() && (c.input.numel() != me.input.numel() ||
                               c.input.scalar_type() != me.input.scalar_type())) {
      return make_error(ErrorCode::invalid_argument,
                        "rank {} passed {} elements of {}, this rank {} elements of {}", r,
                        c.input.numel(), c10::toString(c.input.scalar_type()), me.input.numel(),
                        c10::toString(me.input.scalar_type()));
    }
    if (c.op != me.op || c.root != me.root) {
      return make_error(ErrorCode::invalid_argument,
                        "rank {} passed op {} root {}, this rank op {} root {}", r,
                        to_string(c.op), c.root, to_string(me.op), me.root);
    }
  }
  return Status();
}

at::Tensor reduce(const std::vector<at::Tensor>& parts, ReduceOp op) {
  at::ScalarType dtype = parts[0].scalar_type();
  at::Tensor acc = parts[0].to(accumulate_dtype(dtype), /*non_blocking=*/false, /*copy=*/true);
  for (size_t r = 1; r < parts.size(); ++r) {
    if (op == ReduceOp::max) {
      acc = at::maximum(acc, parts[r].to(acc.scalar_type()));
    } else {
      acc.add_(parts[r].to(acc.scalar_type()));
    }
  }
  if (op == ReduceOp::avg) acc.div_(static_cast<double>(parts.size()));
  return acc.to(dtype);
}

at::Tensor compute(const std::vector<Contribution>& all, int self, int64_t out_numel) {
  const Contribution& me = all[self];
  std::vector<at::Tensor> parts;
  switch (me.kind) {
    case OpKind::all_gather:
      for (const auto& c : all) parts.push_back(c.input);
      return at::cat(parts);
    case OpKind::reduce_scatter:
      for (const auto& c : all) parts.push_back(c.input.narrow(0, self * out_numel, out_numel));
      return reduce(parts, me.op);
    case OpKind::all_reduce:
      for (const auto& c : all) parts.push_back(c.input);
      return reduce(parts, me.op);
    case OpKind::broadcast:
      return all[me.root].input.clone();
    default:
      return at::Tensor();
  }
}

// ---- the communicator ------------------------------------------------------------------------

class InprocCommunicator final : public Communicator {
 public:
  InprocCommunicator(int rank, int size, std::string name, std::chrono::milliseconds timeout,
                     std::shared_ptr<InprocGroup> group, std::string key)
      : Communicator(rank, size, std::move(name), timeout), group_(std::move(group)),
        key_(std::move(key)) {}

  const char* backend_name() const override { return "inproc"; }

  /// Runs one collective per Note [In-process collective protocol]; writes into `output`.
  Status run(Contribution c, const at::Tensor& output, std::chrono::milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    TESSERA_ASSIGN_OR_RETURN(std::vector<Contribution> all,
                             group_->exchange(rank(), std::move(c), deadline, timeout));
    Status agree = check_agreement(all, rank());
    at::Tensor result;
    if (agree.ok()) result = compute(all, rank(), output.defined() ? output.numel() : 0);
    all.clear();  // drop our references to the peers' inputs before they may reuse them
    TESSERA_RETURN_IF_ERROR(group_->depart(rank(), deadline, timeout));
    TESSERA_RETURN_IF_ERROR(agree);
    if (result.defined()) output.view(-1).copy_(result);
    return Status();
  }

 protected:
  Status do_all_gather(const at::Tensor& in, const at::Tensor& out,
                       std::chrono::milliseconds t) override {
    return run({OpKind::all_gather, in.view(-1)}, out, t);
  }
  Status do_reduce_scatter(const at::Tensor& in, const at::Tensor& out, ReduceOp op,
                           std::chrono::milliseconds t) override {
    return run({OpKind::reduce_scatter, in.view(-1), op}, out, t);
  }
  Status do_all_reduce(const at::Tensor& tensor, ReduceOp op, std::chrono::milliseconds t) override {
    return run({OpKind::all_reduce, tensor.view(-1), op}, tensor, t);
  }
  Status do_broadcast(const at::Tensor& tensor, int root, std::chrono::milliseconds t) override {
    return run({OpKind::broadcast, tensor.view(-1), ReduceOp::sum, root}, tensor, t);
  }
  Status do_barrier(std::chrono::milliseconds t) override {
    return run({OpKind::barrier}, at::Tensor(), t);
  }
  Status do_send(const at::Tensor& tensor, int dst, std::chrono::milliseconds) override {
    return group_->post(rank(), dst, tensor);
  }
  Status do_recv(const at::Tensor& tensor, int src, std::chrono::milliseconds t) override {
    TESSERA_ASSIGN_OR_RETURN(at::Tensor msg, group_->take(src, rank(), Clock::now() + t, t));
    if (msg.numel() != tensor.numel() || msg.scalar_type() != tensor.scalar_type()) {
      return make_error(ErrorCode::invalid_argument,
                        "rank {} sent {} elements of {}, expected {} elements of {}", src,
                        msg.numel(), c10::toString(msg.scalar_type()), tensor.numel(),
                        c10::toString(tensor.scalar_type()));
    }
    tensor.view(-1).copy_(msg.view(-1));
    return Status();
  }
  Result<std::shared_ptr<Communicator>> do_new_subgroup(const std::vector<int>& members,
                                                        int sub_rank, const std::string& name,
                                                        std::chrono::milliseconds t) override {
    std::string key = fmt::format("{}/{}[{}]", key_, name, fmt::join(members, ","));
    Contribution c{OpKind::subgroup};
    TESSERA_RETURN_IF_ERROR(run(std::move(c), at::Tensor(), t));
    TESSERA_ASSIGN_OR_RETURN(auto group,
                             Registry::instance().get_or_create(key, static_cast<int>(members.size())));
    return std::shared_ptr<Communicator>(std::make_shared<InprocCommunicator>(
        sub_rank, static_cast<int>(members.size()), name, default_timeout(), std::move(group), key));
  }

 private:
  std::shared_ptr<InprocGroup> group_;
  std::string key_;
};

}  // namespace

Result<std::shared_ptr<Communicator>> make_inproc_communicator(const CommunicatorOptions& o) {
  std::string id = o.inproc_key.empty() ? fmt::format("{}:{}", o.master_addr, o.master_port)
                                        : o.inproc_key;
  std::string key = fmt::format("inproc:{}/{}", id, o.group_name);
  auto group = Registry::instance().get_or_create(key, o.world_size);
  if (!group.ok()) {
    return group.status().with_context("rendezvous " + rank_context(o.rank, o.world_size, o.group_name));
  }
  auto comm = std::make_shared<InprocCommunicator>(o.rank, o.world_size, o.group_name, o.timeout,
                                                   std::move(*group), key);
  if (o.world_size > 1) {
    // The rendezvous: every rank must arrive within the timeout; the error names the absent ones.
    Status st = comm->run({OpKind::barrier}, at::Tensor(), o.timeout);
    if (!st.ok()) {
      return st.with_context("rendezvous " + rank_context(o.rank, o.world_size, o.group_name));
    }
  }
  return std::shared_ptr<Communicator>(std::move(comm));
}

}  // namespace tessera::collective::internal
