// gloo_communicator.cpp: the c10d ProcessGroupGloo backend (CPU, between threads or processes).
//
// Note [Gloo backend]
// * Rendezvous: rank 0 serves a TCPStore at master_addr:master_port. Before the process group
//   is built, every rank sets "<prefix>/join/<rank>" and waits for all of them, so a rank that
//   never shows up is named in the error instead of Gloo's anonymous connect timeout.
// * reduce_scatter is alltoall_base of the raw bytes followed by a local reduction in rank order
//   (accumulating half/bfloat16 in fp32): it moves the same bytes as Gloo's own reduce-scatter
//   and gives exactly the in-process backend's numbers, whatever Gloo's reduction order.
//   all_gather uses the list form over views of the output.
// * Pure data movement (all_gather, broadcast, send/recv, the alltoall) is done on byte views,
//   so every dtype works whether or not Gloo has a kernel for it.
// * Timeouts: each call waits on its Work with the call's timeout. Gloo's own context timeout
//   (the communicator's default) also bounds every op, so a per-call timeout above the default
//   is capped by it. After a timeout the stuck op may still be pending inside Gloo; the
//   communicator is marked broken (communicator.hpp) and destroying it waits at most the
//   default timeout for Gloo to give up.
// * Sub-groups share the parent's TCPStore and Gloo device, under the prefix
//   "<parent>/<seq>:<name>[members]"; <seq> counts new_subgroup calls, which all ranks make in
//   the same order, so re-creating a mesh never reads stale keys.
#include <cstdlib>

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "runtime/collective/communicator.hpp"
#include "runtime/collective/internal/backends.hpp"
#include "runtime/collective/internal/store.hpp"

