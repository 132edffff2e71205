// TensorBoard event files (driver/tensorboard.hpp). The protobuf messages are encoded by hand:
// four fields of tensorflow.Event (wall_time = 1, step = 2, file_version = 3, summary = 5,
// session_log = 7), Summary.value = 1, Summary.Value {tag = 1, simple_value = 2, tensor = 8,
// metadata = 9}, SummaryMetadata.plugin_data = 1 {plugin_name = 1}, TensorProto {dtype = 1,
// tensor_shape = 2, string_val = 8}, TensorShapeProto.dim = 2 {size = 1} and SessionLog.status = 1
// (START = 1), in the protobuf wire format.
#include "driver/tensorboard.hpp"

#include <unistd.h>

#include <boost/crc.hpp>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace tessera::driver {
namespace {

void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void key(std::string& out, int field, int wire_type) { varint(out, (static_cast<uint64_t>(field) << 3) | wire_type); }

template <class T>
void fixed(std::string& out, T v) {  // little-endian, as protobuf's fixed32/fixed64
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));
  out.append(bytes, sizeof(T));
}

void bytes_field(std::string& out, int field, const std::string& bytes) {
  key(out, field, 2);
  varint(out, bytes.size());
  out += bytes;
}

// A double as Python's str() writes it: the shortest repr, with ".0" on integral values.
std::string python_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// An Event with wall_time and step, plus `rest` (already encoded fields).
std::string event(int64_t step, const std::string& rest) {
  std::string e;
  key(e, 1, 1);
  fixed(e, wall_time());
  key(e, 2, 0);
  varint(e, static_cast<uint64_t>(step));
  return e + rest;
}

}  // namespace

uint32_t tfrecord_masked_crc(const void* data, size_t n) {
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;  // CRC-32C
  crc.process_bytes(data, n);
  const uint32_t c = crc.checksum();
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::filesystem::path tensorboard_dir(const std::string& project_name, const std::string& experiment_name) {
  if (const char* env = std::getenv("TENSORBOARD_DIR"); env != nullptr && *env != '\0') return env;
  return std::filesystem::path("tensorboard_log") / project_name / experiment_name;
}

Result<std::unique_ptr<TensorBoardLogger>> TensorBoardLogger::open(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return make_error(ErrorCode::io_error, "tensorboard logger: cannot create {}: {}", dir.string(), ec.message());
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  static int counter = 0;
  const auto now = static_cast<int64_t>(wall_time());
  const std::filesystem::path path =
      dir / fmt::format("events.out.tfevents.{}.{}.{}.{}", now, host, ::getpid(), counter++);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return make_error(ErrorCode::io_error, "tensorboard logger: cannot create {}", path.string());
  std::unique_ptr<TensorBoardLogger> logger(new TensorBoardLogger(path, f));
  std::string version;
  bytes_field(version, 3, "brain.Event:2");
  TESSERA_RETURN_IF_ERROR(logger->write_event(event(0, version)));
  return logger;
}

TensorBoardLogger::~TensorBoardLogger() {
  if (file_ != nullptr) std::fclose(file_);
}

Status TensorBoardLogger::write_event(const std::string& e) {
  std::string record;
  fixed(record, static_cast<uint64_t>(e.size()));
  const uint32_t len_crc = tfrecord_masked_crc(record.data(), 8);
  fixed(record, len_crc);
  record += e;
  fixed(record, tfrecord_masked_crc(e.data(), e.size()));
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() || std::fflush(file_) != 0) {
    return make_error(ErrorCode::io_error, "tensorboard logger: write to {} failed", path_.string());
  }
  return Status();
}

Status TensorBoardLogger::log(const Metrics& metrics, int64_t step) {
  std::string summary;
  for (const auto& [tag, v] : metrics) {
    std::string value;
    bytes_field(value, 1, tag);
    key(value, 2, 5);
    fixed(value, static_cast<float>(v));
    bytes_field(summary, 1, value);
  }
  std::string rest;
  bytes_field(rest, 5, summary);
  return write_event(event(step, rest));
}

Status TensorBoardLogger::log_generations(const std::vector<GenerationSample>& samples, int64_t step) {
  // verl's log_generations_to_tensorboard: one markdown text, as SummaryWriter.add_text writes it
  // (tag + "/text_summary", the text plugin, a DT_STRING tensor of shape [1]).
  std::string text = fmt::format("**Generation Results - Step {}**\n\n", step);
  for (size_t i = 0; i < samples.size(); ++i) {
    text += fmt::format("### Sample {}\n**Input:** {}\n\n**Output:** {}\n\n**Score:** {}\n\n---\n\n", i + 1,
                        samples[i].input, samples[i].output, python_float(samples[i].score));
  }
  std::string plugin_data, metadata, dim, shape, tensor, value, summary, rest;
  bytes_field(plugin_data, 1, "text");
  bytes_field(metadata, 1, plugin_data);
  key(dim, 1, 0);
  varint(dim, 1);
  bytes_field(shape, 2, dim);
  key(tensor, 1, 0);
  varint(tensor, 7);  // DT_STRING
  bytes_field(tensor, 2, shape);
  bytes_field(tensor, 8, text);
  bytes_field(value, 1, "val/generations/text_summary");
  bytes_field(value, 8, tensor);
  bytes_field(value, 9, metadata);
  bytes_field(summary, 1, value);
  bytes_field(rest, 5, summary);
  return write_event(event(step, rest));
}

Status TensorBoardLogger::start_at(int64_t step) {
  if (step < 0) return Status();  // a fresh run: nothing to hide
  std::string session_log;
  key(session_log, 1, 0);
  varint(session_log, 1);  // SessionLog.START
  std::string rest;
  bytes_field(rest, 7, session_log);
  return write_event(event(step + 1, rest));
}

}  // namespace tessera::driver
