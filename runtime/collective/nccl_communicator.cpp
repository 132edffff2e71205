// nccl_communicator.cpp: the raw-NCCL backend. Compiled only with -DTESSERA_WITH_CUDA=ON; in a
// CPU build this translation unit is empty and make_communicator("nccl") reports unimplemented.
//
// Note [NCCL backend]
// * Rendezvous: the TCPStore of the Gloo backend carries the ncclUniqueId (rank 0 of the group
//   creates it under "<prefix>/nccl_id"); join keys name absent ranks as for Gloo.
// * Every CUDA/NCCL call goes through TESSERA_GPU_CHECK, the one checking wrapper: it turns a
//   failure into a Status naming the call and the library's message (plus ncclGetLastError).
// * Communicators are non-blocking (ncclConfig_t.blocking = 0), so a call never hangs past its
//   timeout; a communicator that timed out is aborted (ncclCommAbort) and reported broken, as
//   NCCL requires.
// * The device is the worker's (CommunicatorOptions::cuda_device, else the thread's current
//   device, which the worker shell sets), never a guess from the rank.
//
// Note [NCCL on device tensors]
// * A CUDA tensor is used in place. The collective runs on the communicator's stream after the
//   work already queued on the caller's current stream (an event the communicator's stream waits
//   on), and the caller's stream waits on the collective in turn, so the kernel that next reads
//   the result is ordered after it with no host wait. Each tensor is recorded on the
//   communicator's stream (recordStream), so the caching allocator does not hand its memory out
//   again while the collective may still use it.
// * The host does not wait for a call to complete: a watchdog thread per communicator checks the
//   completion event of every call in flight. One that passes its deadline, or an asynchronous
//   NCCL error, aborts the communicator; the next call reports it, naming the operation. (It
//   waits only until NCCL has put the call on the stream: Note [Non-blocking enqueue].)
// * Host tensors (small control values: a flag, a count, the norm of a CPU run) are staged
//   through page-locked host buffers and device scratch buffers (H2D, collective, D2H on the
//   communicator's stream) and waited for, bounded, before the call returns, as the host reads
//   them next. Every copy involves page-locked memory only, so none of them makes the host wait
//   for the stream (a copy to or from pageable memory may: behind a collective that a dead peer
//   never completes, that wait would have no end).
// * One thread at a time queues work on the communicator (NcclComm::use), and the watchdog's
//   abort takes the same lock, so a communicator is never freed under a call that is queueing. A
//   staged call holds its buffers (staging_mu_) for the whole call but the communicator only
//   while it queues: its bounded wait leaves the watchdog free to abort. Lock order: staging,
//   use, then the watchdog's state. No buffer is freed before teardown (NcclComm::Buffers).
// * Teardown destroys a communicator whose calls all finished and whose ncclCommFinalize (a
//   collective among the node's ranks) completes within a few seconds; one that failed, never
//   finished initialising, or does not drain or finalise in time is aborted instead (destroying
//   it would wait, forever if a peer died). Its stream is left to the process: the caching
//   allocator may still record events on it for tensors freed later.
// * Sums of half and bfloat16 tensors accumulate in their own dtype, as NCCL and PyTorch's NCCL
//   process groups (FSDP's reduce_dtype) do.
// * all_to_all_v is one ncclGroupStart/End of sends and receives (do_all_to_all_v).
#ifdef TESSERA_WITH_CUDA

#include <torch/torch.h>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "runtime/collective/communicator.hpp"
#include "runtime/collective/internal/backends.hpp"
#include "runtime/collective/internal/store.hpp"

namespace tessera::collective::internal {
namespace {

using Clock = std::chrono::steady_clock;

Status gpu_status(cudaError_t e, const char* expr) {
  if (e == cudaSuccess) return Status();
  return make_error(ErrorCode::unavailable, "{} failed: {} ({})", expr, cudaGetErrorString(e),
                    cudaGetErrorName(e));
}

Status gpu_status(ncclResult_t r, const char* expr) {
  if (r == ncclSuccess || r == ncclInProgress) return Status();
  const char* last = ncclGetLastError(nullptr);
  return make_error(r == ncclInvalidArgument || r == ncclInvalidUsage ? ErrorCode::invalid_argument
                                                                       : ErrorCode::unavailable,
                    "{} failed: {}{}{}", expr, ncclGetErrorString(r),
                    last && *last ? " - " : "", last ? last : "");
}

}  // namespace
}  // namespace tessera::collective::internal