namespace tessera::collective::internal {
namespace {

// Note [Flight recorder off]: LibTorch 2.x's ProcessGroupGloo records every collective in c10d's
// process-wide FlightRecorder, whose bookkeeping is not safe when several process groups of one
// process enqueue at once, which in-process ranks (threads) do: a map insert inside
// FlightRecorder::record crashed 1 run in 5 of a 2-rank trainer test. Tessera reports
// collective failures itself (rank, peers, op), so the recorder is switched off, at load time,
// before any thread exists, unless the user set TORCH_FR_BUFFER_SIZE.
[[maybe_unused]] const bool kFlightRecorderOff = [] { return ::setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/0) == 0; }();

using GlooDevice = std::shared_ptr<::gloo::transport::Device>;

at::Tensor bytes_of(const at::Tensor& t) { return t.view(-1).view(at::kByte); }

// Joins, then builds the process group over "<prefix>/pg".
Result<c10::intrusive_ptr<c10d::ProcessGroupGloo>> build_group(
    const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank, int size,
    const GlooDevice& device, std::chrono::milliseconds timeout) {
  TESSERA_RETURN_IF_ERROR(wait_for_joins(*store, prefix, rank, size, timeout));
  try {
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    opts->devices.push_back(device);
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix + "/pg", store);
    return c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, size, opts);
  } catch (const std::exception& e) {
    std::string msg = first_line(e);
    return Status(mentions_timeout(msg) ? ErrorCode::timeout : ErrorCode::unavailable,
                  "gloo connect: " + msg);
  }
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(int rank, int size, std::string name, std::chrono::milliseconds timeout,
                   c10::intrusive_ptr<c10d::Store> store, std::string prefix, GlooDevice device,
                   c10::intrusive_ptr<c10d::ProcessGroupGloo> pg)
      : Communicator(rank, size, std::move(name), timeout), store_(std::move(store)),
        prefix_(std::move(prefix)), device_(std::move(device)), pg_(std::move(pg)) {}

  const char* backend_name() const override { return "gloo"; }

 protected:
  Status do_all_gather(const at::Tensor& in, const at::Tensor& out,
                       std::chrono::milliseconds t) override {
    std::vector<at::Tensor> inputs{bytes_of(in)};
    std::vector<std::vector<at::Tensor>> outputs{bytes_of(out).view({size(), -1}).unbind(0)};
    return wait(pg_->allgather(outputs, inputs), t, -1);
  }

  Status do_reduce_scatter(const at::Tensor& in, const at::Tensor& out, ReduceOp op,
                           std::chrono::milliseconds t) override {
    at::Tensor send = bytes_of(in);
    at::Tensor received = at::empty_like(send);
    std::vector<int64_t> counts;  // empty: equal splits
    TESSERA_RETURN_IF_ERROR(wait(pg_->alltoall_base(received, send, counts, counts), t, -1));
    at::Tensor rows = received.view(in.scalar_type()).view({size(), out.numel()});
    at::Tensor acc = rows[0].to(accumulate_dtype(in.scalar_type()), false, /*copy=*/true);
    for (int r = 1; r < size(); ++r) {
      at::Tensor row = rows[r].to(acc.scalar_type());
      if (op == ReduceOp::max) {
        acc = at::maximum(acc, row);
      } else {
        acc.add_(row);
      }
    }
    if (op == ReduceOp::avg) acc.div_(static_cast<double>(size()));
    out.view(-1).copy_(acc);
    return Status();
  }

  Status do_all_reduce(const at::Tensor& tensor, ReduceOp op, std::chrono::milliseconds t) override {
    at::ScalarType acc_dtype = accumulate_dtype(tensor.scalar_type());
    at::Tensor work = acc_dtype == tensor.scalar_type() ? tensor.view(-1)
                                                        : tensor.view(-1).to(acc_dtype);
    c10d::AllreduceOptions opts;
    opts.reduceOp = op == ReduceOp::max ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
    std::vector<at::Tensor> tensors{work};
    TESSERA_RETURN_IF_ERROR(wait(pg_->allreduce(tensors, opts), t, -1));
    if (op == ReduceOp::avg) work.div_(static_cast<double>(size()));
    if (work.data_ptr() != tensor.data_ptr()) tensor.view(-1).copy_(work);
    return Status();
  }

  Status do_broadcast(const at::Tensor& tensor, int root, std::chrono::milliseconds t) override {
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    std::vector<at::Tensor> tensors{bytes_of(tensor)};
    return wait(pg_->broadcast(tensors, opts), t, rank() == root ? -1 : root);
  }

  Status do_barrier(std::chrono::milliseconds t) override { return wait(pg_->barrier(), t, -1); }

  Status do_send(const at::Tensor& tensor, int dst, std::chrono::milliseconds t) override {
    std::vector<at::Tensor> tensors{bytes_of(tensor)};
    return wait(pg_->send(tensors, dst, /*tag=*/0), t, dst);
  }

  Status do_recv(const at::Tensor& tensor, int src, std::chrono::milliseconds t) override {
    std::vector<at::Tensor> tensors{bytes_of(tensor)};
    return wait(pg_->recv(tensors, src, /*tag=*/0), t, src);
  }

  Result<std::shared_ptr<Communicator>> do_new_subgroup(const std::vector<int>& members,
                                                        int sub_rank, const std::string& name,
                                                        std::chrono::milliseconds t) override {
    std::string prefix =
        fmt::format("{}/{}:{}[{}]", prefix_, subgroup_seq_++, name, fmt::join(members, ","));
    int n = static_cast<int>(members.size());
    TESSERA_ASSIGN_OR_RETURN(auto pg, build_group(store_, prefix, sub_rank, n, device_, t));
    return std::shared_ptr<Communicator>(std::make_shared<GlooCommunicator>(
        sub_rank, n, name, default_timeout(), store_, prefix, device_, std::move(pg)));
  }

 private:
  // The one checking wrapper every Gloo call goes through. `peer` is the rank this call depends
  // on when there is exactly one (send/recv/broadcast), else -1.
  Status wait(const c10::intrusive_ptr<c10d::Work>& work, std::chrono::milliseconds t, int peer) {
    try {
      work->wait(t);
      return Status();
    } catch (const std::exception& e) {
      std::string msg = first_line(e);
      std::string who = describe_peers({peer});
      if (peer < 0) {
        std::vector<int> others;
        for (int r = 0; r < size(); ++r) if (r != rank()) others.push_back(r);
        who = (others.size() == 1 ? "" : "one of ") + describe_peers(others);
      }
      if (mentions_timeout(msg)) {
        return make_error(ErrorCode::timeout, "{} timed out after {} ms (gloo: {})", who,
                          t.count(), msg);
      }
      return make_error(ErrorCode::unavailable, "{} failed (gloo: {})", who, msg);
    }
  }

  c10::intrusive_ptr<c10d::Store> store_;
  std::string prefix_;
  GlooDevice device_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;  // destroyed before the store
  int subgroup_seq_ = 0;
};

Result<GlooDevice> make_device(const std::string& hostname) {
  try {
    return hostname.empty() ? c10d::ProcessGroupGloo::createDefaultDevice()
                            : c10d::ProcessGroupGloo::createDeviceForHostname(hostname);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::unavailable, "gloo device for host '{}': {}", hostname,
                      first_line(e));
  }
}

}  // namespace

Result<std::shared_ptr<Communicator>> make_gloo_communicator(const CommunicatorOptions& o) {
  std::string ctx = "rendezvous " + rank_context(o.rank, o.world_size, o.group_name);
  auto store = connect_tcp_store(o);
  if (!store.ok()) return store.status().with_context(ctx);
  auto device = make_device(o.gloo_hostname);
  if (!device.ok()) return device.status().with_context(ctx);
  auto pg = build_group(*store, o.group_name, o.rank, o.world_size, *device, o.timeout);
  if (!pg.ok()) return pg.status().with_context(ctx);
  return std::shared_ptr<Communicator>(std::make_shared<GlooCommunicator>(
      o.rank, o.world_size, o.group_name, o.timeout, std::move(*store), o.group_name,
      std::move(*device), std::move(*pg)));
}

}  // namespace tessera::collective::internal
