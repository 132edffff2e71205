// codec_encode.cpp: DataProto -> frame, as a scatter/gather list (no tensor bytes copied).
//
// Note [Wire format]
// A frame is laid out as follows (all integers little-endian):
//
//   offset 0   prefix, 32 bytes: magic "TSRPROTO" (8), version u32 (= 1), flags u32 (= 0),
//              header_bytes u64, data_bytes u64
//   offset 32  Cap'n Proto header: one message in standard flat form (segment table + segments),
//              exactly header_bytes long (a multiple of 8), schema proto/wire.capnp `Header`:
//              numRows; per tensor: name, dtype, shape, pieces [(offset, length)]; per column:
//              name, rows, width, values (List(Data) / List(Int64) / List(Float64) / List(Text)
//              of JSON documents); metaJson (meta_info as JSON text)
//   zero padding up to D = align64(32 + header_bytes)
//   offset D   data region, data_bytes long: the tensors' C-contiguous bytes. Piece offsets are
//              relative to D and multiples of 64, so on a 64-aligned buffer every tensor is
//              64-aligned. Tensors follow each other in header order, each starting on the next
//              64-byte boundary (zero padding between); the frame ends at D + data_bytes.
//
// Why our own framing rather than tensor bytes in Cap'n Proto `Data` fields: capnp aligns Data
// to 8 bytes only, `referenceExternalData` needs 8-aligned external memory whose length it rounds
// up to whole words (an over-read of tensors whose size is not a multiple of 8), and a Data
// field is limited to 2^29 - 1 bytes. The header is still Cap'n Proto; only the bulk bytes sit
// outside it, listed by (offset, length).
//
// Pieces: a tensor larger than EncodeOptions::max_piece_bytes (default 512 MiB - 64, the largest
// multiple of 64 under capnp's Data limit) is listed as several pieces of at most that size. The
// pieces of one tensor are adjacent, so the decoder still makes one zero-copy view; a transport
// writes each piece as one iovec, which keeps every write far under Linux's ~2 GiB per-call cap.
// A decoder accepts non-adjacent pieces too (it then copies that tensor into one allocation).
//
// Encoding copies no tensor bytes: the EncodedFrame lists segments [prefix + header + padding],
// then per piece a pointer into the (contiguous) tensor, with 64-byte zero segments between
// tensors. Non-contiguous tensors are made contiguous first (the only copy). flatten_into() then
// writes the frame in one pass over the bytes.
#include <algorithm>
#include <cstring>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>
#include <kj/io.h>
#include <torch/torch.h>

#include "proto/codec.hpp"
#include "proto/internal/tensor_ops.hpp"
#include "proto/internal/wire.hpp"

