#include "dispatch/futures.hpp"

#include "dispatch/modes.hpp"

namespace tessera::dispatch {

namespace {

// Appends the producer rows covering logical rows [begin, end) to `plan`.
void add_rows(const std::vector<int64_t>& producer_rows, int64_t begin, int64_t end, ChunkPlan& plan) {
  int64_t offset = 0;
  for (size_t r = 0; r < producer_rows.size() && begin < end; ++r) {
    const int64_t part_end = offset + producer_rows[r];
    if (begin < part_end) {
      const int64_t take_end = std::min(end, part_end);
      plan.pieces.push_back(RowSource{static_cast<int32_t>(r), begin - offset, take_end - offset, 1});
      plan.rows += take_end - begin;
      begin = take_end;
    }
    offset = part_end;
  }
}

}  // namespace

Result<ChunkPlan> plan_future_chunk(const std::vector<int64_t>& producer_rows, int64_t producer_pad,
                                    int32_t consumer_world, int32_t consumer_rank, bool auto_padding) {
  if (consumer_world < 1 || consumer_rank < 0 || consumer_rank >= consumer_world)
    return make_error(ErrorCode::invalid_argument, "future chunk: consumer rank {} of world {}", consumer_rank,
                      consumer_world);
  int64_t total = 0;
  for (size_t r = 0; r < producer_rows.size(); ++r) {
    if (producer_rows[r] < 0)
      return make_error(ErrorCode::invalid_argument, "future chunk: producer rank {} reports {} rows", r,
                        producer_rows[r]);
    total += producer_rows[r];
  }
  if (producer_pad < 0 || producer_pad > total)
    return make_error(ErrorCode::invalid_argument, "future chunk: producer pad {} for {} rows", producer_pad, total);
  ChunkPlan plan;
  plan.logical_rows = total - producer_pad;
  const int64_t L = plan.logical_rows;
  plan.pad = auto_padding ? pad_size_for(L, consumer_world) : 0;
  if (!auto_padding && L % consumer_world != 0)
    return make_error(ErrorCode::invalid_argument,
                      "future chunk: {} rows do not split evenly into {} chunks and auto-padding is off", L,
                      consumer_world);
  if (L == 0 && plan.pad == 0) return plan;
  if (L == 0) return make_error(ErrorCode::invalid_argument, "future chunk: cannot pad an empty output");
  const int64_t per = (L + plan.pad) / consumer_world;
  const int64_t begin = per * consumer_rank;
  const int64_t end = begin + per;
  add_rows(producer_rows, begin, std::min(end, L), plan);
  if (end > L) {
    const int64_t copies = end - std::max(begin, L);
    ChunkPlan last;
    add_rows(producer_rows, L - 1, L, last);
    RowSource src = last.pieces.at(0);
    src.repeat = copies;
    plan.pieces.push_back(src);
    plan.rows += copies;
  }
  return plan;
}

Result<proto::DataProto> assemble_chunk(const ChunkPlan& plan, const std::vector<proto::DataProto>& fetched) {
  if (fetched.size() != plan.pieces.size())
    return make_error(ErrorCode::invalid_argument, "future chunk: {} pieces fetched, plan has {}", fetched.size(),
                      plan.pieces.size());
  std::vector<proto::DataProto> parts;
  for (size_t k = 0; k < fetched.size(); ++k) {
    const RowSource& s = plan.pieces[k];
    if (fetched[k].size() != s.end - s.begin)
      return make_error(ErrorCode::invalid_argument, "future chunk: piece {} from producer rank {} has {} rows, "
                        "expected {}", k, s.producer_rank, fetched[k].size(), s.end - s.begin);
    if (s.repeat == 1) {
      parts.push_back(fetched[k]);
    } else {
      TESSERA_ASSIGN_OR_RETURN(proto::DataProto rep, fetched[k].repeat(s.repeat, /*interleave=*/false));
      parts.push_back(std::move(rep));
    }
  }
  if (parts.empty()) return make_error(ErrorCode::invalid_argument, "future chunk: empty plan");
  return proto::DataProto::concat(parts);
}

}  // namespace tessera::dispatch
