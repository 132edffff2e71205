// codec_decode.cpp: frame -> DataProto, zero-copy, hardened against untrusted bytes.
//
// Note [Decode limits]
// Everything in a frame is checked before it is used, with overflow-checked arithmetic:
//   * prefix: magic, version, flags == 0, header_bytes a multiple of 8 and <= max_header_bytes,
//     the frame exactly filling the buffer (no truncation, no trailing bytes).
//   * Cap'n Proto: the reader gets nestingLimit = 8 (the schema is 4 levels deep) and
//     traversalLimitInWords = 2 * header_words + 64. A well-formed header is visited once, so its
//     traversal is at most header_words; the bound scales with the real frame (a 64 MiB header
//     is fine, unlike capnp's fixed 64 MiB default) while still stopping amplification attacks
//     (many pointers to one object). kj::Exception from the reader becomes corrupt_data.
//   * tensors: known dtype, 1 <= ndim <= max_ndim, dims >= 0, dim 0 == numRows,
//     numel * itemsize without overflow and equal to the pieces' total; each piece 64-aligned
//     and inside the data region; no two pieces overlap. Only then is memory touched.
//   * columns: rows == numRows, width >= 1, rows * width == the value count, JSON values parse
//     with depth <= max_json_depth (the depth bound also protects recursive JSON code later).
//   * meta_info: a JSON object within the same depth bound.
// Tensors are from_blob views on the buffer; each view's deleter owns a shared_ptr<Buffer>, so
// the bytes live as long as any tensor does, independently of the caller's handle.
#include <algorithm>
#include <cstring>
#include <set>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>
#include <torch/torch.h>

#include "proto/codec.hpp"
#include "proto/internal/tensor_ops.hpp"
#include "proto/internal/wire.hpp"

namespace tessera::proto {
namespace {

using json = nlohmann::json;

/// A corrupt_data Status; control characters (kj's multi-line descriptions, bytes echoed from
/// the frame) become spaces and the message is capped, so errors stay one line.
Status corrupt(std::string message) {
  constexpr size_t kMaxMessage = 400;
  if (message.size() > kMaxMessage) message = message.substr(0, kMaxMessage) + "...";
  for (char& ch : message) {
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = ' ';
  }
  return Status(ErrorCode::corrupt_data, "decode: " + std::move(message));
}

struct DepthExceeded {};

/// A tensor or column name; Cap'n Proto Text must not contain NUL bytes.
Result<std::string> read_name(capnp::Text::Reader text, const char* kind) {
  std::string name(text.begin(), text.size());
  if (name.find('\0') != std::string::npos) return corrupt(fmt::format("{} name contains a NUL byte", kind));
  return name;
}

Result<json> parse_json(capnp::Text::Reader text, int64_t max_depth, const std::string& what) {
  try {
    auto cb = [max_depth](int depth, json::parse_event_t, json&) {
      if (depth > max_depth) throw DepthExceeded{};
      return true;
    };
    return json::parse(text.begin(), text.end(), cb);
  } catch (const DepthExceeded&) {
    return corrupt(fmt::format("{} nests deeper than {}", what, max_depth));
  } catch (const json::exception& e) {
    return corrupt(fmt::format("{} is not valid JSON: {}", what, e.what()));
  }
}

/// A validated tensor entry whose bytes have not been touched yet.
struct TensorSpec {
  std::string name;
  internal::DTypeInfo dtype;
  std::vector<int64_t> shape;
  std::vector<std::pair<uint64_t, uint64_t>> pieces;  // (offset, length), data-relative
  uint64_t nbytes = 0;
};

class FrameDecoder {
 public:
  FrameDecoder(std::shared_ptr<Buffer> buffer, const FrameInfo& info, const DecodeOptions& options)
      : buffer_(std::move(buffer)), info_(info), options_(options) {}