/// The one checking wrapper for every CUDA and NCCL call in this backend.
#define TESSERA_GPU_CHECK(expr) \
  TESSERA_RETURN_IF_ERROR(::tessera::collective::internal::gpu_status((expr), #expr))

namespace tessera::collective::internal {
namespace {

Result<ncclDataType_t> nccl_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kChar: return ncclInt8;
    case at::kByte:
    case at::kBool: return ncclUint8;
    default:
      return make_error(ErrorCode::invalid_argument, "dtype {} has no NCCL equivalent",
                        c10::toString(t));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::max: return ncclMax;
  }
  return ncclSum;
}

/// Owns one NCCL communicator, its device and page-locked staging buffers and the watchdog of its
/// calls in flight; its stream outlives it (Note [NCCL on device tensors]).
class NcclComm {
 public:
  NcclComm(int device, ncclComm_t comm, cudaStream_t stream)
      : device_(device), comm_(comm), stream_(stream) {
    if (comm_) watchdog_ = std::thread([this] { watch_loop(); });
  }
  ~NcclComm() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    cudaSetDevice(device_);
    if (comm_ && !aborted_) {
      // Destroy only a communicator whose calls finished and whose finalisation (a collective
      // among the node's ranks, non-blocking here) completes in time; abort any other (Note
      // [NCCL on device tensors]).
      const auto deadline = Clock::now() + kTeardownWait;
      if (ready_ && drained(deadline) && finalized(deadline)) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
      aborted_ = true;
    }
    for (auto& call : in_flight_) cudaEventDestroy(call.done);
    for (void* p : device_buffers_.all()) cudaFree(p);
    for (void* p : host_buffers_.all()) cudaFreeHost(p);
    // stream_ is not destroyed: tensors recorded on it (torch_stream) may be freed after this,
    // and the caching allocator then records an event on it.
  }

  /// Initialisation finished (init_comm); before that, teardown aborts.
  void mark_ready() { ready_ = true; }

  /// Aborts the communicator for `why` (a failed NCCL call: NCCL requires the abort) and returns
  /// the failure it records.
  Status fail(Status why) {
    abort(std::move(why));
    return failure();
  }

  /// Held while a thread queues work on the communicator; abort() takes it too (Note [NCCL on
  /// device tensors]). Recursive: a call that times out while queueing aborts under it.
  std::unique_lock<std::recursive_mutex> use() { return std::unique_lock<std::recursive_mutex>(use_mu_); }

  int device() const { return device_; }
  ncclComm_t comm() const { return comm_; }
  cudaStream_t stream() const { return stream_; }

  /// The communicator's stream as LibTorch sees it (for recordStream).
  c10::cuda::CUDAStream torch_stream() const {
    return c10::cuda::getStreamFromExternal(stream_, static_cast<c10::DeviceIndex>(device_));
  }

  /// Device buffer `slot` (0 or 1) of at least `bytes`, reused across calls.
  Result<void*> scratch(int slot, size_t bytes) {
    return device_buffers_.at_least(slot, bytes, "cudaMalloc", [](void** p, size_t n) { return cudaMalloc(p, n); });
  }

  /// Page-locked host buffer `slot` (0 or 1) of at least `bytes`, reused across calls (the host
  /// side of a staged call; each such call waits for its copies before the next one starts).
  Result<void*> pinned(int slot, size_t bytes) {
    return host_buffers_.at_least(slot, bytes, "cudaHostAlloc",
                                 [](void** p, size_t n) { return cudaHostAlloc(p, n, cudaHostAllocDefault); });
  }

  /// The failure the watchdog saw (a timed-out call, an asynchronous NCCL error), or OK.
  Status failure() const {
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
  }

  /// Hands the completion event of a call on stream() to the watchdog, which owns it from now on.
  void watch(cudaEvent_t done, Clock::time_point deadline, std::chrono::milliseconds timeout, std::string who) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      in_flight_.push_back(InFlight{done, deadline, timeout, std::move(who)});
    }
    cv_.notify_all();
  }

  /// Note [Non-blocking enqueue]: the communicator is non-blocking (init_comm), so a collective,
  /// or the end of a group, may return ncclInProgress: NCCL's own thread is still putting it on
  /// stream(). Until ncclCommGetAsyncError reports it left that state nothing else may be queued
  /// behind it (an event recorded then would complete before the collective; a copy would read
  /// the result before it is written; NCCL refuses the next call on the communicator). Polls,
  /// bounded by the call's deadline (then aborts the communicator, as a hung call would).
  Status enqueued(Clock::time_point deadline, std::chrono::milliseconds timeout, const std::string& who) {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      TESSERA_RETURN_IF_ERROR(async_state(state));
      if (state == ncclSuccess) return Status();
      if (state != ncclInProgress) {
        return fail(gpu_status(state, "NCCL (asynchronous error)").with_context(who));
      }
      if (Clock::now() >= deadline) {
        return fail(make_error(ErrorCode::timeout, "{}: enqueueing did not finish within {} ms (communicator aborted)",
                         who, timeout.count()));
      }
      std::this_thread::yield();
    }
  }

  /// Polls until the stream drains; aborts the communicator at the deadline. For staged (host)
  /// tensors, whose bytes the host reads right after.
  Status wait(Clock::time_point deadline, std::chrono::milliseconds timeout, const std::string& who) {
    for (;;) {
      ncclResult_t async = ncclSuccess;
      TESSERA_RETURN_IF_ERROR(async_state(async));
      if (async != ncclSuccess && async != ncclInProgress) {  // NCCL requires an abort after one
        return fail(gpu_status(async, "NCCL (asynchronous error)").with_context(who));
      }
      cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess && async == ncclSuccess) return Status();
      if (q != cudaSuccess && q != cudaErrorNotReady) return fail(gpu_status(q, "cudaStreamQuery").with_context(who));
      if (Clock::now() >= deadline) {
        return fail(make_error(ErrorCode::timeout, "{} timed out after {} ms (communicator aborted)", who, timeout.count()));
      }
      std::this_thread::yield();
    }
  }

 private:
  struct InFlight {
    cudaEvent_t done;
    Clock::time_point deadline;
    std::chrono::milliseconds timeout;
    std::string who;
  };

  // The communicator's asynchronous state, read under the lock that abort() holds while it frees
  // the communicator (the watchdog may abort it at any time): the recorded failure once aborted.
  Status async_state(ncclResult_t& state) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_.ok()) return failure_;
    return gpu_status(ncclCommGetAsyncError(comm_, &state), "ncclCommGetAsyncError");
  }

  // Records the first failure and aborts the communicator (once), never while another thread
  // queues work on it (use()).
  void abort(Status why) {
    std::lock_guard<std::recursive_mutex> using_it(use_mu_);
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_.ok()) failure_ = std::move(why);
    if (!aborted_) {
      aborted_ = true;
      ncclCommAbort(comm_);
    }
  }

  // The watchdog: every millisecond while calls are in flight, retires the finished ones and
  // aborts on a passed deadline or an asynchronous error.
  void watch_loop() {
    cudaSetDevice(device_);
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      if (in_flight_.empty()) {
        cv_.wait(lock, [this] { return stopping_ || !in_flight_.empty(); });
        continue;
      }
      while (!in_flight_.empty() && cudaEventQuery(in_flight_.front().done) == cudaSuccess) {
        cudaEventDestroy(in_flight_.front().done);
        in_flight_.pop_front();
      }
      if (!in_flight_.empty() && !aborted_) {
        const InFlight& oldest = in_flight_.front();
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(comm_, &async);
        Status why;
        if (async != ncclSuccess && async != ncclInProgress) {
          why = gpu_status(async, "NCCL (asynchronous error)").with_context(oldest.who);
        } else if (Clock::now() >= oldest.deadline) {
          why = make_error(ErrorCode::timeout, "{} timed out after {} ms (communicator aborted by the watchdog)",
                           oldest.who, oldest.timeout.count());
        }
        if (!why.ok()) {
          lock.unlock();
          abort(std::move(why));
          lock.lock();
        }
      }
      cv_.wait_for(lock, std::chrono::milliseconds(1));
    }
  }

  // How long teardown waits for calls still in flight before it aborts instead of destroying.
  static constexpr std::chrono::seconds kTeardownWait{5};

  // Whether every call in flight and the stream finish by `deadline` (teardown, watchdog stopped).
  bool drained(Clock::time_point deadline) {
    for (;;) {
      bool done = true;
      for (cudaError_t q : queries()) {
        if (q != cudaSuccess && q != cudaErrorNotReady) return false;  // a sticky error: nothing will finish
        done = done && q == cudaSuccess;
      }
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &async) != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
        return false;
      }
      if (done && async == ncclSuccess) return true;
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  // The stream's state, then each call's in flight.
  std::vector<cudaError_t> queries() const {
    std::vector<cudaError_t> out{cudaStreamQuery(stream_)};
    for (const auto& call : in_flight_) out.push_back(cudaEventQuery(call.done));
    return out;
  }

  // Starts ncclCommFinalize and polls it until it completes (true) or fails or passes `deadline`.
  bool finalized(Clock::time_point deadline) {
    const ncclResult_t started = ncclCommFinalize(comm_);
    if (started != ncclSuccess && started != ncclInProgress) return false;
    for (;;) {
      ncclResult_t state = ncclInProgress;
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) return false;
      if (state == ncclSuccess) return true;
      if (state != ncclInProgress || Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  int device_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  // Two staging buffers of one kind. A grown buffer's predecessor is kept until teardown rather
  // than freed: cudaFree and cudaFreeHost wait for the whole device, which a collective hung on a
  // dead peer never lets finish. Sizes double from 64 KiB, so what is kept is at most what is in
  // use.
  struct Buffers {
    void* ptr[2] = {nullptr, nullptr};
    size_t bytes[2] = {0, 0};
    std::vector<void*> retired;

    template <class Alloc>
    Result<void*> at_least(int slot, size_t need, const char* what, Alloc alloc) {
      if (bytes[slot] >= need) return ptr[slot];
      size_t size = std::max<size_t>(2 * bytes[slot], size_t{64} << 10);
      while (size < need) size *= 2;
      void* p = nullptr;
      TESSERA_RETURN_IF_ERROR(gpu_status(alloc(&p, size), what));
      if (ptr[slot]) retired.push_back(ptr[slot]);
      ptr[slot] = p;
      bytes[slot] = size;
      return p;
    }
    std::vector<void*> all() const {
      std::vector<void*> out = retired;
      for (void* p : ptr) if (p) out.push_back(p);
      return out;
    }
  };
  Buffers device_buffers_, host_buffers_;
  bool ready_ = false;
  std::recursive_mutex use_mu_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<InFlight> in_flight_;
  Status failure_;
  bool aborted_ = false;
  bool stopping_ = false;
  std::thread watchdog_;
};

// Initialises a non-blocking communicator and waits (bounded) for it to become ready.
Result<std::unique_ptr<NcclComm>> init_comm(int device, const ncclUniqueId& id, int rank, int size,
                                            std::chrono::milliseconds timeout) {
  TESSERA_GPU_CHECK(cudaSetDevice(device));
  cudaStream_t stream = nullptr;
  TESSERA_GPU_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  Status st = gpu_status(ncclCommInitRankConfig(&comm, size, id, rank, &config),
                         "ncclCommInitRankConfig");
  auto owned = std::make_unique<NcclComm>(device, comm, stream);
  TESSERA_RETURN_IF_ERROR(st);
  auto deadline = Clock::now() + timeout;
  for (;;) {
    ncclResult_t state = ncclInProgress;
    TESSERA_GPU_CHECK(ncclCommGetAsyncError(comm, &state));
    if (state == ncclSuccess) {
      owned->mark_ready();
      return owned;
    }
    TESSERA_GPU_CHECK(state);
    if (Clock::now() >= deadline) {
      return make_error(ErrorCode::timeout, "ncclCommInitRankConfig did not finish within {} ms",
                        timeout.count());
    }
    std::this_thread::yield();
  }
}

// Rank 0 of the group publishes the unique id; the others read it from the store.
Result<ncclUniqueId> exchange_unique_id(c10d::Store& store, const std::string& prefix, int rank,
                                        std::chrono::milliseconds timeout) {
  ncclUniqueId id;
  std::string key = prefix + "/nccl_id";
  if (rank == 0) {
    TESSERA_GPU_CHECK(ncclGetUniqueId(&id));
    const auto* p = reinterpret_cast<const uint8_t*>(&id);
    store.set(key, std::vector<uint8_t>(p, p + sizeof(id)));
    return id;
  }
  try {
    store.wait({key}, timeout);
    std::vector<uint8_t> bytes = store.get(key);
    if (bytes.size() != sizeof(id)) {
      return make_error(ErrorCode::corrupt_data, "store key '{}' holds {} bytes, expected {}", key,
                        bytes.size(), sizeof(id));
    }
    std::memcpy(&id, bytes.data(), sizeof(id));
    return id;
  } catch (const std::exception& e) {
    return make_error(ErrorCode::timeout, "peer rank 0 did not publish the NCCL id within {} ms: {}",
                      timeout.count(), first_line(e));
  }
}

Result<std::unique_ptr<NcclComm>> build_comm(c10d::Store& store, const std::string& prefix,
                                             int rank, int size, int device,
                                             std::chrono::milliseconds timeout) {
  TESSERA_RETURN_IF_ERROR(wait_for_joins(store, prefix, rank, size, timeout));
  TESSERA_ASSIGN_OR_RETURN(ncclUniqueId id, exchange_unique_id(store, prefix, rank, timeout));
  return init_comm(device, id, rank, size, timeout);
}

/// A buffer on the device: the tensor itself when it is on CUDA, else a staged scratch copy.
struct DeviceView {
  void* ptr = nullptr;
  bool staged = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(int rank, int size, std::string name, std::chrono::milliseconds timeout,
                   c10::intrusive_ptr<c10d::Store> store, std::string prefix,
                   std::unique_ptr<NcclComm> comm)
      : Communicator(rank, size, std::move(name), timeout), store_(std::move(store)),
        prefix_(std::move(prefix)), comm_(std::move(comm)) {}

  const char* backend_name() const override { return "nccl"; }

 protected:
  Status do_all_gather(const at::Tensor& in, const at::Tensor& out,
                       std::chrono::milliseconds t) override {
    return all_gather(in, out, t, nullptr);
  }
  Status do_reduce_scatter(const at::Tensor& in, const at::Tensor& out, ReduceOp op,
                           std::chrono::milliseconds t) override {
    return reduce_scatter(in, out, op, t, nullptr);
  }
  Status do_start_all_gather(const at::Tensor& in, const at::Tensor& out, std::chrono::milliseconds t,
                             PendingCollective& pending) override {
    return all_gather(in, out, t, &pending);
  }
  Status do_start_reduce_scatter(const at::Tensor& in, const at::Tensor& out, ReduceOp op,
                                 std::chrono::milliseconds t, PendingCollective& pending) override {
    return reduce_scatter(in, out, op, t, &pending);
  }
  Status do_all_reduce(const at::Tensor& tensor, ReduceOp op, std::chrono::milliseconds t) override {
    TESSERA_ASSIGN_OR_RETURN(ncclDataType_t dt, nccl_dtype(tensor.scalar_type()));
    return run(tensor, tensor, t, -1, [&](void* src, void* dst) {
      return gpu_status(ncclAllReduce(src, dst, tensor.numel(), dt, nccl_op(op), comm_->comm(),
                                      comm_->stream()),
                        "ncclAllReduce");
    });
  }
  Status do_broadcast(const at::Tensor& tensor, int root, std::chrono::milliseconds t) override {
    TESSERA_ASSIGN_OR_RETURN(ncclDataType_t dt, nccl_dtype(tensor.scalar_type()));
    return run(tensor, tensor, t, rank() == root ? -1 : root, [&](void* src, void* dst) {
      return gpu_status(ncclBroadcast(src, dst, tensor.numel(), dt, root, comm_->comm(),
                                      comm_->stream()),
                        "ncclBroadcast");
    });
  }
  Status do_barrier(std::chrono::milliseconds t) override {
    at::Tensor token = at::zeros({1}, at::kFloat);
    return do_all_reduce(token, ReduceOp::sum, t);
  }
  Status do_send(const at::Tensor& tensor, int dst, std::chrono::milliseconds t) override {
    TESSERA_ASSIGN_OR_RETURN(ncclDataType_t dt, nccl_dtype(tensor.scalar_type()));
    return run(tensor, at::Tensor(), t, dst, [&](void* src, void*) {
      return gpu_status(ncclSend(src, tensor.numel(), dt, dst, comm_->comm(), comm_->stream()),
                        "ncclSend");
    });
  }
  Status do_recv(const at::Tensor& tensor, int src, std::chrono::milliseconds t) override {
    TESSERA_ASSIGN_OR_RETURN(ncclDataType_t dt, nccl_dtype(tensor.scalar_type()));
    return run(at::Tensor(), tensor, t, src, [&](void*, void* dst) {
      return gpu_status(ncclRecv(dst, tensor.numel(), dt, src, comm_->comm(), comm_->stream()),
                        "ncclRecv");
    });
  }
  Status do_all_to_all_v(const std::vector<at::Tensor>& send, const std::vector<at::Tensor>& recv,
                         std::chrono::milliseconds t) override {
    // One group of sends and receives. Device tensors only: a staged exchange would need a
    // scratch buffer per peer; host tensors take the pairwise schedule of the base class.
    for (size_t p = 0; p < send.size(); ++p) {
      if ((send[p].numel() > 0 && !send[p].is_cuda()) || (recv[p].numel() > 0 && !recv[p].is_cuda())) {
        return Communicator::do_all_to_all_v(send, recv, t);
      }
    }
    // Every piece checked before the group starts: a group cut short would leave the peers
    // waiting for the pieces never queued.
    const auto device = static_cast<c10::DeviceIndex>(comm_->device());
    for (const auto* pieces : {&send, &recv}) {
      for (const at::Tensor& x : *pieces) {
        if (x.numel() == 0) continue;
        if (x.device().index() != device || !x.is_contiguous()) {
          return make_error(ErrorCode::invalid_argument,
                            "all_to_all_v: a piece on {} ({}contiguous) but the communicator is on cuda:{} and "
                            "sends contiguous pieces", x.device().str(), x.is_contiguous() ? "" : "not ", device);
        }
        TESSERA_RETURN_IF_ERROR(nccl_dtype(x.scalar_type()).status());
      }
    }
    auto using_it = comm_->use();
    TESSERA_RETURN_IF_ERROR(comm_->failure());
    const auto deadline = Clock::now() + t;
    TESSERA_GPU_CHECK(cudaSetDevice(comm_->device()));
    cudaStream_t caller = c10::cuda::getCurrentCUDAStream(device).stream();
    TESSERA_RETURN_IF_ERROR(order_after(caller, comm_->stream()));
    TESSERA_GPU_CHECK(ncclGroupStart());
    Status queued;  // the dtypes were checked above
    for (int peer = 0; peer < size() && queued.ok(); ++peer) {
      if (peer == rank()) continue;
      if (send[peer].numel() > 0) {
        queued = gpu_status(ncclSend(send[peer].data_ptr(), send[peer].numel(), *nccl_dtype(send[peer].scalar_type()),
                                     peer, comm_->comm(), comm_->stream()), "ncclSend");
      }
      if (queued.ok() && recv[peer].numel() > 0) {
        queued = gpu_status(ncclRecv(recv[peer].data_ptr(), recv[peer].numel(), *nccl_dtype(recv[peer].scalar_type()),
                                     peer, comm_->comm(), comm_->stream()), "ncclRecv");
      }
    }
    Status ended = gpu_status(ncclGroupEnd(), "ncclGroupEnd");
    if (ended.ok()) ended = queued;
    // A group cut short leaves the peers waiting for the pieces never queued.
    if (!ended.ok()) return comm_->fail(ended.with_context(peer_text(-1)));
    TESSERA_RETURN_IF_ERROR(comm_->enqueued(deadline, t, peer_text(-1)));  // Note [Non-blocking enqueue]
    std::vector<at::Tensor> used(send);
    used.insert(used.end(), recv.begin(), recv.end());
    return finish_in_place(used, caller, deadline, t, -1);
  }

  Result<std::shared_ptr<Communicator>> do_new_subgroup(const std::vector<int>& members,
                                                        int sub_rank, const std::string& name,
                                                        std::chrono::milliseconds t) override {
    std::string prefix =
        fmt::format("{}/{}:{}[{}]", prefix_, subgroup_seq_++, name, fmt::join(members, ","));
    int n = static_cast<int>(members.size());
    TESSERA_ASSIGN_OR_RETURN(auto comm,
                             build_comm(*store_, prefix, sub_rank, n, comm_->device(), t));
    return std::shared_ptr<Communicator>(std::make_shared<NcclCommunicator>(
        sub_rank, n, name, default_timeout(), store_, prefix, std::move(comm)));
  }

 private:
  // `t` on the device: itself when it is a CUDA tensor, else device scratch `slot`, filled (with
  // `copy_in`) from `t` through page-locked buffer `slot` (Note [NCCL on device tensors]).
  Result<DeviceView> to_device(const at::Tensor& t, int slot, bool copy_in) {
    if (!t.defined()) return DeviceView{};
    if (t.device().is_cuda()) return DeviceView{t.data_ptr(), false};
    if (!t.is_contiguous()) {
      return make_error(ErrorCode::invalid_argument, "host tensor of shape [{}] is not contiguous", fmt::join(t.sizes(), ", "));
    }
    size_t bytes = t.numel() * t.element_size();
    TESSERA_ASSIGN_OR_RETURN(void* p, comm_->scratch(slot, bytes));
    if (copy_in && bytes > 0) {
      TESSERA_ASSIGN_OR_RETURN(void* host, comm_->pinned(slot, bytes));
      std::memcpy(host, t.data_ptr(), bytes);
      TESSERA_GPU_CHECK(cudaMemcpyAsync(p, host, bytes, cudaMemcpyHostToDevice, comm_->stream()));
    }
    return DeviceView{p, true};
  }

  // The all-gather and reduce-scatter of the blocking and the deferred calls (`pending`: Note
  // [Deferred collectives]).
  Status all_gather(const at::Tensor& in, const at::Tensor& out, std::chrono::milliseconds t,
                    PendingCollective* pending) {
    TESSERA_ASSIGN_OR_RETURN(ncclDataType_t dt, nccl_dtype(in.scalar_type()));
    return run(
        in, out, t, -1,
        [&](void* src, void* dst) {
          return gpu_status(ncclAllGather(src, dst, in.numel(), dt, comm_->comm(), comm_->stream()), "ncclAllGather");
        },
        pending);
  }

  Status reduce_scatter(const at::Tensor& in, const at::Tensor& out, ReduceOp op, std::chrono::milliseconds t,
                        PendingCollective* pending) {
    TESSERA_ASSIGN_OR_RETURN(ncclDataType_t dt, nccl_dtype(in.scalar_type()));
    return run(
        in, out, t, -1,
        [&](void* src, void* dst) {
          return gpu_status(
              ncclReduceScatter(src, dst, out.numel(), dt, nccl_op(op), comm_->comm(), comm_->stream()),
              "ncclReduceScatter");
        },
        pending);
  }

  // Enqueues `op(src, dst)` on the communicator's stream. Device tensors are used in place and
  // the call returns once it is queued (Note [NCCL on device tensors]); with `pending` the
  // caller's stream is not made to wait (Note [Deferred collectives]). Host tensors are staged
  // and the call waits, bounded, for their bytes.
  template <class Op>
  Status run(const at::Tensor& in, const at::Tensor& out, std::chrono::milliseconds t, int peer,
             Op op, PendingCollective* pending = nullptr) {
    const bool on_device = (!in.defined() || in.is_cuda()) && (!out.defined() || out.is_cuda());
    const auto deadline = Clock::now() + t;
    if (on_device) {
      auto using_it = comm_->use();
      TESSERA_RETURN_IF_ERROR(comm_->failure());
      TESSERA_GPU_CHECK(cudaSetDevice(comm_->device()));
      return run_in_place(in, out, t, deadline, peer, op, pending);
    }
    // Staged: the buffers are held for the whole call (staging_mu_), the communicator only while
    // the call is queued (use()), so that the watchdog may abort during the bounded wait.
    std::lock_guard<std::mutex> staging(staging_mu_);
    // The same buffer both ways (all_reduce, broadcast): one staged copy. An all-gather whose
    // input is the start of its output is not that: its output needs a buffer of its own size.
    const bool in_place = in.defined() && out.defined() && in.data_ptr() == out.data_ptr() && in.numel() == out.numel();
    const size_t out_bytes = out.defined() && !out.is_cuda() ? out.numel() * out.element_size() : 0;
    void* landing = nullptr;
    {
      auto using_it = comm_->use();
      TESSERA_RETURN_IF_ERROR(comm_->failure());
      TESSERA_GPU_CHECK(cudaSetDevice(comm_->device()));
      // Every buffer before the collective is queued: growing one afterwards would wait for it.
      TESSERA_ASSIGN_OR_RETURN(DeviceView src, to_device(in, 0, /*copy_in=*/true));
      DeviceView dst = src;
      if (!in_place) {
        TESSERA_ASSIGN_OR_RETURN(dst, to_device(out, 1, /*copy_in=*/false));
      }
      if (out_bytes > 0) {
        TESSERA_ASSIGN_OR_RETURN(landing, comm_->pinned(1, out_bytes));
      }
      TESSERA_RETURN_IF_ERROR(op(src.ptr, dst.ptr));
      TESSERA_RETURN_IF_ERROR(comm_->enqueued(deadline, t, peer_text(peer)));  // Note [Non-blocking enqueue]
      if (out_bytes > 0) {
        TESSERA_GPU_CHECK(cudaMemcpyAsync(landing, dst.ptr, out_bytes, cudaMemcpyDeviceToHost, comm_->stream()));
      }
    }
    TESSERA_RETURN_IF_ERROR(comm_->wait(deadline, t, peer_text(peer)));
    if (out_bytes > 0) std::memcpy(out.data_ptr(), landing, out_bytes);
    return Status();
  }

  template <class Op>
  Status run_in_place(const at::Tensor& in, const at::Tensor& out, std::chrono::milliseconds t,
                      Clock::time_point deadline, int peer, Op op, PendingCollective* pending) {
    const auto device = static_cast<c10::DeviceIndex>(comm_->device());
    for (const at::Tensor* x : {&in, &out}) {
      if (x->defined() && x->device().index() != device) {
        return make_error(ErrorCode::invalid_argument, "tensor on {} but the communicator is on cuda:{}",
                          x->device().str(), comm_->device());
      }
    }
    cudaStream_t caller = c10::cuda::getCurrentCUDAStream(device).stream();
    TESSERA_RETURN_IF_ERROR(order_after(caller, comm_->stream()));  // after the producers
    TESSERA_RETURN_IF_ERROR(op(in.defined() ? in.data_ptr() : nullptr, out.defined() ? out.data_ptr() : nullptr));
    TESSERA_RETURN_IF_ERROR(comm_->enqueued(deadline, t, peer_text(peer)));  // Note [Non-blocking enqueue]
    return finish_in_place({in, out}, caller, deadline, t, peer, pending);
  }

  // The tail of every in-place call: the caller's stream waits for the collective (or, with
  // `pending`, will wait when the caller says so), the buffers are recorded on the communicator's
  // stream, and the watchdog takes the completion event.
  Status finish_in_place(const std::vector<at::Tensor>& used, cudaStream_t caller, Clock::time_point deadline,
                         std::chrono::milliseconds t, int peer, PendingCollective* pending = nullptr) {
    cudaEvent_t done = nullptr;
    TESSERA_GPU_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    Status recorded = gpu_status(cudaEventRecord(done, comm_->stream()), "cudaEventRecord");
    if (recorded.ok() && pending != nullptr) {
      // The watchdog owns `done`; the caller's wait gets an event of its own.
      cudaEvent_t visible = nullptr;
      recorded = gpu_status(cudaEventCreateWithFlags(&visible, cudaEventDisableTiming), "cudaEventCreate");
      if (recorded.ok()) recorded = gpu_status(cudaEventRecord(visible, comm_->stream()), "cudaEventRecord");
      if (recorded.ok()) {
        const auto device = static_cast<c10::DeviceIndex>(comm_->device());
        NcclComm* comm = comm_.get();
        *pending = PendingCollective([visible, device, comm]() -> Status {
          cudaStream_t now = c10::cuda::getCurrentCUDAStream(device).stream();
          Status st = gpu_status(cudaStreamWaitEvent(now, visible, 0), "cudaStreamWaitEvent");
          cudaEventDestroy(visible);  // released once the wait is satisfied; the wait stays queued
          return st.ok() ? comm->failure() : st;
        });
      } else if (visible != nullptr) {
        cudaEventDestroy(visible);
      }
    } else if (recorded.ok()) {
      recorded = gpu_status(cudaStreamWaitEvent(caller, done, 0), "cudaStreamWaitEvent");
    }
    if (!recorded.ok()) {
      cudaEventDestroy(done);
      return recorded;
    }
    const c10::cuda::CUDAStream comm_stream = comm_->torch_stream();
    for (const at::Tensor& x : used) {
      if (x.defined() && x.numel() > 0) c10::cuda::CUDACachingAllocator::recordStream(x.storage().data_ptr(), comm_stream);
    }
    comm_->watch(done, deadline, t, peer_text(peer));
    return Status();
  }

  // Makes `waiter` wait for the work queued on `producer` so far.
  static Status order_after(cudaStream_t producer, cudaStream_t waiter) {
    cudaEvent_t ready = nullptr;
    TESSERA_GPU_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    Status st = gpu_status(cudaEventRecord(ready, producer), "cudaEventRecord");
    if (st.ok()) st = gpu_status(cudaStreamWaitEvent(waiter, ready, 0), "cudaStreamWaitEvent");
    cudaEventDestroy(ready);  // released once the wait is satisfied; the wait stays queued
    return st;
  }

  std::string peer_text(int peer) const {
    if (peer >= 0) return describe_peers({peer});
    std::vector<int> others;
    for (int r = 0; r < size(); ++r) if (r != rank()) others.push_back(r);
    return (others.size() == 1 ? "" : "one of ") + describe_peers(others);
  }

  c10::intrusive_ptr<c10d::Store> store_;
  std::string prefix_;
  std::unique_ptr<NcclComm> comm_;
  std::mutex staging_mu_;  // the staging buffers, for a whole staged call (run())
  int subgroup_seq_ = 0;
};

// The worker's device: the one named in the options, else the calling thread's current device
// (the worker shell makes the worker's device current for every call).
Result<int> pick_device(const CommunicatorOptions& o) {
  int count = 0;
  TESSERA_GPU_CHECK(cudaGetDeviceCount(&count));
  if (count == 0) return make_error(ErrorCode::unavailable, "no CUDA device is visible");
  int device = o.cuda_device;
  if (device < 0) TESSERA_GPU_CHECK(cudaGetDevice(&device));
  if (device >= count) {
    return make_error(ErrorCode::out_of_range, "cuda_device {} but only {} devices are visible",
                      device, count);
  }
  return device;
}

}  // namespace

Result<std::shared_ptr<Communicator>> make_nccl_communicator(const CommunicatorOptions& o) {
  std::string ctx = "rendezvous " + rank_context(o.rank, o.world_size, o.group_name);
  auto device = pick_device(o);
  if (!device.ok()) return device.status().with_context(ctx);
  auto store = connect_tcp_store(o);
  if (!store.ok()) return store.status().with_context(ctx);
  auto comm = build_comm(**store, o.group_name, o.rank, o.world_size, *device, o.timeout);
  if (!comm.ok()) return comm.status().with_context(ctx);
  return std::shared_ptr<Communicator>(std::make_shared<NcclCommunicator>(
      o.rank, o.world_size, o.group_name, o.timeout, std::move(*store), o.group_name,
      std::move(*comm)));
}

}  // namespace tessera::collective::internal

#endif  // TESSERA_WITH_CUDA
