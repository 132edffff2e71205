// fuzz_call_frame: libFuzzer target for the call channel's frame parser (Note [Call channel],
// runtime/internal/call_frame.hpp) on untrusted bytes.
//
// The input is what a connection delivers: frames back to back. Each one is parsed as
// read_frame does on a socket: parse_frame_header (the expected kind is taken from the kind
// byte of the first frame, so one target covers both the agent's side, kind call, and the
// driver's, kind reply), then decode_frame_body on the body bytes; a truncated frame ends the
// stream. Properties checked on every input: parsing never crashes, hangs or over-reads (ASan)
// and never allocates far beyond the input (libFuzzer's -malloc_limit_mb); a decoded body
// re-encodes, that frame parses and decodes again, and re-encoding the result gives the same
// bytes (CAF's varbyte sizes may be non-minimal in the input, so the first encoding is the
// fixed point, not the input itself). Any violation aborts, which libFuzzer reports.
//
// Seeds: run with TESSERA_FUZZ_WRITE_SEEDS=<dir> to write a few valid frames there and exit
// (tests/fuzz/run_fuzz.sh does this before fuzzing).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include "runtime/internal/call_frame.hpp"
#include "runtime/messages.hpp"

namespace {

using tessera::runtime::AgentCallReply;
using tessera::runtime::CallRequest;
using tessera::runtime::PayloadSlice;
using tessera::runtime::WireKind;
using tessera::runtime::WireValue;
using tessera::runtime::internal::ChannelCall;
using tessera::runtime::internal::FrameKind;
using tessera::runtime::internal::kChannelHeaderBytes;
namespace internal = tessera::runtime::internal;

constexpr uint64_t kMaxBody = uint64_t{1} << 20;

// As runtime/actor_system.cpp configures every node: Tessera's type ids, no threads.
caf::actor_system& fuzz_system() {
  static caf::actor_system* sys = [] {
    auto* cfg = new caf::actor_system_config();
    cfg->add_message_types<caf::id_block::tessera>();
    cfg->set("scheduler.policy", caf::atom("testing"));
    cfg->set("logger.verbosity", caf::atom("quiet"));
    cfg->set("logger.console", caf::atom("none"));
    return new caf::actor_system(*cfg);  // never destroyed: no shutdown work per process
  }();
  return *sys;
}

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_call_frame: property violated: %s\n", what);
  std::abort();
}

WireValue json_value(std::string text) {
  WireValue v;
  v.json = std::move(text);
  return v;
}

std::vector<ChannelCall> seed_calls() {
  ChannelCall empty;
  ChannelCall two;
  two.workers = {7, uint64_t{1} << 40};
  CallRequest a;
  a.method = "generate_sequences";
  a.args.push_back(json_value(R"({"temperature":0.7,"n":4})"));
  WireValue inline_proto;
  inline_proto.kind = static_cast<uint8_t>(WireKind::proto_inline);
  inline_proto.frame = {'\x01', '\x02', '\0', '\xff'};
  a.args.push_back(inline_proto);
  CallRequest b;
  b.method = "compute_log_prob";
  b.result_mode = 1;
  WireValue slices;
  slices.kind = static_cast<uint8_t>(WireKind::proto_slices);
  PayloadSlice s;
  s.handle = {"10.0.0.2", 4711, "boot-id host", 99, 3, 0xfeedbeefULL, 4096, 16};
  s.row_begin = 4;
  s.row_end = 12;
  slices.slices = {s, s};
  WireValue list;
  list.kind = static_cast<uint8_t>(WireKind::list);
  list.items = {json_value("1"), slices};
  b.args = {list};
  two.requests = {a, b};
  return {empty, two};
}

std::vector<AgentCallReply> seed_replies() {
  AgentCallReply ok;
  ok.codes = {0, 3};
  ok.messages = {"", "worker rank 1: not found"};
  ok.results = {json_value(R"({"ok":true})"), WireValue{}};
  AgentCallReply empty;
  return {ok, empty};
}

void write_file(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

template <class T>
std::vector<char> must_encode(uint64_t id, const T& body) {
  auto frame = internal::encode_frame(fuzz_system(), id, body);
  if (!frame.ok()) fail("a seed does not encode");
  return std::move(frame).value();
}

void write_seeds(const std::string& dir) {
  std::vector<char> stream;
  int n = 0;
  for (const ChannelCall& c : seed_calls()) {
    std::vector<char> f = must_encode(uint64_t{41} + n, c);
    write_file(dir + "/call_" + std::to_string(n++), f);
    stream.insert(stream.end(), f.begin(), f.end());
  }
  write_file(dir + "/call_stream", stream);
  n = 0;
  for (const AgentCallReply& r : seed_replies()) {
    write_file(dir + "/reply_" + std::to_string(n), must_encode(uint64_t{7} + n, r));
    ++n;
  }
}

// The round-trip property for one decoded body of kind `kind`.
template <class T>
void check_round_trip(FrameKind kind, uint64_t id, const T& decoded) {
  caf::actor_system& sys = fuzz_system();
  auto first = internal::encode_frame(sys, id, decoded);
  if (!first.ok()) fail("a decoded body does not re-encode");
  auto header = internal::parse_frame_header(first->data(), kind, first->size());
  if (!header.ok() || header->id != id ||
      header->body_bytes != first->size() - kChannelHeaderBytes) {
    fail("a re-encoded frame's header does not parse back");
  }
  T again;
  if (!internal::decode_frame_body(sys, first->data() + kChannelHeaderBytes,
                                   first->size() - kChannelHeaderBytes, again)
           .ok()) {
    fail("a re-encoded body does not decode");
  }
  auto second = internal::encode_frame(sys, id, again);
  if (!second.ok() || *second != *first) fail("re-encoding is not stable");
}

template <class T>
bool parse_one(FrameKind kind, const char*& p, size_t& left) {
  if (left < kChannelHeaderBytes) return false;
  auto header = internal::parse_frame_header(p, kind, kMaxBody);
  if (!header.ok()) return false;
  if (header->body_bytes > left - kChannelHeaderBytes) return false;  // truncated frame
  T body;
  bool ok = internal::decode_frame_body(fuzz_system(), p + kChannelHeaderBytes,
                                        header->body_bytes, body)
                .ok();
  if (!ok) return false;  // read_frame closes the connection here
  check_round_trip(kind, header->id, body);
  p += kChannelHeaderBytes + header->body_bytes;
  left -= kChannelHeaderBytes + header->body_bytes;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz_system();
  if (const char* dir = std::getenv("TESSERA_FUZZ_WRITE_SEEDS")) {
    write_seeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* p = reinterpret_cast<const char*>(data);
  size_t left = size;
  if (left < kChannelHeaderBytes) return 0;
  bool call = static_cast<uint8_t>(p[4]) == static_cast<uint8_t>(FrameKind::call);
  while (call ? parse_one<ChannelCall>(FrameKind::call, p, left)
              : parse_one<AgentCallReply>(FrameKind::reply, p, left)) {
  }
  return 0;
}