  Result<DataProto> run() {
    const auto* words = reinterpret_cast<const capnp::word*>(buffer_->data() + kFramePrefixBytes);
    const size_t nwords = info_.header_bytes / sizeof(capnp::word);
    capnp::ReaderOptions ro;
    ro.traversalLimitInWords = 2 * nwords + 64;  // Note [Decode limits]
    ro.nestingLimit = 8;
    capnp::FlatArrayMessageReader reader(kj::arrayPtr(words, nwords), ro);
    if (reader.getEnd() != words + nwords) return corrupt("header has trailing bytes after the message");
    auto header = reader.getRoot<wire::Header>();
    rows_ = header.getNumRows();
    if (rows_ < 0) return corrupt(fmt::format("negative row count {}", rows_));
    std::vector<TensorSpec> specs;
    for (auto entry : header.getTensors()) {
      TESSERA_ASSIGN_OR_RETURN(TensorSpec spec, check_tensor(entry));
      specs.push_back(std::move(spec));
    }
    TESSERA_RETURN_IF_ERROR(check_overlaps(specs));
    TensorDict batch;
    for (const auto& spec : specs) batch.insert_or_assign(spec.name, make_tensor(spec));
    NonTensorBatch columns;
    for (auto entry : header.getColumns()) {
      TESSERA_ASSIGN_OR_RETURN(auto named, read_column(entry));
      if (columns.contains(named.first)) return corrupt(fmt::format("duplicate column '{}'", named.first));
      columns.insert_or_assign(named.first, std::move(named.second));
    }
    if (batch.empty() && columns.empty() && rows_ != 0) {
      return corrupt(fmt::format("{} rows declared but no tensors or columns", rows_));
    }
    TESSERA_ASSIGN_OR_RETURN(json meta, parse_json(header.getMetaJson(), options_.max_json_depth, "meta_info"));
    if (!meta.is_object()) return corrupt("meta_info is not a JSON object");
    return DataProtoAccess::make(std::move(batch), std::move(columns), std::move(meta));
  }

 private:
  Result<TensorSpec> check_tensor(wire::TensorEntry::Reader e) {
    TensorSpec s;
    TESSERA_ASSIGN_OR_RETURN(s.name, read_name(e.getName(), "tensor"));
    if (!names_.insert(s.name).second) return corrupt(fmt::format("duplicate tensor '{}'", s.name));
    auto dtype = internal::dtype_from_wire(static_cast<uint16_t>(e.getDtype()));
    if (!dtype) return corrupt(fmt::format("tensor '{}' has unknown dtype {}", s.name, static_cast<uint16_t>(e.getDtype())));
    s.dtype = *dtype;
    auto shape = e.getShape();
    if (shape.size() < 1 || shape.size() > static_cast<uint64_t>(options_.max_ndim)) {
      return corrupt(fmt::format("tensor '{}' has {} dims (allowed 1..{})", s.name, shape.size(), options_.max_ndim));
    }
    uint64_t numel = 1;
    for (int64_t d : shape) {
      if (d < 0) return corrupt(fmt::format("tensor '{}' has a negative dim {}", s.name, d));
      if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) {
        return corrupt(fmt::format("tensor '{}' has an absurd shape (element count overflows)", s.name));
      }
      s.shape.push_back(d);
    }
    if (s.shape[0] != rows_) {
      return corrupt(fmt::format("tensor '{}' has {} rows, header says {}", s.name, s.shape[0], rows_));
    }
    if (__builtin_mul_overflow(numel, s.dtype.itemsize, &s.nbytes)) {
      return corrupt(fmt::format("tensor '{}' byte size overflows", s.name));
    }
    uint64_t total = 0;
    for (auto piece : e.getPieces()) {
      const uint64_t off = piece.getOffset();
      const uint64_t len = piece.getLength();
      if (off % internal::kPieceAlignment != 0) {
        return corrupt(fmt::format("tensor '{}' piece offset {} is not 64-byte aligned", s.name, off));
      }
      if (len > info_.data_bytes || off > info_.data_bytes - len) {
        return corrupt(fmt::format("tensor '{}' piece [{}, +{}) is past the data end {}", s.name, off, len,
                                   info_.data_bytes));
      }
      total += len;  // cannot overflow: pieces are checked for overlap within data_bytes later
      if (total > info_.data_bytes) return corrupt(fmt::format("tensor '{}' pieces exceed the data region", s.name));
      s.pieces.emplace_back(off, len);
    }
    if (total != s.nbytes) {
      return corrupt(fmt::format("tensor '{}': shape needs {} bytes of {} but its pieces hold {}", s.name,
                                 s.nbytes, c10::toString(s.dtype.torch), total));
    }
    return s;
  }

