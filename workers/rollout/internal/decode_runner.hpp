// decode_runner.hpp (internal): runs the decode steps of one generate call, eagerly or by
// replaying CUDA graphs.
//
// Note [Decode graphs]
// A decode step of a small model at a few hundred rows is a thousand short kernels: launching
// them costs more than running them. With rollout.enforce_eager=false on a CUDA device, the
// runner captures StepModel::decode_step once per batch-size bucket (rollout.cudagraph_capture_sizes,
// or the powers of two below the call's slot count and that count) and replays it: one launch
// per step. Buckets are few on purpose: each one used is captured once per call (~tens of ms),
// while a padding row of a launch-bound step costs next to nothing. A captured step has fixed shapes and fixed addresses, so
//  - the batch is padded up to its bucket; padding rows read and write only the scratch block
//    (Note [Paged KV cache]);
//  - the block table has the width of the longest sequence the call can produce;
//  - the step's inputs are copied into one device buffer the graphs were captured on (the token
//    ids from the device, the rest from the host through pinned memory), and the KV pools and the weights (which the engine aliases, kv_engine.hpp) stay put for the call.
// A bucket is captured the first time a step needs it: that step runs eagerly on the same
// buffer (it also warms up cuBLAS on the capture stream), then the capture records the kernels
// without running them, and later steps replay. The graphs live as long as the call, in one
// memory pool, and are freed with it (the weights move between calls); in a rollout session
// (Note [Prefix cache]) they live as long as the session, whose calls share the pool and the weights. A batch larger than the
// largest bucket runs eagerly. Off CUDA, `static_shapes` runs the same padded, fixed-width
// inputs eagerly, so the CPU tests cover everything but the capture itself.
//
// Thread-safety: one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "proto/status.hpp"
#include "workers/rollout/internal/block_cache.hpp"
#include "workers/rollout/step_model.hpp"

namespace tessera::rollout::internal {

/// How decode steps run.
struct DecodeOptions {
  bool cuda_graphs = false;     ///< Capture and replay (CUDA only; see the Note).
  bool static_shapes = false;   ///< Pad to buckets and fix the table width without graphs.
  std::vector<int64_t> buckets; ///< Batch sizes, ascending; empty: the default set up to max_rows.
};

/// The default buckets up to `max_rows`: the powers of two below it, and max_rows.
std::vector<int64_t> default_buckets(int64_t max_rows);

class DecodeRunner {
 public:
  /// A runner for `cache`, whose sequences reach at most `max_length` tokens.
  DecodeRunner(StepModel& model, BlockCache& cache, int64_t max_length, DecodeOptions options);
  ~DecodeRunner();
  DecodeRunner(const DecodeRunner&) = delete;
  DecodeRunner& operator=(const DecodeRunner&) = delete;

  /// One step: slots[i] appends its last token, slot_tokens[slots[i]], at positions[i]. The
  /// tokens stay on the device (`slot_tokens` [cache slots] int64 on the model's device, written
  /// by the previous step's sampling): the host never reads them to feed them back.
  /// Returns hidden states [slots, hidden].
  at::Tensor step(const std::vector<int64_t>& slots, const std::vector<int64_t>& positions,
                  const at::Tensor& slot_tokens);

  /// Rows computed by the last step (its bucket, padding included).
  int64_t last_rows() const { return last_rows_; }
  /// Steps replayed from a graph, and graphs captured, so far.
  int64_t replayed_steps() const { return replayed_; }
  int64_t captured_graphs() const { return captured_; }

 private:
  struct Graphs;  // the CUDA graphs and their input buffer (decode_runner.cpp)

  StepModel& model_;
  BlockCache& cache_;
  DecodeOptions options_;
  int64_t table_width_;  ///< Blocks of the longest sequence (the static width).
  std::unique_ptr<Graphs> graphs_;
  int64_t last_rows_ = 0;
  int64_t replayed_ = 0;
  int64_t captured_ = 0;
};

}  // namespace tessera::rollout::internal
