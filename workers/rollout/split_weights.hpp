// split_weights.hpp: split placement: the rollout ranks have devices of their own, and the actor's
// FSDP shards travel to them over the data plane in buckets.
//
// Note [Split placement weight transfer]
// The trainer syncs the weights before generating whenever the actor has changed them:
//   1. it asks the actor group for the bucket plan (`rollout_weight_buckets`): consecutive FSDP
//      units of at most rollout.update_weights_bucket_megabytes each (a unit is never cut), planned
//      once from the flat layouts and cached, with the layout metadata serialised once;
//   2. per bucket, ONE non-blocking control call on the actor group (`export_rollout_weights`):
//      every rank holding a distinct shard (world rank == shard index: one FSDP replica of a
//      HYBRID_SHARD mesh, rank 0 of NO_SHARD) returns a 1-row DataProto whose tensor "unit.<u>" is
//      its shard of unit u cast to the rollout dtype (others return 0 rows); the payloads stay on
//      the actor ranks;
//   3. the resulting future is passed to the rollout group's `load_rollout_weights` (ONE_TO_ALL):
//      every rollout rank pulls the bucket's rows straight from the actor ranks over the data
//      plane (shared memory on one host), never through the driver; the K rows of "unit.<u>" are
//      exactly the unit's padded flat buffer, and the parameters become views of it;
//   4. after the last bucket the engine is re-pointed at the new buffers by reference
//      (RolloutEngine::load_weights_by_reference; no copy beyond the transfer) and the previous
//      version's buffers are freed.
// LoRA adapters (models' Note [LoRA adapters]) travel as units of their own, in fp32, and the
// rollout rank merges them: each unit holding an adapted weight is copied into a buffer of its own
// (the received rows may be shared with the sender in-process), merged there in place, and the
// received rows are let go, so the rollout holds one copy of the weights as without LoRA.
// The weights stay resident on the rollout ranks between steps (no reshard when unchanged).
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "proto/data_proto.hpp"
#include "proto/status.hpp"
#include "workers/fsdp/fsdp_module.hpp"
#include "workers/rollout/engine.hpp"

namespace tessera::rollout {

/// Actor side of Note [Split placement weight transfer].
class WeightExporter {
 public:
  /// An exporter of `fsdp`'s shards in `dtype`, buckets of at most `bucket_bytes` (>= 1 unit).
  WeightExporter(fsdp::FsdpModule& fsdp, c10::ScalarType dtype, int64_t bucket_bytes);

  /// Number of buckets.
  int64_t buckets() const { return static_cast<int64_t>(buckets_.size()); }
  /// Bytes of the whole model in the rollout dtype (what one rollout rank receives per sync).
  int64_t total_bytes() const { return total_bytes_; }
  /// This rank's part of bucket `bucket` of weights version `version` (read from the host
  /// buffers while the parameters are offloaded). Errors: bucket out of range.
  Result<proto::DataProto> export_bucket(int64_t bucket, int64_t version);

 private:
  /// The dtype unit `u` travels in: fp32 for LoRA adapters, the rollout dtype otherwise.
  c10::ScalarType unit_dtype(size_t u) const;

  fsdp::FsdpModule& fsdp_;
  c10::ScalarType dtype_;
  std::vector<std::vector<int>> buckets_;  // unit indices
  std::vector<nlohmann::json> metadata_;   // per bucket, computed once
  int64_t total_bytes_ = 0;
};

/// Rollout side of Note [Split placement weight transfer].
class WeightImporter {
 public:
  /// `lora_scaling` > 0: the actor trains LoRA adapters with this alpha / r (models' Note [LoRA
  /// adapters]); they arrive with the base weights and are merged into them before the engine
  /// takes the weights (Note [Split placement weight transfer]).
  explicit WeightImporter(RolloutEngine& engine, double lora_scaling = 0.0)
      : engine_(engine), lora_scaling_(lora_scaling) {}

  /// Takes one bucket (every contributing actor rank's rows, in rank order). Buckets of one
  /// version must arrive in order; a new version restarts the assembly. After the last bucket the
  /// engine computes with the new weights. Errors (a malformed bucket, shapes, dtype) leave the
  /// engine on its previous weights.
  Status import_bucket(const proto::DataProto& bucket);

  /// The version the engine computes with; -1 before the first complete sync.
  int64_t version() const { return version_; }
  /// Bytes received for the last complete version.
  int64_t received_bytes() const { return received_bytes_; }
  /// The buffers the engine's weights are views of.
  const std::vector<at::Tensor>& buffers() const { return buffers_; }

 private:
  Status import_unit(const nlohmann::json& unit, const proto::DataProto& bucket);
  Status merge_adapters();

  RolloutEngine& engine_;
  double lora_scaling_ = 0.0;
  int64_t version_ = -1;
  std::vector<at::Tensor> buffers_;
  int64_t received_bytes_ = 0;
  // The version being assembled.
  int64_t pending_version_ = -1;
  int64_t next_bucket_ = 0;
  models::TensorMap pending_tensors_;
  std::vector<at::Tensor> pending_buffers_;
  std::vector<std::vector<std::string>> pending_names_;  // the parameters viewing each pending buffer
  int64_t pending_bytes_ = 0;
};

}  // namespace tessera::rollout