  static Status check_overlaps(const std::vector<TensorSpec>& specs) {
    std::vector<std::tuple<uint64_t, uint64_t, const std::string*>> ranges;
    for (const auto& s : specs) {
      for (const auto& [off, len] : s.pieces) {
        if (len > 0) ranges.emplace_back(off, len, &s.name);
      }
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i) {
      const auto& [poff, plen, pname] = ranges[i - 1];
      const auto& [off, len, name] = ranges[i];
      if (off < poff + plen) {
        return corrupt(fmt::format("tensors '{}' and '{}' overlap in the data region", *pname, *name));
      }
    }
    return Status();
  }

  at::Tensor make_tensor(const TensorSpec& s) {
    auto options = at::TensorOptions().dtype(s.dtype.torch);
    if (s.nbytes == 0) return at::empty(s.shape, options);
    uint8_t* data = buffer_->data() + info_.data_offset;
    bool adjacent = true;
    for (size_t k = 1; k < s.pieces.size(); ++k) {
      adjacent = adjacent && s.pieces[k].first == s.pieces[k - 1].first + s.pieces[k - 1].second;
    }
    if (adjacent) {
      std::shared_ptr<Buffer> keep = buffer_;
      return at::from_blob(data + s.pieces[0].first, s.shape, [keep](void*) {}, options);
    }
    at::Tensor t = at::empty(s.shape, options);
    auto* dst = static_cast<uint8_t*>(t.data_ptr());
    for (const auto& [off, len] : s.pieces) {
      std::memcpy(dst, data + off, len);
      dst += len;
    }
    return t;
  }

  Result<std::pair<std::string, Column>> read_column(wire::ColumnEntry::Reader e) {
    TESSERA_ASSIGN_OR_RETURN(std::string name, read_name(e.getName(), "column"));
    const int64_t rows = e.getRows();
    const int64_t width = e.getWidth();
    if (rows != rows_) return corrupt(fmt::format("column '{}' has {} rows, header says {}", name, rows, rows_));
    if (width < 1) return corrupt(fmt::format("column '{}' has width {}", name, width));
    uint64_t count = 0;
    if (__builtin_mul_overflow(static_cast<uint64_t>(rows), static_cast<uint64_t>(width), &count)) {
      return corrupt(fmt::format("column '{}' size overflows", name));
    }
    TESSERA_ASSIGN_OR_RETURN(Column::Values values, read_values(e.getValues(), name, count));
    auto column = Column::from_values(std::move(values), width);
    if (!column.ok()) return corrupt(fmt::format("column '{}': {}", name, column.status().message()));
    return std::make_pair(std::move(name), std::move(column).value());
  }

  Result<Column::Values> read_values(wire::ColumnEntry::Values::Reader v, const std::string& name,
                                     uint64_t count) {
    auto check = [&](uint64_t n) -> Status {
      if (n == count) return Status();
      return corrupt(fmt::format("column '{}' holds {} values, rows * width = {}", name, n, count));
    };
    switch (v.which()) {
      case wire::ColumnEntry::Values::STRINGS: {
        auto list = v.getStrings();
        TESSERA_RETURN_IF_ERROR(check(list.size()));
        std::vector<std::string> out;
        out.reserve(list.size());
        for (auto d : list) out.emplace_back(reinterpret_cast<const char*>(d.begin()), d.size());
        return Column::Values(std::move(out));
      }
      case wire::ColumnEntry::Values::INT64S: {
        auto list = v.getInt64s();
        TESSERA_RETURN_IF_ERROR(check(list.size()));
        std::vector<int64_t> out;
        out.reserve(list.size());
        for (int64_t x : list) out.push_back(x);
        return Column::Values(std::move(out));
      }
      case wire::ColumnEntry::Values::FLOAT64S: {
        auto list = v.getFloat64s();
        TESSERA_RETURN_IF_ERROR(check(list.size()));
        std::vector<double> out;
        out.reserve(list.size());
        for (double x : list) out.push_back(x);
        return Column::Values(std::move(out));
      }
      case wire::ColumnEntry::Values::JSONS: {
        auto list = v.getJsons();
        TESSERA_RETURN_IF_ERROR(check(list.size()));
        std::vector<json> out;
        out.reserve(list.size());
        for (auto t : list) {
          TESSERA_ASSIGN_OR_RETURN(json j, parse_json(t, options_.max_json_depth, "column '" + name + "' value"));
          out.push_back(std::move(j));
        }
        return Column::Values(std::move(out));
      }
    }
    return corrupt(fmt::format("column '{}' has an unknown value kind {}", name, static_cast<int>(v.which())));
  }

