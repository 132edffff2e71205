// wire.hpp: runtime::Value <-> WireValue, the step between a method's arguments and a CAF
// message. DataProtos become payload handles published on the sender's data plane (or, for a
// small one bound to another process, an inline frame); the receiver pulls them back.
//
// Thread-safety: free functions; the DataPlane is thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "proto/status.hpp"
#include "runtime/data_plane.hpp"
#include "runtime/messages.hpp"
#include "runtime/value.hpp"

namespace tessera::runtime {

// Note [In-process values]
// A DataProto bound for a receiver in this same process that consumes it once (a blocking
// call's arguments to an in-process worker, its result back to an in-process caller) travels
// as WireKind::proto_local: a pointer to the DataProto itself (its tensors by reference), no
// payload published, fetched or released. Anything that must outlive the call (futures' kept
// results, which other groups' ranks fetch peer to peer) or leave the process is published
// (or inlined) on the data plane as before.

// Note [Chunks cut by the receiver]
// A DP call to in-process workers used to cut its DataProto arguments into world-size row views
// on the caller's thread: a TensorImpl per rank and key, a DataProto per rank, ~20% of the
// caller's instructions for an 8-rank call, all before the first worker could start. When every
// rank's piece is an equal run of rows (dispatch/internal/row_plan.hpp says when), the caller
// instead hands every rank the same shared, immutable DataProto and its row range
// (local_rows_wire), and each receiver cuts its own view while decoding, in parallel. The views
// are the ones DataProto::chunk would have made (slice() of the same tensors), so what a worker
// sees is unchanged.

/// A proto_local value of rows [begin, end) of `whole`, cut by the receiver (Note [Chunks cut by
/// the receiver]). REQUIRES: 0 <= begin <= end <= whole->size(); nobody mutates *whole.
WireValue local_rows_wire(std::shared_ptr<const proto::DataProto> whole, int64_t begin, int64_t end);

/// How to encode values bound for one receiver.
struct EncodeOptions {
  bool remote = false;           ///< The receiver lives in another process.
  uint32_t consumers = 1;        ///< Consuming fetches expected per published payload (0: keep).
  uint64_t inline_max_bytes = 0; ///< Inline a DataProto for a remote receiver up to this size.
  /// The receiver shares this process and consumes the value once: hand DataProtos over by
  /// reference (Note [In-process values]). Ignored when `remote` or `consumers` is 0.
  bool in_process = false;
};

/// Encodes `value`. Every payload it publishes is appended to `published` (if not null), so
/// the caller can release what the receiver never fetched. Errors come from proto::encode.
Result<WireValue> to_wire(const Value& value, DataPlane& data_plane, const EncodeOptions& options,
                          std::vector<PayloadHandle>* published = nullptr);
/// The same, moving `value`'s DataProtos into an in-process WireValue instead of copying them.
Result<WireValue> to_wire(Value&& value, DataPlane& data_plane, const EncodeOptions& options,
                          std::vector<PayloadHandle>* published = nullptr);

/// Decodes `wire`, pulling payload slices (peer to peer; concatenated when several). With
/// `consume`, each fetch counts as one consumer of its payload. Errors name the payload.
Result<Value> from_wire(const WireValue& wire, DataPlane& data_plane, bool consume);

/// from_wire() of several values, fetching every payload slice among them concurrently (one
/// round of fetches for all ranks' results, or all of a call's arguments).
Result<std::vector<Value>> from_wire_many(const std::vector<WireValue>& wires,
                                          DataPlane& data_plane, bool consume);

/// Every payload handle a WireValue refers to (to release results nobody will fetch).
std::vector<PayloadHandle> payload_handles(const WireValue& wire);

/// A WireValue holding JSON.
WireValue json_wire(const nlohmann::json& json);

}  // namespace tessera::runtime
