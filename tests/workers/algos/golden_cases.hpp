// golden_cases.hpp: one handler per verl function named in shared/golden/core_algos.json. A handler
// reads a case's inputs (verl's argument names), runs tessera::algos, and reports the max abs
// difference of each output against verl's float64 result.
#pragma once

#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

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
  /// Fields never read (besides "fn").
  std::vector<std::string> unused() const;

 private:
  const nlohmann::json& c_;
  std::set<std::string> used_{"fn"};
};

using CaseHandler = Result<Diffs> (*)(CaseReader& reader);

/// verl function name -> handler.
const std::map<std::string, CaseHandler>& golden_handlers();

}  // namespace tessera::algos::testing
