// bench_proto: DataProto wire codec and zero-copy chunk/concat.
//
//   BM_proto_encode_decode/<MiB>  encode (scatter/gather) + flatten into a warm buffer + zero-copy
//                                 decode, for a DataProto of 8 float tensors (<MiB> in total) plus
//                                 a string column. bytes/s counts the tensor bytes.
//   BM_proto_memcpy/<MiB>         memcpy of the same number of bytes into a warm buffer: the
//                                 denominator (goal: encode+decode >= 0.8x of it).
//   BM_proto_chunk_concat/<MiB>   chunk(8) + concat of the same DataProto: O(1) in bytes, so 256
//                                 and 16 MiB should take the same time.
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include <torch/torch.h>

#include "proto/codec.hpp"
#include "proto/data_proto.hpp"

namespace {

using tessera::proto::Buffer;
using tessera::proto::Column;
using tessera::proto::DataProto;
using tessera::proto::TensorDict;

constexpr int64_t kRows = 4096;
constexpr int64_t kTensors = 8;

DataProto make_batch(int64_t mib) {
  const int64_t bytes_per_tensor = mib * (int64_t{1} << 20) / kTensors;
  const int64_t cols = bytes_per_tensor / kRows / static_cast<int64_t>(sizeof(float));
  TensorDict t;
  for (int64_t i = 0; i < kTensors; ++i) {
    t.insert_or_assign("t" + std::to_string(i), torch::full({kRows, cols}, static_cast<float>(i)));
  }
  std::vector<std::string> uid;
  for (int64_t r = 0; r < kRows; ++r) uid.push_back("uid-" + std::to_string(r));
  tessera::proto::NonTensorBatch c;
  c.insert_or_assign("uid", Column::strings(std::move(uid)));
  auto d = DataProto::from_dict(t, c, nlohmann::json{{"temperature", 1.0}});
  if (!d.ok()) std::abort();
  return std::move(d).value();
}

int64_t tensor_bytes(const DataProto& d) {
  int64_t n = 0;
  for (const auto& kv : d.batch()) n += kv.second.nbytes();
  return n;
}

void BM_proto_encode_decode(benchmark::State& state) {
  DataProto d = make_batch(state.range(0));
  auto first = tessera::proto::encode(d);
  if (!first.ok()) {
    state.SkipWithError(first.status().to_string().c_str());
    return;
  }
  auto warm = Buffer::allocate(first->size());
  std::memset((*warm)->data(), 0, first->size());  // fault the pages in: a warm destination
  auto dst = Buffer::wrap((*warm)->data(), first->size(), nullptr);
  for (auto _ : state) {
    auto frame = tessera::proto::encode(d);
    frame->flatten_into(dst->data());
    auto back = tessera::proto::decode(dst);
    if (!back.ok()) {
      state.SkipWithError(back.status().to_string().c_str());
      return;
    }
    benchmark::DoNotOptimize(back->batch().find("t7")->data_ptr());
  }
  state.SetBytesProcessed(state.iterations() * tensor_bytes(d));
  state.counters["frame_MiB"] = static_cast<double>(first->size()) / (1 << 20);
}

void BM_proto_memcpy(benchmark::State& state) {
  DataProto d = make_batch(state.range(0));
  const size_t n = static_cast<size_t>(tensor_bytes(d));
  std::vector<uint8_t> dst(n, 0);  // warm destination
  for (auto _ : state) {
    uint8_t* out = dst.data();
    for (const auto& kv : d.batch()) {
      std::memcpy(out, kv.second.data_ptr(), kv.second.nbytes());
      out += kv.second.nbytes();
    }
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(n));
}

void BM_proto_chunk_concat(benchmark::State& state) {
  DataProto d = make_batch(state.range(0));
  for (auto _ : state) {
    auto chunks = d.chunk(8);
    auto joined = DataProto::concat(*chunks);
    if (!joined.ok() || joined->batch().find("t0")->data_ptr() != d.batch().find("t0")->data_ptr()) {
      state.SkipWithError("concat copied or failed");
      return;
    }
    benchmark::DoNotOptimize(joined->size());
  }
  state.SetItemsProcessed(state.iterations());
}

BENCHMARK(BM_proto_encode_decode)->Arg(16)->Arg(256)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_proto_memcpy)->Arg(16)->Arg(256)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_proto_chunk_concat)->Arg(16)->Arg(256)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
