#include "dispatch/value.hpp"

namespace tessera::dispatch {

Value make_future(const FutureRef& f) {
  return Value(nlohmann::json{{kFutureKey,
                               {{"id", f.id},
                                {"producer", f.producer},
                                {"consumer_rank", f.consumer_rank},
                                {"consumer_world", f.consumer_world},
                                {"auto_padding", f.auto_padding}}}});
}

bool is_future(const Value& v) {
  return v.is_json() && v.json().is_object() && v.json().size() == 1 && v.json().contains(kFutureKey);
}

Result<FutureRef> future_of(const Value& v) {
  if (!is_future(v)) return make_error(ErrorCode::invalid_argument, "expected a future, got {}", kind(v));
  const auto& j = v.json()[kFutureKey];
  try {
    FutureRef f;
    f.id = j.at("id").get<uint64_t>();
    f.producer = j.at("producer").get<std::string>();
    f.consumer_rank = j.at("consumer_rank").get<int32_t>();
    f.consumer_world = j.at("consumer_world").get<int32_t>();
    f.auto_padding = j.at("auto_padding").get<bool>();
    return f;
  } catch (const std::exception& e) {
    return make_error(ErrorCode::invalid_argument, "malformed future reference: {}", e.what());
  }
}

const char* kind(const Value& v) { return is_future(v) ? "future" : v.kind_name(); }

int64_t list_length(const Value& v) {
  if (v.is_list()) return static_cast<int64_t>(v.list().size());
  if (v.is_json() && v.json().is_array()) return static_cast<int64_t>(v.json().size());
  return -1;
}

Value element(const Value& v, int64_t i) {
  if (v.is_list()) return v.list().at(static_cast<size_t>(i));
  return Value(v.json().at(static_cast<size_t>(i)));
}

}  // namespace tessera::dispatch
