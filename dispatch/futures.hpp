// futures.hpp: which rows a consumer rank pulls when a future is passed between worker groups.
//
// Note [Futures across groups]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A non-blocking DP_COMPUTE_PROTO call leaves its output on the producer ranks: rank r holds
// producer_rows[r] rows, and the logical output is their concatenation minus the producer's
// trailing pad rows. When that future is an argument of another group's method, consumer rank
// i of N needs only rows [i*L'/N, (i+1)*L'/N) of the (possibly padded, L' rows) output. verl's
// DataProtoFuture fetches everything on every consumer and slices locally; Tessera computes the
// plan below and each consumer pulls just those row ranges from the producers over the data
// plane, never through the driver. Padding rows are copies of the last logical row (§2.3).
#pragma once

#include <cstdint>
#include <vector>

#include "proto/data_proto.hpp"
#include "proto/status.hpp"

namespace tessera::dispatch {

/// Rows [begin, end) of producer rank `producer_rank`'s output, used `repeat` times in a row.
struct RowSource {
  int32_t producer_rank = 0;
  int64_t begin = 0;
  int64_t end = 0;
  int64_t repeat = 1;
  bool operator==(const RowSource& o) const {
    return producer_rank == o.producer_rank && begin == o.begin && end == o.end && repeat == o.repeat;
  }
};

/// The rows consumer rank `consumer_rank` assembles, in order.
struct ChunkPlan {
  std::vector<RowSource> pieces;
  int64_t rows = 0;          ///< Total rows of the chunk (repeats included).
  int64_t logical_rows = 0;  ///< L: rows of the unpadded producer output.
  int64_t pad = 0;           ///< Rows of padding added to L (to strip from the consumer's output).
};

/// Plans consumer rank `consumer_rank` of `consumer_world`. With auto_padding the output is
/// padded to a multiple of consumer_world; without, L must divide evenly (error says so).
/// Errors: negative counts, producer_pad larger than the output, rank out of range.
Result<ChunkPlan> plan_future_chunk(const std::vector<int64_t>& producer_rows, int64_t producer_pad,
                                    int32_t consumer_world, int32_t consumer_rank, bool auto_padding);

/// Joins the fetched pieces of a plan: fetched[k] holds exactly the rows of plan.pieces[k]
/// (once; repeats are applied here). Errors: wrong piece count or row counts.
Result<proto::DataProto> assemble_chunk(const ChunkPlan& plan, const std::vector<proto::DataProto>& fetched);

}  // namespace tessera::dispatch
