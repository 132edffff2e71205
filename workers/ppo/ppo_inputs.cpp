// ppo_inputs.cpp: config / meta_info readers and PPO batch checks (see ppo_inputs.hpp).
#include "workers/ppo/ppo_inputs.hpp"

#include <algorithm>
#include <utility>

#include <c10/util/Exception.h>

#include "proto/device.hpp"

namespace tessera::ppo {

// ---- Config parsing -----------------------------------------------------------------------------

namespace {
const nlohmann::json& null_json() {
  static const nlohmann::json kNull;
  return kNull;
}
}  // namespace

ConfigReader::ConfigReader(const nlohmann::json& json, std::string path) : json_(json), path_(std::move(path)) {
  if (!json_.is_null() && !json_.is_object()) {
    first_error_ = make_error(ErrorCode::invalid_argument, "{}: expected a mapping, got {}", path_, json_.dump());
  }
}

std::string ConfigReader::key_path(const char* key) const { return path_.empty() ? key : path_ + "." + key; }

const nlohmann::json* ConfigReader::find(const char* key) {
  known_.emplace_back(key);
  if (!json_.is_object()) return nullptr;
  auto it = json_.find(key);
  return it == json_.end() ? nullptr : &*it;
}

void ConfigReader::fail(Status status) {
  if (first_error_.ok() && !status.ok()) first_error_ = std::move(status);
}

template <class T>
void ConfigReader::read_value(const char* key, T& out, const char* type_name,
                              bool (nlohmann::json::*is)() const noexcept) {
  const nlohmann::json* v = find(key);
  if (v == nullptr) return;
  if (!((*v).*is)()) {
    fail(make_error(ErrorCode::invalid_argument, "{}: expected {}, got {}", key_path(key), type_name, v->dump()));
    return;
  }
  out = v->get<T>();
}

void ConfigReader::field(const char* key, int64_t& out) {
  read_value(key, out, "an integer", &nlohmann::json::is_number_integer);
}
void ConfigReader::field(const char* key, double& out) {
  read_value(key, out, "a number", &nlohmann::json::is_number);
}
void ConfigReader::field(const char* key, bool& out) {
  read_value(key, out, "a bool", &nlohmann::json::is_boolean);
}
void ConfigReader::field(const char* key, std::string& out) {
  read_value(key, out, "a string", &nlohmann::json::is_string);
}

void ConfigReader::field(const char* key, std::optional<int64_t>& out) {
  const nlohmann::json* v = find(key);
  if (v == nullptr) return;
  if (v->is_null()) {
    out.reset();
    return;
  }
  int64_t x = 0;
  known_.pop_back();  // read_value records the key again
  read_value(key, x, "an integer or null", &nlohmann::json::is_number_integer);
  if (v->is_number_integer()) out = x;
}

void ConfigReader::field(const char* key, std::optional<double>& out) {
  const nlohmann::json* v = find(key);
  if (v == nullptr) return;
  if (v->is_null()) {
    out.reset();
    return;
  }
  double x = 0;
  known_.pop_back();
  read_value(key, x, "a number or null", &nlohmann::json::is_number);
  if (v->is_number()) out = x;
}

const nlohmann::json& ConfigReader::nested(const char* key) {
  const nlohmann::json* v = find(key);
  return v == nullptr ? null_json() : *v;
}

void ConfigReader::skip(const char* key) { known_.emplace_back(key); }

Status ConfigReader::finish() const {
  if (!first_error_.ok()) return first_error_;
  if (!json_.is_object()) return Status();
  for (const auto& item : json_.items()) {
    if (std::find(known_.begin(), known_.end(), item.key()) == known_.end()) {
      return make_error(ErrorCode::invalid_argument, "{}: unknown key", key_path(item.key().c_str()));
    }
  }
  return Status();
}

std::string config_key(const std::string& path, const char* key) {
  return path.empty() ? std::string(key) : path + "." + key;
}

Status check_one_of(const std::string& value, const std::vector<std::string>& allowed, const std::string& key) {
  if (std::find(allowed.begin(), allowed.end(), value) != allowed.end()) return Status();
  std::string list;
  for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
  return make_error(ErrorCode::invalid_argument, "{} = '{}' is not one of: {}", key, value, list);
}

Status check_positive(const std::string& key, int64_t value) {
  if (value >= 1) return Status();
  return make_error(ErrorCode::invalid_argument, "{} = {} must be >= 1", key, value);
}

// ---- Shared plumbing ----------------------------------------------------------------------------

Result<double> meta_number(const nlohmann::json& meta_info, const std::string& key) {
  if (!meta_info.is_object() || !meta_info.contains(key)) {
    return make_error(ErrorCode::not_found, "meta_info.{} is required", key);
  }
  const auto& v = meta_info[key];
  if (!v.is_number()) {
    return make_error(ErrorCode::invalid_argument, "meta_info.{}: expected a number, got {}", key, v.dump());
  }
  return v.get<double>();
}

Result<bool> meta_bool(const nlohmann::json& meta_info, const std::string& key) {
  if (!meta_info.is_object() || !meta_info.contains(key)) {
    return make_error(ErrorCode::not_found, "meta_info.{} is required", key);
  }
  const auto& v = meta_info[key];
  if (!v.is_boolean()) {
    return make_error(ErrorCode::invalid_argument, "meta_info.{}: expected a bool, got {}", key, v.dump());
  }
  return v.get<bool>();
}

Result<int64_t> meta_positive_int(const nlohmann::json& meta_info, const std::string& key) {
  if (!meta_info.is_object() || !meta_info.contains(key)) {
    return make_error(ErrorCode::not_found, "meta_info.{} is required", key);
  }
  const auto& v = meta_info[key];
  if (!v.is_number_integer() || v.get<int64_t>() < 1) {
    return make_error(ErrorCode::invalid_argument, "meta_info.{}: expected a positive integer, got {}",
                      key, v.dump());
  }
  return v.get<int64_t>();
}

// ---- Batch tensors ------------------------------------------------------------------------------

namespace {

std::string shape_of(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) s += (d ? ", " : "") + std::to_string(t.size(d));
  return s + "]";
}

Result<at::Tensor> read_2d(const proto::DataProto& data, const std::string& key, int64_t rows, bool integral) {
  TESSERA_ASSIGN_OR_RETURN(at::Tensor t, data.tensor(key));
  if (t.dim() != 2 || t.size(0) != rows) {
    return make_error(ErrorCode::invalid_argument, "batch['{}']: expected [{}, L], got {}", key, rows, shape_of(t));
  }
  if (integral && c10::isFloatingType(t.scalar_type())) {
    return make_error(ErrorCode::invalid_argument, "batch['{}']: expected an integer dtype, got {}", key,
                      c10::toString(t.scalar_type()));
  }
  return t;
}

}  // namespace

