// fuzz_proto_decode: libFuzzer target for tessera::proto::decode on untrusted bytes.
//
// Property checked on every input: decode never crashes, hangs or over-reads (ASan); when it
// succeeds, every tensor byte and column value is readable and the result re-encodes and decodes
// again (decode(encode(x)) succeeds). Any violation aborts, which libFuzzer reports.
//
// Seeds: run with TESSERA_FUZZ_WRITE_SEEDS=<dir> to write a few valid frames there and exit
// (tests/fuzz/run_fuzz.sh does this before fuzzing).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <torch/torch.h>

#include "proto/codec.hpp"
#include "proto/data_proto.hpp"

namespace {

using tessera::proto::Column;
using tessera::proto::DataProto;
using tessera::proto::EncodeOptions;
using tessera::proto::NonTensorBatch;
using tessera::proto::TensorDict;
using json = nlohmann::json;

void write_seed(const std::string& dir, const std::string& name, const DataProto& d, EncodeOptions opt = {}) {
  auto frame = tessera::proto::encode(d, opt);
  if (!frame.ok()) std::abort();
  std::vector<uint8_t> bytes(frame->size());
  frame->flatten_into(bytes.data());
  std::ofstream(dir + "/" + name, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                                          static_cast<std::streamsize>(bytes.size()));
}

DataProto must(tessera::Result<DataProto> r) {
  if (!r.ok()) std::abort();
  return std::move(r).value();
}

void write_seeds(const std::string& dir) {
  TensorDict t;
  t.insert_or_assign("x", torch::arange(12, torch::kFloat).reshape({4, 3}));
  t.insert_or_assign("mask", torch::ones({4, 2}, torch::kBool));
  t.insert_or_assign("h", torch::arange(4, torch::kBFloat16));
  NonTensorBatch c;
  c.insert_or_assign("uid", Column::strings({"a", "bb", "", "d"}));
  c.insert_or_assign("n", Column::int64s({1, -2, 3, 4}));
  c.insert_or_assign("f", Column::doubles({0.5, 1.5, -2.5, 3.0}));
  c.insert_or_assign("j", Column::jsons({json{{"k", 1}}, json::array({1, 2}), nullptr, "s"}));
  DataProto full = must(DataProto::from_dict(t, c, json{{"temperature", 0.7}, {"metrics", {{"a", {1, 2}}}}}));
  write_seed(dir, "full", full);
  EncodeOptions split;
  split.max_piece_bytes = 64;
  write_seed(dir, "split", must(DataProto::from_dict({{"y", torch::arange(64, torch::kInt)}})), split);
  write_seed(dir, "empty", DataProto());
  write_seed(dir, "columns_only", must(DataProto::from_dict({}, c)));
  write_seed(dir, "folded", must(full.fold_batch_dim(2)));
}

void touch(const DataProto& d) {
  volatile uint8_t sink = 0;
  for (const auto& kv : d.batch()) {
    const auto* p = static_cast<const uint8_t*>(kv.second.data_ptr());
    for (int64_t i = 0; i < kv.second.nbytes(); ++i) sink = sink ^ p[i];
  }
  for (const auto& kv : d.non_tensor_batch()) {
    (void)kv.second.to_json().dump(-1, ' ', false, json::error_handler_t::replace);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("TESSERA_FUZZ_WRITE_SEEDS")) {
    write_seeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto decoded = tessera::proto::decode_copy(data, size);
  if (!decoded.ok()) return 0;
  touch(*decoded);
  if (!decoded->check_consistency().ok()) std::abort();
  auto again = tessera::proto::encode(*decoded);
  if (!again.ok()) return 0;  // e.g. a JSON string that is not UTF-8 cannot be re-encoded
  auto flat = again->flatten();
  if (!flat.ok() || !tessera::proto::decode(std::move(flat).value()).ok()) std::abort();
  return 0;
}
