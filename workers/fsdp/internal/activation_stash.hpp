// activation_stash.hpp (internal): the host copies of recomputed units' inputs (Note
// [Activation offload] in activation_stash.cpp), apart from the engine so that tests can drive it.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tessera::fsdp::internal {

/// Slots of activations parked in host memory between a unit's forward and its recompute.
/// Thread contract: one thread at a time (the forward's, then autograd's for backward).
class ActivationStash {
 public:
  /// `copy_on_host`: host tensors are copied too (tests of the bookkeeping); otherwise a host
  /// tensor is kept as it is, since it already lives in host memory.
  explicit ActivationStash(bool copy_on_host = false);
  ~ActivationStash();
  ActivationStash(const ActivationStash&) = delete;
  ActivationStash& operator=(const ActivationStash&) = delete;

  /// Parks `x` in slot `slot` (which must be free). `x` stays on its device while it is the last
  /// slot filled; the next put() starts copying it to host memory (on a GPU on a stream of its
  /// own, after the work queued so far on the caller's stream, with `x`'s memory not reused before
  /// the copy has read it), so the caller may drop `x` at once.
  void put(size_t slot, const at::Tensor& x);
  /// Starts bringing slot `slot` back to its device, if it holds a tensor not yet on its way.
  void prefetch(size_t slot);
  /// Slot `slot`'s tensor, back on its device, ordered before the caller's later work on its
  /// current stream; the slot is free after. Throws if the slot is empty or if the tensor was
  /// modified in place since put() (as autograd's saved tensors refuse it).
  at::Tensor take(size_t slot);
  /// Drops every slot (an abandoned backward).
  void clear();
  /// Slots in use.
  size_t size() const;
  /// Slots whose tensor is still on its device (at most the last one filled).
  size_t resident() const;

 private:
  struct Slot;
  void offload(size_t slot);
  bool copy_on_host_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::optional<size_t> last_;  // the slot filled last, still resident
  struct Streams;
  std::unique_ptr<Streams> streams_;
};

}  // namespace tessera::fsdp::internal
