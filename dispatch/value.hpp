// value.hpp: what a worker-group method takes and returns, as seen by dispatch.
//
// The value type itself is runtime::Value (JSON | DataProto | list), because the worker actor
// shell below us carries it. Dispatch adds the list helpers its modes need and FutureRef: a
// DataProto that another group's non-blocking call has not finished producing. A FutureRef
// travels as a JSON object under the reserved key "__tessera_future__", so the runtime needs
// no knowledge of it; the consumer rank recognises it with is_future() and materialises its
// own chunk (Note [Futures across groups] in dispatch/futures.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "proto/status.hpp"
#include "runtime/value.hpp"

namespace tessera::dispatch {

using Value = runtime::Value;
/// A list of values (one per rank for DP_COMPUTE; the collected outputs of ONE_TO_ALL...).
using ValueList = runtime::Value::List;
/// The positional arguments of one method call.
using Args = std::vector<Value>;

/// Reserved JSON key marking a FutureRef.
inline constexpr const char* kFutureKey = "__tessera_future__";

/// A reference to the output of a non-blocking call of another WorkerGroup.
struct FutureRef {
  uint64_t id = 0;            ///< Call id assigned by the producing WorkerGroup.
  std::string producer;       ///< Name of the producing WorkerGroup (for error messages).
  int32_t consumer_rank = -1; ///< Set by split: which chunk this consumer rank must fetch.
  int32_t consumer_world = 0; ///< Set by split: how many chunks the data is cut into.
  bool auto_padding = false;  ///< Set by split: pad the materialised data to consumer_world.

  bool operator==(const FutureRef& o) const {
    return id == o.id && producer == o.producer && consumer_rank == o.consumer_rank &&
           consumer_world == o.consumer_world && auto_padding == o.auto_padding;
  }
};

/// The Value that carries `f`.
Value make_future(const FutureRef& f);
/// Whether `v` carries a FutureRef.
bool is_future(const Value& v);
/// The FutureRef in `v`; invalid_argument if it holds none or a malformed one.
Result<FutureRef> future_of(const Value& v);

/// "json" / "DataProto" / "list" / "future", for error messages.
const char* kind(const Value& v);
/// Length when `v` is a list or a JSON array, else -1.
int64_t list_length(const Value& v);
/// Element i of a list or JSON array (a JSON array element becomes a JSON Value).
/// REQUIRES: 0 <= i < list_length(v).
Value element(const Value& v, int64_t i);

}  // namespace tessera::dispatch
