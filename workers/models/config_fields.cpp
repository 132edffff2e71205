// config_fields.cpp: the small config.json readers (internal/config_fields.hpp).
#include "workers/models/internal/config_fields.hpp"

namespace tessera::models::internal {

using nlohmann::json;

Status field_error(const std::string& source, const std::string& field, const std::string& what) {
  return make_error(ErrorCode::invalid_argument, "{}: field '{}' {}", source, field, what);
}

Result<int64_t> get_int(const json& j, const std::string& source, const char* field) {
  if (!j.contains(field)) return field_error(source, field, "is missing");
  const json& v = j.at(field);
  if (!v.is_number_integer()) return field_error(source, field, "must be an integer, got " + v.dump());
  return v.get<int64_t>();
}

Status read_int(const json& j, const std::string& source, const char* field, int64_t& out) {
  if (!j.contains(field) || j.at(field).is_null()) return Status();
  TESSERA_ASSIGN_OR_RETURN(out, get_int(j, source, field));
  return Status();
}

Status read_double(const json& j, const std::string& source, const char* field, double& out) {
  if (!j.contains(field) || j.at(field).is_null()) return Status();
  const json& v = j.at(field);
  if (!v.is_number()) return field_error(source, field, "must be a number, got " + v.dump());
  out = v.get<double>();
  return Status();
}

Status read_bool(const json& j, const std::string& source, const char* field, bool& out) {
  if (!j.contains(field) || j.at(field).is_null()) return Status();
  const json& v = j.at(field);
  if (!v.is_boolean()) return field_error(source, field, "must be a boolean, got " + v.dump());
  out = v.get<bool>();
  return Status();
}

Status read_optional_id(const json& j, const std::string& source, const char* field,
                        std::optional<int64_t>& out) {
  if (!j.contains(field) || j.at(field).is_null()) return Status();
  TESSERA_ASSIGN_OR_RETURN(int64_t id, get_int(j, source, field));
  out = id;
  return Status();
}

Status read_eos(const json& j, const std::string& source, ModelConfig& c) {
  if (!j.contains("eos_token_id") || j.at("eos_token_id").is_null()) return Status();
  const json& v = j.at("eos_token_id");
  if (v.is_number_integer()) {
    c.eos_token_ids = {v.get<int64_t>()};
    return Status();
  }
  if (!v.is_array()) return field_error(source, "eos_token_id", "must be an integer or a list");
  c.eos_is_list = true;
  for (const json& e : v) {
    if (!e.is_number_integer()) return field_error(source, "eos_token_id", "must hold integers");
    c.eos_token_ids.push_back(e.get<int64_t>());
  }
  return Status();
}

Status require_false(const json& j, const std::string& source, const char* field, const char* why) {
  if (!j.contains(field) || j.at(field).is_null()) return Status();
  if (j.at(field) == false) return Status();
  return field_error(source, field, std::string("= ") + j.at(field).dump() + " is not supported (" + why + ")");
}

Status require_zero(const json& j, const std::string& source, const char* field) {
  if (!j.contains(field) || j.at(field).is_null()) return Status();
  if (j.at(field).is_number() && j.at(field).get<double>() == 0.0) return Status();
  return field_error(source, field, "= " + j.at(field).dump() +
                                        " is not supported (Tessera's decoder has no dropout)");
}

}  // namespace tessera::models::internal
