// value.hpp: runtime::Value, what worker methods take and return: JSON, a DataProto, or a
// list of Values (verl passes arbitrary Python objects; Tessera narrows them to these three).
//
// A Value is a value type: copies are shallow for DataProto tensors (they alias), deep for JSON.
// Thread-safety: like DataProto, not synchronised.
#pragma once

#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "proto/data_proto.hpp"

namespace tessera::runtime {

/// A method argument or result: JSON | DataProto | list of Values.
class Value {
 public:
  using List = std::vector<Value>;

  /// JSON null.
  Value() : v_(nlohmann::json()) {}
  Value(nlohmann::json json) : v_(std::move(json)) {}          // NOLINT: implicit by design
  Value(proto::DataProto data) : v_(std::move(data)) {}        // NOLINT: implicit by design
  Value(List items) : v_(std::move(items)) {}                   // NOLINT: implicit by design

  bool is_json() const { return std::holds_alternative<nlohmann::json>(v_); }
  bool is_proto() const { return std::holds_alternative<proto::DataProto>(v_); }
  bool is_list() const { return std::holds_alternative<List>(v_); }

  /// REQUIRES: is_json().
  const nlohmann::json& json() const { return std::get<nlohmann::json>(v_); }
  /// REQUIRES: is_proto().
  const proto::DataProto& proto() const { return std::get<proto::DataProto>(v_); }
  proto::DataProto& proto() { return std::get<proto::DataProto>(v_); }
  /// REQUIRES: is_list().
  const List& list() const { return std::get<List>(v_); }
  List& list() { return std::get<List>(v_); }

  /// The DataProto, or invalid_argument naming `what` (e.g. "argument 0 of 'compute_values'").
  Result<proto::DataProto> as_proto(const std::string& what) const;
  /// The JSON, or invalid_argument naming `what`.
  Result<nlohmann::json> as_json(const std::string& what) const;

  /// "json", "DataProto" or "list" (for error messages).
  const char* kind_name() const;

 private:
  std::variant<nlohmann::json, proto::DataProto, List> v_;
};

}  // namespace tessera::runtime
