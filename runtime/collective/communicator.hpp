// communicator.hpp: the narrow collective interface every FSDP/rollout rank talks through.
//
// Modelled on c10d's ProcessGroup/Backend split, cut down to what Tessera needs: all_gather,
// reduce_scatter, all_reduce, broadcast, barrier and send/recv on flat contiguous tensors. Each
// call takes a CollectiveOptions with a timeout; every failure is a Status whose message names
// the operation, this rank, the group and (where it is known) the peer:
//   "all_gather (rank 1 of 2, group fsdp): peer rank 0 timed out after 5000 ms".
//
// Backends (make_communicator picks by name): "gloo" (c10d ProcessGroupGloo over a TCPStore),
// "nccl" (raw NCCL; only in builds configured with -DTESSERA_WITH_CUDA=ON) and "inproc" (threads
// of one process; the fake used by unit tests).
//
// Thread contract: one Communicator is used by one thread at a time, and all ranks of a group
// issue the same collectives in the same order (the c10d contract). Different Communicators
// (e.g. the sub-groups of a DeviceMesh) may be used from different threads.
//
// Note [Deferred collectives]
// start_all_gather and start_reduce_scatter leave the collective running and return a
// PendingCollective; its wait() is what makes the result visible to the caller's later work.
// This is how FSDP overlaps communication with compute (prefetching the next unit's parameters,
// reducing a unit's gradient while backward goes on). On the NCCL backend with device tensors the
// collective is queued on the communicator's stream after the work the caller had queued so far,
// and wait() makes the caller's current CUDA stream wait for it (the host never blocks; the
// buffers are recorded on the communicator's stream, so freeing them early is safe). The other
// backends, and host tensors on NCCL, finish the collective inside the start call and wait()
// returns at once. Either way the numbers are those of the blocking call. Validation errors and
// failures seen while starting are the start call's Status; a failure found later (an NCCL
// timeout) breaks the group as usual and is reported by wait() or the next call. A
// PendingCollective must not outlive its communicator; destroying one unwaited waits for it.
//
// Failure contract: a validation error (bad shape, bad root) is reported before any byte moves
// and leaves the communicator usable. A timeout or transport error leaves the group in an
// unknown state, so the communicator marks itself broken: every later call fails fast with an
// error that quotes the first failure.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "proto/status.hpp"

namespace tessera::collective {

/// Reduction applied by all_reduce and reduce_scatter.
enum class ReduceOp : uint8_t { sum, avg, max };

/// "sum" / "avg" / "max".
const char* to_string(ReduceOp op);

/// Per-call options (c10d style).
struct CollectiveOptions {
  /// How long this call may wait for its peers; zero means the communicator's default timeout.
  std::chrono::milliseconds timeout{0};
};

/// How to build a communicator (the rendezvous parameters of torch.distributed.init_process_group).
struct CommunicatorOptions {
  std::string backend = "gloo";         ///< "gloo" | "nccl" | "inproc".
  int rank = 0;                         ///< This process's (or thread's) rank in [0, world_size).
  int world_size = 1;                   ///< Number of ranks.
  std::string master_addr = "127.0.0.1";  ///< TCPStore host (rank 0 serves it).
  int master_port = 29500;              ///< TCPStore port.
  std::chrono::milliseconds timeout{300000};  ///< Rendezvous timeout and default per-call timeout.
  std::string group_name = "world";     ///< Shown in every error message.
  std::string gloo_hostname;            ///< Address Gloo binds; empty: resolve this host's name.
  int cuda_device = -1;                 ///< NCCL: CUDA ordinal; -1: the thread's current device.
  std::string inproc_key;               ///< inproc: rendezvous id; empty: "master_addr:master_port".
};

/// A collective left running by Communicator::start_* (Note [Deferred collectives]).
class PendingCollective {
 public:
  /// Nothing pending: wait() returns OK.
  PendingCollective();
  /// Pending work; `wait` orders the caller after it and returns its status.
  explicit PendingCollective(std::function<Status()> wait);
  PendingCollective(PendingCollective&& other) noexcept;
  PendingCollective& operator=(PendingCollective&& other) noexcept;
  PendingCollective(const PendingCollective&) = delete;
  PendingCollective& operator=(const PendingCollective&) = delete;
  ~PendingCollective();

