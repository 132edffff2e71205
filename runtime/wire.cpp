// wire.cpp: Value <-> WireValue.
#include "runtime/wire.hpp"

#include <type_traits>

#include <fmt/format.h>

#include "proto/codec.hpp"

namespace tessera::runtime {
namespace {

// `owned`, when given, is `data` itself and may be moved from.
Result<WireValue> proto_to_wire(const proto::DataProto& data, proto::DataProto* owned,
                                DataPlane& dp, const EncodeOptions& options,
                                std::vector<PayloadHandle>* published) {
  WireValue w;
  if (options.in_process && !options.remote && options.consumers > 0) {
    w.kind = static_cast<uint8_t>(WireKind::proto_local);
    // A non-const DataProto behind the const pointer: its sole consumer may move it out
    // (decode, Note [In-process values]).
    w.local = owned != nullptr ? std::make_shared<proto::DataProto>(std::move(*owned))
                               : std::make_shared<proto::DataProto>(data);
    return w;
  }
  if (options.remote && options.inline_max_bytes > 0) {
    TESSERA_ASSIGN_OR_RETURN(proto::EncodedFrame frame, proto::encode(data));
    if (frame.size() <= options.inline_max_bytes) {
      w.kind = static_cast<uint8_t>(WireKind::proto_inline);
      w.frame.resize(frame.size());
      frame.flatten_into(reinterpret_cast<uint8_t*>(w.frame.data()));
      return w;
    }
  }
  PayloadHandle h = dp.publish(data, options.consumers);
  if (published != nullptr) published->push_back(h);
  w.kind = static_cast<uint8_t>(WireKind::proto_slices);
  w.slices.push_back(DataPlane::whole(h));
  return w;
}

// Fetched slices, consumed in the order from_wire walks the values.
struct Prefetched {
  std::vector<Result<proto::DataProto>> parts;
  size_t next = 0;
};

void collect_slices(const WireValue& w, std::vector<PayloadSlice>& out) {
  if (w.kind == static_cast<uint8_t>(WireKind::proto_slices)) {
    out.insert(out.end(), w.slices.begin(), w.slices.end());
  }
  for (const WireValue& item : w.items) collect_slices(item, out);
}

Result<Value> join_parts(std::vector<Result<proto::DataProto>> parts) {
  std::vector<proto::DataProto> pieces;
  pieces.reserve(parts.size());
  for (auto& p : parts) {
    if (!p.ok()) return p.status();
    pieces.push_back(std::move(p).value());
  }
  if (pieces.size() == 1) return Value(std::move(pieces[0]));
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto joined, proto::DataProto::concat(pieces));
  return Value(std::move(joined));
}

Result<Value> slices_from_wire(const WireValue& w, DataPlane& dp, bool consume,
                               Prefetched* pre) {
  if (w.slices.empty()) {
    return make_error(ErrorCode::corrupt_data, "a payload reference with no slices");
  }
  if (pre == nullptr) return join_parts(dp.fetch_all(w.slices, consume));
  if (pre->next + w.slices.size() > pre->parts.size()) {
    return make_error(ErrorCode::internal, "prefetched slices out of step");
  }
  std::vector<Result<proto::DataProto>> parts(
      std::make_move_iterator(pre->parts.begin() + pre->next),
      std::make_move_iterator(pre->parts.begin() + pre->next + w.slices.size()));
  pre->next += w.slices.size();
  return join_parts(std::move(parts));
}

Result<Value> decode(const WireValue& w, DataPlane& dp, bool consume, Prefetched* pre);

// Note [Chunks cut by the receiver]: the receiver's rows of a shared in-process DataProto, as a
// view. The whole stays shared (other ranks cut theirs from it), so it is never moved from.
Result<Value> local_rows(const WireValue& w) {
  const int64_t rows = w.local->size();
  if (w.local_begin < 0 || w.local_begin > w.local_end || w.local_end > rows) {
    return make_error(ErrorCode::corrupt_data, "an in-process row range [{}, {}) of a DataProto "
                      "of {} rows", w.local_begin, w.local_end, rows);
  }
  TESSERA_ASSIGN_OR_RETURN(proto::DataProto piece, w.local->slice(w.local_begin, w.local_end));
  return Value(std::move(piece));
}

Result<Value> decode_list(const WireValue& w, DataPlane& dp, bool consume, Prefetched* pre) {
  Value::List items;
  items.reserve(w.items.size());
  for (const WireValue& wi : w.items) {
    TESSERA_ASSIGN_OR_RETURN(Value v, decode(wi, dp, consume, pre));
    items.push_back(std::move(v));
  }
  return Value(std::move(items));
}

Result<Value> decode(const WireValue& w, DataPlane& dp, bool consume, Prefetched* pre) {
  switch (static_cast<WireKind>(w.kind)) {
    case WireKind::json: {
      nlohmann::json j = nlohmann::json::parse(w.json, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded()) return make_error(ErrorCode::corrupt_data, "malformed JSON value");
      return Value(std::move(j));
    }
    case WireKind::proto_inline: {
      TESSERA_ASSIGN_OR_RETURN(proto::DataProto d,
                               proto::decode_copy(w.frame.data(), w.frame.size()));
      return Value(std::move(d));
    }
    case WireKind::proto_slices:
      return slices_from_wire(w, dp, consume, pre);
    case WireKind::proto_local:
      if (!w.local) {
        return make_error(ErrorCode::corrupt_data, "an in-process payload reference arrived "
                          "from another process");
      }
      if (w.local_end >= 0) return local_rows(w);
      // The consuming receiver holding the only reference takes the DataProto itself (the
      // object was created non-const: proto_to_wire); otherwise, e.g. a sender still holding
      // its reference or a worker holding its reply (Note [Replies freed by their worker],
      // runtime/local_lane.hpp), it takes a copy (tensors by reference either way).
      if (consume && w.local.use_count() == 1) {
        return Value(std::move(const_cast<proto::DataProto&>(*w.local)));
      }
      return Value(proto::DataProto(*w.local));
    case WireKind::list:
      return decode_list(w, dp, consume, pre);
  }
  return make_error(ErrorCode::corrupt_data, "unknown wire value kind {}", w.kind);
}

}  // namespace

