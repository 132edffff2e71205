// Generation dumps and logged validation samples: the sample choice is NumPy's (checked against
// NumPy itself), the dump lines are verl's _dump_generations entries.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "driver/generations.hpp"
#include "tests/driver/driver_test_util.hpp"

namespace tessera::driver {
namespace {

using nlohmann::json;

TEST(Generations, ShuffleOrderIsNumpysRandomState) {
  const std::string py = testing::tessera_python();
  if (py.empty()) GTEST_SKIP() << "TESSERA_PYTHON (with numpy) is not set";
  for (size_t n : {1, 2, 5, 17, 100, 1000}) {
    const std::string want = testing::run_command(fmt::format(
        "{} -c 'import numpy as np; x = list(range({})); np.random.RandomState(42).shuffle(x); print(x)'", py, n)).text;
    ASSERT_FALSE(want.empty()) << n;
    const auto order = numpy_shuffled_order(n, 42);
    EXPECT_EQ(fmt::format("[{}]\n", fmt::join(order, ", ")), want) << n;
  }
}

TEST(Generations, DumpLinesAndLoggedSamples) {
  Generations g;
  g.inputs = {"b?", "a?", "c?"};
  g.outputs = {"2", "1", "3"};
  g.gts = {"2", "1", json(nullptr)};
  g.scores = {1.0, 0.0, 0.5};
  g.extra["acc"] = {true, false, false};
  g.extra["not_per_sample"] = {1};  // verl keeps only the lists with one value per sample
  testing::TempDir dir("generations");
  ASSERT_TRUE(dump_generations(g, 7, dir.path() / "dumps").ok());
  std::ifstream in(dir.path() / "dumps" / "7.jsonl");
  std::vector<json> rows;
  for (std::string line; std::getline(in, line);) rows.push_back(json::parse(line));
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0], json({{"input", "b?"}, {"output", "2"}, {"gts", "2"}, {"score", 1.0}, {"step", 7}, {"acc", true}}));
  EXPECT_TRUE(rows[2]["gts"].is_null());

  // Sorted by input (a?, b?, c?), then NumPy's RandomState(42) order of 3 items.
  const auto order = numpy_shuffled_order(3, 42);
  const std::vector<std::string> sorted = {"a?", "b?", "c?"};
  auto lines = val_generation_lines(g, 2);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("[input] " + sorted[order[0]]), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("[input] " + sorted[order[1]]), std::string::npos) << lines[1];
  EXPECT_TRUE(val_generation_lines(g, 0).empty());
  EXPECT_EQ(val_generation_lines(g, 10).size(), 3u);
}

}  // namespace
}  // namespace tessera::driver