Result<SequenceBatch> read_sequence_batch(const proto::DataProto& data) {
  SequenceBatch s;
  const int64_t rows = data.size();
  TESSERA_ASSIGN_OR_RETURN(s.input_ids, read_2d(data, "input_ids", rows, /*integral=*/true));
  TESSERA_ASSIGN_OR_RETURN(s.attention_mask, read_2d(data, "attention_mask", rows, /*integral=*/false));
  TESSERA_ASSIGN_OR_RETURN(s.position_ids, read_2d(data, "position_ids", rows, /*integral=*/true));
  TESSERA_ASSIGN_OR_RETURN(s.responses, read_2d(data, "responses", rows, /*integral=*/true));
  const int64_t T = s.input_ids.size(1);
  for (const char* key : {"attention_mask", "position_ids"}) {
    const at::Tensor& t = std::string(key) == "attention_mask" ? s.attention_mask : s.position_ids;
    if (t.size(1) != T) {
      return make_error(ErrorCode::invalid_argument, "batch['{}'] {} does not match input_ids {}", key, shape_of(t),
                        shape_of(s.input_ids));
    }
  }
  s.response_length = s.responses.size(1);
  if (s.response_length < 1 || s.response_length >= T) {
    return make_error(ErrorCode::invalid_argument,
                      "batch['responses'] length {} must be in [1, {}) (input_ids is {})", s.response_length, T,
                      shape_of(s.input_ids));
  }
  return s;
}

Result<at::Tensor> read_response_tensor(const proto::DataProto& data, const std::string& key,
                                        const SequenceBatch& seq) {
  TESSERA_ASSIGN_OR_RETURN(at::Tensor t, read_2d(data, key, seq.input_ids.size(0), /*integral=*/false));
  if (t.size(1) != seq.response_length || !c10::isFloatingType(t.scalar_type())) {
    return make_error(ErrorCode::invalid_argument, "batch['{}']: expected floating [{}, {}], got {} {}", key,
                      seq.input_ids.size(0), seq.response_length, c10::toString(t.scalar_type()), shape_of(t));
  }
  return t;
}

Result<at::Tensor> read_response_mask(const proto::DataProto& data, const SequenceBatch& seq) {
  if (!data.batch().contains("response_mask")) {
    const int64_t T = seq.attention_mask.size(1);
    return seq.attention_mask.narrow(1, T - seq.response_length, seq.response_length);
  }
  TESSERA_ASSIGN_OR_RETURN(at::Tensor t, read_2d(data, "response_mask", seq.input_ids.size(0), /*integral=*/false));
  if (t.size(1) != seq.response_length) {
    return make_error(ErrorCode::invalid_argument, "batch['response_mask']: expected [{}, {}], got {}",
                      seq.input_ids.size(0), seq.response_length, shape_of(t));
  }
  return t;
}

Status check_text_only(const proto::DataProto& data) {
  if (data.non_tensor_batch().contains("multi_modal_inputs")) {
    return make_error(ErrorCode::unimplemented,
                      "non_tensor_batch['multi_modal_inputs']: multimodal inputs are not supported by this actor");
  }
  return Status();
}

}  // namespace tessera::ppo