namespace tessera::proto {
namespace {

using json = nlohmann::json;

alignas(64) const uint8_t kZeros[internal::kPieceAlignment] = {};

/// Where one tensor's bytes go in the data region.
struct TensorPlan {
  std::string key;
  at::Tensor tensor;  // contiguous
  internal::DTypeInfo dtype;
  uint64_t start = 0;  // data-relative offset of the first piece
  uint64_t nbytes = 0;
};

Result<std::string> dump_json(const json& value, const std::string& what) {
  try {
    return value.dump();
  } catch (const json::exception& e) {
    return make_error(ErrorCode::invalid_argument, "encode: {} cannot be serialised: {}", what, e.what());
  }
}

template <class Fn>
void for_each_element(const Column& c, Fn&& fn) {
  uint32_t i = 0;
  for (int64_t r = 0; r < c.size(); ++r) {
    for (int64_t j = 0; j < c.width(); ++j) fn(i++, r, j);
  }
}

/// Keys travel as Cap'n Proto Text, which cannot hold NUL bytes.
Status check_key(const std::string& key, const char* kind) {
  if (key.find('\0') == std::string::npos) return Status();
  return make_error(ErrorCode::invalid_argument, "encode: {} key '{}' contains a NUL byte", kind,
                    key.substr(0, key.find('\0')));
}

Status fill_column(wire::ColumnEntry::Builder e, const std::string& key, const Column& c) {
  TESSERA_RETURN_IF_ERROR(check_key(key, "non_tensor_batch"));
  e.setName(key);
  e.setRows(c.size());
  e.setWidth(c.width());
  const auto n = static_cast<uint32_t>(c.size() * c.width());
  auto values = e.initValues();
  switch (c.type()) {
    case ColumnType::string: {
      auto list = values.initStrings(n);
      for_each_element(c, [&](uint32_t i, int64_t r, int64_t j) {
        const std::string& s = c.str(r, j);
        list.set(i, capnp::Data::Reader(reinterpret_cast<const kj::byte*>(s.data()), s.size()));
      });
      return Status();
    }
    case ColumnType::int64: {
      auto list = values.initInt64s(n);
      for_each_element(c, [&](uint32_t i, int64_t r, int64_t j) { list.set(i, c.i64(r, j)); });
      return Status();
    }
    case ColumnType::float64: {
      auto list = values.initFloat64s(n);
      for_each_element(c, [&](uint32_t i, int64_t r, int64_t j) { list.set(i, c.f64(r, j)); });
      return Status();
    }
    case ColumnType::json: {
      auto list = values.initJsons(n);
      Status st;
      for_each_element(c, [&](uint32_t i, int64_t r, int64_t j) {
        if (!st.ok()) return;
        auto text = dump_json(c.json_value(r, j), "column '" + key + "' row " + std::to_string(r));
        if (!text.ok()) {
          st = text.status();
          return;
        }
        list.set(i, capnp::Text::Reader(text->data(), text->size()));
      });
      return st;
    }
  }
  return make_error(ErrorCode::internal, "encode: column '{}' has an unknown type", key);
}

}  // namespace

/// Builds one EncodedFrame (friend of EncodedFrame).
class FrameBuilder {
 public:
  explicit FrameBuilder(const EncodeOptions& options)
      : max_piece_(std::max<uint64_t>(options.max_piece_bytes / internal::kPieceAlignment,
                                      1) * internal::kPieceAlignment) {}

  Result<EncodedFrame> build(const DataProto& data) {
    TESSERA_RETURN_IF_ERROR(plan_tensors(data));
    capnp::MallocMessageBuilder message;
    auto header = message.initRoot<wire::Header>();
    header.setNumRows(data.size());
    fill_tensors(header);
    auto columns = header.initColumns(static_cast<unsigned>(data.non_tensor_batch().size()));
    unsigned ci = 0;
    for (const auto& [key, c] : data.non_tensor_batch()) {
      TESSERA_RETURN_IF_ERROR(fill_column(columns[ci++], key, c));
    }
    TESSERA_ASSIGN_OR_RETURN(std::string meta, dump_json(data.meta_info(), "meta_info"));
    header.setMetaJson(capnp::Text::Reader(meta.data(), meta.size()));
    write_header(message);
    add_segments();
    return std::move(frame_);
  }

 private:
  Status plan_tensors(const DataProto& data) {
    uint64_t pos = 0;
    for (const auto& [key, t] : data.batch()) {
      TESSERA_RETURN_IF_ERROR(check_key(key, "batch"));
      if (!t.device().is_cpu()) {
        return make_error(ErrorCode::invalid_argument,
                          "encode: tensor '{}' is on {}; move it to CPU first", key, t.device().str());
      }
      auto dtype = internal::dtype_from_torch(t.scalar_type());
      if (!dtype) {
        return make_error(ErrorCode::invalid_argument, "encode: tensor '{}' has unsupported dtype {}",
                          key, c10::toString(t.scalar_type()));
      }
      TensorPlan p{key, t.contiguous(), *dtype};
      p.nbytes = static_cast<uint64_t>(p.tensor.numel()) * dtype->itemsize;
      p.start = internal::align_up(pos, internal::kPieceAlignment);
      if (p.nbytes > 0) pos = p.start + p.nbytes;
      plans_.push_back(std::move(p));
    }
    data_bytes_ = pos;
    return Status();
  }