  /// Makes the caller's later work see the result (see the Note) and returns the collective's
  /// status; later calls return OK.
  Status wait();
  /// True until wait() has run.
  bool pending() const { return static_cast<bool>(wait_); }

 private:
  std::function<Status()> wait_;
};

/// A group of ranks that run collectives together. See the file comment for the contracts.
class Communicator {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  /// This member's rank in the group, in [0, size()).
  int rank() const { return rank_; }
  /// Number of ranks in the group.
  int size() const { return size_; }
  /// The group's display name ("world", "fsdp", "ddp", ...).
  const std::string& group_name() const { return group_name_; }
  /// The timeout used when a call passes a zero timeout.
  std::chrono::milliseconds default_timeout() const { return default_timeout_; }
  /// "gloo", "nccl" or "inproc".
  virtual const char* backend_name() const = 0;
  /// True once a timeout or transport error has made the group unusable.
  bool broken() const;

  /// output[i*n, (i+1)*n) = input of rank i, n = input.numel().
  /// REQUIRES: both contiguous, same dtype and device, output.numel() == size() * input.numel().
  /// `input` may be a view into `output` (the usual FSDP in-place gather).
  Status all_gather(const at::Tensor& input, const at::Tensor& output,
                    const CollectiveOptions& opts = {});

  /// output = op over ranks of input[rank*n, (rank+1)*n), n = output.numel().
  /// REQUIRES: both contiguous, same dtype and device, input.numel() == size() * output.numel();
  /// avg needs a floating dtype. Half/bfloat16 are accumulated in fp32 by the gloo and in-process
  /// backends, in their own dtype by NCCL (as PyTorch's NCCL process groups do).
  Status reduce_scatter(const at::Tensor& input, const at::Tensor& output, ReduceOp op,
                        const CollectiveOptions& opts = {});

  /// all_gather and reduce_scatter left running (Note [Deferred collectives]): same arguments,
  /// same results once the returned PendingCollective has been waited for.
  Result<PendingCollective> start_all_gather(const at::Tensor& input, const at::Tensor& output,
                                             const CollectiveOptions& opts = {});
  Result<PendingCollective> start_reduce_scatter(const at::Tensor& input, const at::Tensor& output, ReduceOp op,
                                                 const CollectiveOptions& opts = {});
  /// tensor = op over ranks of tensor, in place. REQUIRES: contiguous; avg needs a floating dtype.
  Status all_reduce(const at::Tensor& tensor, ReduceOp op, const CollectiveOptions& opts = {});

  /// tensor = root's tensor, in place. REQUIRES: contiguous, 0 <= root < size().
  Status broadcast(const at::Tensor& tensor, int root, const CollectiveOptions& opts = {});

  /// Returns once every rank of the group has entered the barrier.
  Status barrier(const CollectiveOptions& opts = {});

  /// Sends `tensor` to rank `dst`, matched by the recv(…, src=rank()) there.
  /// REQUIRES: contiguous, dst != rank(), 0 <= dst < size().
  Status send(const at::Tensor& tensor, int dst, const CollectiveOptions& opts = {});

  /// Receives into `tensor` from rank `src`; the sender's numel and dtype must match.
  Status recv(const at::Tensor& tensor, int src, const CollectiveOptions& opts = {});

  /// Creates the sub-group made of `members` (ranks of this group, ascending, containing rank()).
  /// Collective over this group: every rank calls it, in the same order, each passing the
  /// member list of the sub-group it belongs to. `name` is the sub-group's display name.
  Result<std::shared_ptr<Communicator>> new_subgroup(const std::vector<int>& members,
                                                     const std::string& name,
                                                     const CollectiveOptions& opts = {});

