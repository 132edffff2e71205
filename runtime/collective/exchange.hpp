// exchange.hpp: collectives composed from the Communicator's primitives: a variable-size
// all-to-all (each rank sends a different amount to each peer) and a variable-size all-gather.
//
// Note [Pairwise exchange schedule]
// Send/recv may block until the peer posts the matching call (Gloo's unbound buffers rendezvous
// before moving data), so the order of point-to-point calls must not depend on buffering. Every
// rank walks the same global list of pairs (i, j), i < j, in lexicographic order, and for each pair
// it belongs to, i sends then receives while j receives then sends. The earliest unfinished pair
// always has both members at it (each has finished every earlier pair of its own), so the schedule
// cannot deadlock. It takes up to size()*(size()-1)/2 pairwise steps; groups here are small.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "proto/status.hpp"
#include "runtime/collective/communicator.hpp"

namespace tessera::collective {

/// Rank r sends `send[d]` to every rank d and receives rank s's `send[r]` into `recv[s]`; the
/// self entry is copied locally. Empty entries are skipped (both sides must agree on the sizes,
/// which the caller computes). REQUIRES: send.size() == recv.size() == comm.size(); entries
/// contiguous; recv[s].numel() equals what rank s sends here. Collective over `comm`.
/// Errors: a size mismatch (checked before any byte moves) or the first failed send/recv.
Status all_to_all_v(Communicator& comm, const std::vector<at::Tensor>& send, const std::vector<at::Tensor>& recv,
                    const CollectiveOptions& opts = {});

/// Every rank contributes `bytes` (any length, uint8 CPU tensor) and receives all ranks'
/// contributions in rank order. Two collectives: the lengths, then the payloads padded to the
/// longest. Collective over `comm`.
Result<std::vector<at::Tensor>> all_gather_bytes(Communicator& comm, const at::Tensor& bytes,
                                                 const CollectiveOptions& opts = {});

}  // namespace tessera::collective
