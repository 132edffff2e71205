// sequence_parallel.hpp: Ulysses sequence parallelism for the actor, the reference and the critic
// (verl's ulysses_sequence_parallel_size). See Note [Ulysses sequence parallelism] in
// sequence_parallel.cpp.
//
// Thread-safety: a group is used by one thread at a time (its communicator's contract).
#pragma once

#include <cstdint>
#include <memory>

#include <ATen/core/Tensor.h>

#include "proto/data_proto.hpp"
#include "proto/status.hpp"
#include "runtime/collective/communicator.hpp"
#include "workers/models/decoder.hpp"

namespace tessera::ppo {

/// One Ulysses group: the ranks that share each micro-batch, every one with a slice of its tokens.
class UlyssesGroup final : public models::SequenceParallelExchange {
 public:
  /// Over `group` (the "sp" dimension of the worker's (dp, sp) mesh). Error: a null group.
  static Result<std::shared_ptr<UlyssesGroup>> create(std::shared_ptr<collective::Communicator> group);

  int64_t rank() const override { return group_->rank(); }
  int64_t size() const override { return group_->size(); }
  /// models::SequenceParallelExchange: all-to-alls over the group, differentiable.
  at::Tensor gather_tokens(const at::Tensor& x) const override;
  at::Tensor scatter_tokens(const at::Tensor& x) const override;

  /// verl's Ulysses preprocess_data: every rank of the group gets the batch tensors of all its
  /// ranks, in rank order (non-tensor columns are left out: the passes read tensors only), with
  /// meta_info of its own input. Collective over the group. Error: the ranks hold different row
  /// counts or tensor sets, or the exchange fails.
  Result<proto::DataProto> gather_rows(const proto::DataProto& data) const;

  /// This rank's rows of a tensor whose rows are the group's, in rank order (gather_rows' output
  /// order): verl's postprocess_data.
  at::Tensor local_rows(const at::Tensor& gathered) const;

  /// x [n, ...] of every rank, concatenated in rank order: [size() * n, ...]. Differentiable; its
  /// backward takes this rank's part of the gradient times size() (verl's Gather with grad_scaler),
  /// since every rank computes the same loss over the gathered values and FSDP averages the
  /// gradients over all ranks. Throws on a failed exchange.
  at::Tensor gather_per_token(const at::Tensor& x) const;

 private:
  explicit UlyssesGroup(std::shared_ptr<collective::Communicator> group) : group_(std::move(group)) {}
  std::shared_ptr<collective::Communicator> group_;
};

/// Why `role` (actor, critic, ...) configured with ulysses_sequence_parallel_size = `size` cannot
/// run with `group` (null: none): a size above 1 needs padding-free micro-batches and a group of
/// that size; a group needs the size. OK otherwise.
Status check_sequence_parallel_group(const std::string& role, int64_t size, bool use_remove_padding,
                                     const UlyssesGroup* group);

}  // namespace tessera::ppo