 protected:
  Communicator(int rank, int size, std::string group_name,
               std::chrono::milliseconds default_timeout);

  // Backend hooks. The public wrappers have already validated the arguments, handled size()==1
  // and empty tensors, resolved the timeout, and will add the "op (rank r of n, group g)" prefix.
  virtual Status do_all_gather(const at::Tensor& input, const at::Tensor& output,
                               std::chrono::milliseconds timeout) = 0;
  virtual Status do_reduce_scatter(const at::Tensor& input, const at::Tensor& output, ReduceOp op,
                                   std::chrono::milliseconds timeout) = 0;
  virtual Status do_all_reduce(const at::Tensor& tensor, ReduceOp op,
                               std::chrono::milliseconds timeout) = 0;
  /// The deferred forms (Note [Deferred collectives]): a backend that can leave the collective
  /// running sets `pending`; the defaults run the blocking hook and leave it empty.
  virtual Status do_start_all_gather(const at::Tensor& input, const at::Tensor& output,
                                     std::chrono::milliseconds timeout, PendingCollective& pending);
  virtual Status do_start_reduce_scatter(const at::Tensor& input, const at::Tensor& output, ReduceOp op,
                                         std::chrono::milliseconds timeout, PendingCollective& pending);
  virtual Status do_broadcast(const at::Tensor& tensor, int root,
                              std::chrono::milliseconds timeout) = 0;
  virtual Status do_barrier(std::chrono::milliseconds timeout) = 0;
  virtual Status do_send(const at::Tensor& tensor, int dst, std::chrono::milliseconds timeout) = 0;
  virtual Status do_recv(const at::Tensor& tensor, int src, std::chrono::milliseconds timeout) = 0;
  virtual Result<std::shared_ptr<Communicator>> do_new_subgroup(
      const std::vector<int>& members, int sub_rank, const std::string& name,
      std::chrono::milliseconds timeout) = 0;
  /// all_to_all_v's exchange with the peers, after its checks and the self copy (exchange.hpp).
  /// The default is the pairwise schedule of send/recv (Note [Pairwise exchange schedule]); a
  /// backend with grouped point-to-point calls overrides it.
  virtual Status do_all_to_all_v(const std::vector<at::Tensor>& send, const std::vector<at::Tensor>& recv,
                                 std::chrono::milliseconds timeout);
  friend Status all_to_all_v(Communicator& comm, const std::vector<at::Tensor>& send,
                             const std::vector<at::Tensor>& recv, const CollectiveOptions& opts);

 private:
  std::chrono::milliseconds resolve(const CollectiveOptions& opts) const;
  std::string context(const char* op) const;
  Status finish(const char* op, Status st);  // prefixes context; marks broken on comm failure
  Status all_gather_impl(const at::Tensor& input, const at::Tensor& output, const CollectiveOptions& opts,
                         PendingCollective* pending);
  Status reduce_scatter_impl(const at::Tensor& input, const at::Tensor& output, ReduceOp op,
                             const CollectiveOptions& opts, PendingCollective* pending);
  Status fail_if_broken(const char* op) const;

  int rank_;
  int size_;
  std::string group_name_;
  std::chrono::milliseconds default_timeout_;
  mutable std::mutex broken_mu_;
  std::string broken_reason_;  // empty while healthy
};

/// Builds a communicator for `options.backend` and performs the rendezvous.
/// Errors: unknown backend (invalid_argument), "nccl" in a CPU build (unimplemented),
/// rendezvous timeout naming the ranks that never joined (timeout).
Result<std::shared_ptr<Communicator>> make_communicator(const CommunicatorOptions& options);

/// The backend names this build can create, e.g. {"gloo", "inproc"}.
std::vector<std::string> available_backends();

}  // namespace tessera::collective
