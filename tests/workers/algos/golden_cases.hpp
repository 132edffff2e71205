// golden_cases.hpp: one handler per verl function named in shared/golden/core_algos.json. A handler
// reads a case's inputs (verl's argument names), runs tessera::algos, and reports the max abs
// difference of each output against verl's float64 result.
#pragma once

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "proto/status.hpp"

namespace tessera::algos::testing {

/// Output name -> max |tessera - verl| over its elements.
using Diffs = std::vector<std::pair<std::string, double>>;

/// Read access to one case that remembers which fields were used, so unknown fields fail loudly.
class CaseReader {
 public:
  explicit CaseReader(const nlohmann::json& c) : c_(c) {}
  bool has(const std::string& key) const { return c_.contains(key); }
  /// The field, or an error naming it.
  Result<nlohmann::json> get(const std::string& key);
  /// The field as a T (double, bool, std::string, a vector of them), or an error naming it.
  template <class T>
  Result<T> value(const std::string& key) {
    TESSERA_ASSIGN_OR_RETURN(nlohmann::json j, get(key));
    try {
      return j.get<T>();
    } catch (const std::exception& e) {
      return make_error(ErrorCode::invalid_argument, "case field '{}': {}", key, e.what());
    }
  }
  /// Fields never read (besides "fn").
  std::vector<std::string> unused() const;

 private:
  const nlohmann::json& c_;
  std::set<std::string> used_{"fn"};
};

using CaseHandler = Result<Diffs> (*)(CaseReader& reader);

/// Max |actual - expected| over the elements of output `key` (0 when empty); a shape mismatch is
/// an error, and NaN anywhere counts as infinite.
Result<double> max_abs_diff(const at::Tensor& actual, const at::Tensor& expected, const std::string& key);

/// verl function name -> handler.
const std::map<std::string, CaseHandler>& golden_handlers();

}  // namespace tessera::algos::testing