  void fill_tensors(wire::Header::Builder header) {
    auto tensors = header.initTensors(static_cast<unsigned>(plans_.size()));
    for (size_t i = 0; i < plans_.size(); ++i) {
      const TensorPlan& p = plans_[i];
      auto e = tensors[static_cast<unsigned>(i)];
      e.setName(p.key);
      e.setDtype(p.dtype.wire);
      auto shape = e.initShape(static_cast<unsigned>(p.tensor.dim()));
      for (int64_t d = 0; d < p.tensor.dim(); ++d) shape.set(static_cast<unsigned>(d), p.tensor.size(d));
      const uint64_t count = (p.nbytes + max_piece_ - 1) / max_piece_;
      auto pieces = e.initPieces(static_cast<unsigned>(count));
      for (uint64_t k = 0; k < count; ++k) {
        pieces[static_cast<unsigned>(k)].setOffset(p.start + k * max_piece_);
        pieces[static_cast<unsigned>(k)].setLength(std::min(max_piece_, p.nbytes - k * max_piece_));
      }
    }
  }

  void write_header(capnp::MallocMessageBuilder& message) {
    const uint64_t header_bytes = capnp::computeSerializedSizeInWords(message) * sizeof(capnp::word);
    const uint64_t data_offset = internal::align_up(kFramePrefixBytes + header_bytes, internal::kPieceAlignment);
    auto bytes = std::make_shared<std::vector<uint8_t>>(data_offset, 0);
    internal::FramePrefix prefix{};
    std::memcpy(prefix.magic, internal::kFrameMagic, sizeof(prefix.magic));
    prefix.version = internal::kFrameVersion;
    prefix.header_bytes = header_bytes;
    prefix.data_bytes = data_bytes_;
    std::memcpy(bytes->data(), &prefix, sizeof(prefix));
    kj::ArrayOutputStream out(kj::arrayPtr(bytes->data() + kFramePrefixBytes, header_bytes));
    capnp::writeMessage(out, message);
    frame_.header_ = std::move(bytes);
  }

  void add_segments() {
    auto& segs = frame_.segments_;
    segs.push_back({frame_.header_->data(), frame_.header_->size()});
    uint64_t pos = 0;
    for (const TensorPlan& p : plans_) {
      if (p.nbytes == 0) continue;
      if (p.start > pos) segs.push_back({kZeros, static_cast<size_t>(p.start - pos)});
      const auto* base = static_cast<const uint8_t*>(p.tensor.data_ptr());
      for (uint64_t off = 0; off < p.nbytes; off += max_piece_) {
        segs.push_back({base + off, static_cast<size_t>(std::min(max_piece_, p.nbytes - off))});
      }
      pos = p.start + p.nbytes;
      frame_.tensors_.push_back(p.tensor);
    }
    frame_.size_ = frame_.header_->size() + data_bytes_;
  }

  uint64_t max_piece_;
  uint64_t data_bytes_ = 0;
  std::vector<TensorPlan> plans_;
  EncodedFrame frame_;
};

Result<EncodedFrame> encode(const DataProto& data, const EncodeOptions& options) {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the frame prefix is little-endian");
  TESSERA_RETURN_IF_ERROR(data.check_consistency().with_context("encode"));
  try {
    return internal::guard("encode", [&]() -> Result<EncodedFrame> {
      return FrameBuilder(options).build(data);
    });
  } catch (const kj::Exception& e) {
    std::string msg = e.getDescription().cStr();
    std::replace_if(msg.begin(), msg.end(), [](char ch) { return ch == '\n' || ch == '\r'; }, ' ');
    return make_error(ErrorCode::invalid_argument, "encode: {}", msg);
  }
}

void EncodedFrame::flatten_into(uint8_t* dst) const {
  for (const FrameSegment& s : segments_) {
    std::memcpy(dst, s.data, s.size);
    dst += s.size;
  }
}

Result<std::shared_ptr<Buffer>> EncodedFrame::flatten() const {
  TESSERA_ASSIGN_OR_RETURN(auto buf, Buffer::allocate(size_));
  flatten_into(buf->data());
  return buf;
}

bool is_wire_dtype(c10::ScalarType dtype) { return internal::dtype_from_torch(dtype).has_value(); }

}  // namespace tessera::proto
