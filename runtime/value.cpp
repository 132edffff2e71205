#include "runtime/value.hpp"

namespace tessera::runtime {

Result<proto::DataProto> Value::as_proto(const std::string& what) const {
  if (is_proto()) return proto();
  return make_error(ErrorCode::invalid_argument, "{}: expected a DataProto, got {}", what,
                    kind_name());
}

Result<nlohmann::json> Value::as_json(const std::string& what) const {
  if (is_json()) return json();
  return make_error(ErrorCode::invalid_argument, "{}: expected JSON, got {}", what, kind_name());
}

const char* Value::kind_name() const {
  if (is_json()) return "json";
  if (is_proto()) return "DataProto";
  return "list";
}

}  // namespace tessera::runtime