std::vector<PayloadHandle> payload_handles(const WireValue& wire) {
  std::vector<PayloadSlice> slices;
  collect_slices(wire, slices);
  std::vector<PayloadHandle> out;
  for (const PayloadSlice& s : slices) out.push_back(s.handle);
  return out;
}

WireValue local_rows_wire(std::shared_ptr<const proto::DataProto> whole, int64_t begin,
                          int64_t end) {
  WireValue w;
  w.kind = static_cast<uint8_t>(WireKind::proto_local);
  w.local = std::move(whole);
  w.local_begin = begin;
  w.local_end = end;
  return w;
}

WireValue json_wire(const nlohmann::json& json) {
  WireValue w;
  w.kind = static_cast<uint8_t>(WireKind::json);
  w.json = json.dump();
  return w;
}

namespace {

// to_wire of a const or a movable value (V is `const Value` or `Value`).
template <class V>
Result<WireValue> encode_value(V& value, DataPlane& dp, const EncodeOptions& options,
                               std::vector<PayloadHandle>* published) {
  if (value.is_json()) return json_wire(value.json());
  if (value.is_proto()) {
    proto::DataProto* owned = nullptr;
    if constexpr (!std::is_const_v<V>) owned = &value.proto();
    return proto_to_wire(value.proto(), owned, dp, options, published);
  }
  WireValue w;
  w.kind = static_cast<uint8_t>(WireKind::list);
  for (auto& item : value.list()) {
    TESSERA_ASSIGN_OR_RETURN(WireValue wi, encode_value(item, dp, options, published));
    w.items.push_back(std::move(wi));
  }
  return w;
}

}  // namespace

Result<WireValue> to_wire(const Value& value, DataPlane& dp, const EncodeOptions& options,
                          std::vector<PayloadHandle>* published) {
  return encode_value(value, dp, options, published);
}

Result<WireValue> to_wire(Value&& value, DataPlane& dp, const EncodeOptions& options,
                          std::vector<PayloadHandle>* published) {
  return encode_value(value, dp, options, published);
}

Result<Value> from_wire(const WireValue& w, DataPlane& dp, bool consume) {
  return decode(w, dp, consume, nullptr);
}

Result<std::vector<Value>> from_wire_many(const std::vector<WireValue>& wires, DataPlane& dp,
                                          bool consume) {
  std::vector<PayloadSlice> slices;
  for (const WireValue& w : wires) collect_slices(w, slices);
  Prefetched pre;
  if (!slices.empty()) pre.parts = dp.fetch_all(slices, consume);
  std::vector<Value> out;
  out.reserve(wires.size());
  for (size_t i = 0; i < wires.size(); ++i) {
    Result<Value> v = decode(wires[i], dp, consume, slices.empty() ? nullptr : &pre);
    if (!v.ok()) return v.status().with_context(fmt::format("value {}", i));
    out.push_back(std::move(v).value());
  }
  return out;
}

}  // namespace tessera::runtime
