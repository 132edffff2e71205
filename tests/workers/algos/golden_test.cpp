// golden_test.cpp: every case of shared/golden/core_algos.json (verl v0.5.0's own core_algos in
// float64) reproduced by tessera::algos to within 1e-6, printed llm.c style (max |diff| per output).
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/workers/algos/golden_cases.hpp"

namespace tessera::algos::testing {
namespace {

constexpr double kTolerance = 1e-6;

// $TESSERA_GOLDEN_CORE_ALGOS, else $TESSERA_SHARED_DIR/golden/..., else $TESSERA_SOURCE_DIR/../shared
// (the build's default shared dir; ctest may pass only TESSERA_SOURCE_DIR), else ../shared.
std::string golden_path() {
  if (const char* p = std::getenv("TESSERA_GOLDEN_CORE_ALGOS"); p && *p) return p;
  std::string shared = "../shared";
  if (const char* s = std::getenv("TESSERA_SHARED_DIR"); s && *s) {
    shared = s;
  } else if (const char* src = std::getenv("TESSERA_SOURCE_DIR"); src && *src) {
    shared = std::string(src) + "/../shared";
  }
  return shared + "/golden/core_algos.json";
}

// Runs one case; returns "" when every output is within tolerance, else what went wrong.
std::string check_case(size_t i, const nlohmann::json& c, double& worst) {
  const std::string fn = c.value("fn", std::string("<missing fn>"));
  const auto& handlers = golden_handlers();
  auto it = handlers.find(fn);
  if (it == handlers.end()) return fmt::format("case {}: fn '{}' is not handled by the golden test", i, fn);
  CaseReader reader(c);
  Result<Diffs> diffs = Status();
  try {
    diffs = it->second(reader);
  } catch (const std::exception& e) {  // malformed fixture (nlohmann type errors)
    return fmt::format("case {} ({}): malformed case: {}", i, fn, e.what());
  }
  if (!diffs.ok()) return fmt::format("case {} ({}): {}", i, fn, diffs.status().to_string());
  std::string line = fmt::format("[golden] case {:2} {:<56}", i, fn);
  std::string failure;
  for (const auto& [name, d] : *diffs) {
    line += fmt::format(" {} {:.3e}", name, d);
    worst = std::max(worst, d);
    if (!(d <= kTolerance)) failure += fmt::format(" {} off by {:.3e};", name, d);
  }
  fmt::print("{} (tol {:.0e}) {}\n", line, kTolerance, failure.empty() ? "ok" : "FAIL");
  for (const auto& key : reader.unused()) failure += fmt::format(" field '{}' was not used;", key);
  return failure.empty() ? "" : fmt::format("case {} ({}):{}", i, fn, failure);
}

TEST(AlgosGolden, EveryVerlCaseMatches) {
  const std::string path = golden_path();
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << "cannot open golden file " << path;
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    FAIL() << path << ": " << e.what();
  }
  ASSERT_TRUE(doc.contains("cases") && doc["cases"].is_array()) << path << ": no 'cases' array";

  std::map<std::string, int> per_fn;
  int checked = 0;
  double worst = 0.0;
  for (size_t i = 0; i < doc["cases"].size(); ++i) {
    const auto& c = doc["cases"][i];
    const std::string failure = check_case(i, c, worst);
    EXPECT_EQ(failure, "");
    if (failure.empty()) {
      ++checked;
      ++per_fn[c.value("fn", "")];
    }
  }
  fmt::print("[golden] {}: {} of {} cases matched verl within {:.0e}; max |diff| over all outputs {:.3e}\n", path,
             checked, doc["cases"].size(), kTolerance, worst);
  for (const auto& [fn, n] : per_fn) fmt::print("[golden]   {:<56} {}\n", fn, n);
  EXPECT_GT(checked, 0) << "no golden case ran";
  EXPECT_EQ(static_cast<size_t>(checked), doc["cases"].size());
}

}  // namespace
}  // namespace tessera::algos::testing
