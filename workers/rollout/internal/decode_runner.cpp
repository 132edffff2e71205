// decode_runner.cpp: see Note [Decode graphs] in decode_runner.hpp.
#include "workers/rollout/internal/decode_runner.hpp"

#include <algorithm>
#include <map>
#include <mutex>

#include <torch/torch.h>

#include "proto/host_transfer.hpp"

#if TESSERA_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace tessera::rollout::internal {

std::vector<int64_t> default_buckets(int64_t max_rows) {
  std::vector<int64_t> buckets;
  for (int64_t rows = 1; rows < max_rows; rows *= 2) buckets.push_back(rows);
  buckets.push_back(std::max<int64_t>(max_rows, 1));
  return buckets;
}

#if TESSERA_WITH_CUDA
namespace {

// One capture stream per device for the process: libraries keep per-stream state (cuBLAS's
// workspace), which a fresh pool stream per call would allocate again every call.
c10::cuda::CUDAStream capture_stream(c10::DeviceIndex device) {
  static std::mutex mu;
  static std::map<c10::DeviceIndex, c10::cuda::CUDAStream> streams;
  std::lock_guard<std::mutex> lock(mu);
  auto it = streams.find(device);
  if (it == streams.end()) it = streams.emplace(device, c10::cuda::getStreamFromPool(false, device)).first;
  return it->second;
}

}  // namespace

struct DecodeRunner::Graphs {
  struct Captured {
    std::unique_ptr<at::cuda::CUDAGraph> graph;
    at::Tensor hidden;  ///< The graph's output [bucket, hidden], rewritten by every replay.
  };
  at::Tensor table;  ///< [largest bucket, width + kStepColumns] on the device: every graph's input.
  c10::MempoolId_t pool = at::cuda::graph_pool_handle();
  std::map<int64_t, Captured> captured;
};
#else
struct DecodeRunner::Graphs {};
#endif

DecodeRunner::DecodeRunner(StepModel& model, BlockCache& cache, int64_t max_length, DecodeOptions options)
    : model_(model), cache_(cache), options_(std::move(options)),
      table_width_((max_length + cache.block_size() - 1) / cache.block_size()) {
  if (options_.buckets.empty()) options_.buckets = default_buckets(cache.slots());
  std::sort(options_.buckets.begin(), options_.buckets.end());
#if TESSERA_WITH_CUDA
  if (options_.cuda_graphs) {
    graphs_ = std::make_unique<Graphs>();
    graphs_->table = at::zeros({options_.buckets.back(), table_width_ + kStepColumns},
                               at::TensorOptions(at::kLong).device(model_.device()));
  }
#else
  TORCH_CHECK(!options_.cuda_graphs, "DecodeRunner: this build has no CUDA");
#endif
}

DecodeRunner::~DecodeRunner() = default;

at::Tensor DecodeRunner::step(const std::vector<int64_t>& slots, const std::vector<int64_t>& positions,
                              const at::Tensor& slot_tokens) {
  const auto B = static_cast<int64_t>(slots.size());
  int64_t rows = B, width = 0;  // width 0: as wide as the longest row needs
  if (options_.cuda_graphs || options_.static_shapes) {
    auto bucket = std::lower_bound(options_.buckets.begin(), options_.buckets.end(), B);
    if (bucket != options_.buckets.end()) {
      rows = *bucket;
      width = table_width_;
    }
  }
  auto [host, w] = cache_.append(slots, rows, width);
  auto h = host.accessor<int64_t, 2>();
  for (int64_t b = 0; b < B; ++b) h[b][w + kPosition] = positions[static_cast<size_t>(b)];
  last_rows_ = rows;
  // The table on the device, its token column filled there from the last sampled tokens.
  const auto with_tokens = [&](const at::Tensor& table) {
    const at::Tensor rows_slots = proto::upload(slots, model_.device());
    table.select(1, w + kTokenId).narrow(0, 0, B).copy_(slot_tokens.index_select(0, rows_slots));
    return table;
  };
#if TESSERA_WITH_CUDA
  if (options_.cuda_graphs && width > 0) {
    Graphs& g = *graphs_;
    const at::Tensor table = with_tokens(g.table.narrow(0, 0, rows).copy_(host, /*non_blocking=*/true));
    auto found = g.captured.find(rows);
    if (found != g.captured.end()) {
      found->second.graph->replay();
      ++replayed_;
      return found->second.hidden.narrow(0, 0, B);
    }
    // First step of this bucket: run it eagerly on a side stream (which also warms up the
    // libraries there), then capture the same step for later ones; capturing runs nothing.
    const StepInputs in = step_inputs(table, w);
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(model_.device().index());
    const c10::cuda::CUDAStream side = capture_stream(current.device_index());
    c10::cuda::CUDAEvent ready, done;
    ready.record(current);
    ready.block(side);
    at::Tensor eager;
    {
      c10::cuda::CUDAStreamGuard guard(side);
      eager = model_.decode_step(in.input_ids, in.position_ids, cache_.kv(), in.batch);
      auto graph = std::make_unique<at::cuda::CUDAGraph>();
      // Thread-local capture: other workers' threads in this process keep using their devices.
      graph->capture_begin(g.pool, cudaStreamCaptureModeThreadLocal);
      at::Tensor hidden = model_.decode_step(in.input_ids, in.position_ids, cache_.kv(), in.batch);
      graph->capture_end();
      g.captured.emplace(rows, Graphs::Captured{std::move(graph), hidden});
    }
    done.record(side);
    done.block(current);
    eager.record_stream(current);  // made on `side`, read on `current`
    ++captured_;
    return eager.narrow(0, 0, B);
  }
#endif
  const StepInputs in = step_inputs(with_tokens(host.to(model_.device(), /*non_blocking=*/true)), w);
  return model_.decode_step(in.input_ids, in.position_ids, cache_.kv(), in.batch).narrow(0, 0, B);
}

}  // namespace tessera::rollout::internal