  std::shared_ptr<Buffer> buffer_;
  FrameInfo info_;
  DecodeOptions options_;
  int64_t rows_ = 0;
  std::set<std::string> names_;
};

}  // namespace

Result<FrameInfo> peek_frame(const uint8_t* data, size_t size) {
  if (data == nullptr || size < kFramePrefixBytes) {
    return corrupt(fmt::format("truncated frame: {} bytes, the prefix alone is {}", size, kFramePrefixBytes));
  }
  internal::FramePrefix p;
  std::memcpy(&p, data, sizeof(p));
  if (std::memcmp(p.magic, internal::kFrameMagic, sizeof(p.magic)) != 0) return corrupt("bad magic (not a DataProto frame)");
  if (p.version != internal::kFrameVersion) {
    return corrupt(fmt::format("unsupported frame version {} (this build reads {})", p.version, internal::kFrameVersion));
  }
  if (p.flags != 0) return corrupt(fmt::format("unknown frame flags {:#x}", p.flags));
  if (p.header_bytes % 8 != 0 || p.header_bytes < 16) {
    return corrupt(fmt::format("header length {} is not a positive multiple of 8", p.header_bytes));
  }
  if (p.header_bytes > (uint64_t{1} << 40)) return corrupt(fmt::format("absurd header length {}", p.header_bytes));
  FrameInfo info{};
  info.header_bytes = p.header_bytes;
  info.data_offset = internal::align_up(kFramePrefixBytes + p.header_bytes, internal::kPieceAlignment);
  info.data_bytes = p.data_bytes;
  if (__builtin_add_overflow(info.data_offset, info.data_bytes, &info.frame_bytes)) {
    return corrupt(fmt::format("absurd data length {}", p.data_bytes));
  }
  return info;
}

Result<DataProto> decode(std::shared_ptr<Buffer> buffer, const DecodeOptions& options) {
  if (!buffer) return corrupt("null buffer");
  TESSERA_ASSIGN_OR_RETURN(FrameInfo info, peek_frame(buffer->data(), buffer->size()));
  if (info.header_bytes > options.max_header_bytes) {
    return corrupt(fmt::format("header of {} bytes exceeds the limit {}", info.header_bytes, options.max_header_bytes));
  }
  if (info.frame_bytes != buffer->size()) {
    return corrupt(fmt::format("frame announces {} bytes but the buffer holds {} ({})", info.frame_bytes,
                               buffer->size(), info.frame_bytes > buffer->size() ? "truncated" : "trailing bytes"));
  }
  if (reinterpret_cast<uintptr_t>(buffer->data()) % sizeof(capnp::word) != 0) {
    return corrupt("buffer is not 8-byte aligned (use decode_copy)");
  }
  try {
    FrameDecoder decoder(std::move(buffer), info, options);
    return decoder.run();
  } catch (const kj::Exception& e) {
    return corrupt(fmt::format("corrupt header: {}", e.getDescription().cStr()));
  } catch (const c10::Error& e) {
    return corrupt(fmt::format("tensor construction failed: {}", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return corrupt(fmt::format("corrupt frame: {}", e.what()));
  }
}

Result<DataProto> decode_copy(const void* data, size_t size, const DecodeOptions& options) {
  if (data == nullptr && size > 0) return corrupt("null data");
  TESSERA_ASSIGN_OR_RETURN(auto buffer, Buffer::copy_of(data, size));
  return decode(std::move(buffer), options);
}

}  // namespace tessera::proto
