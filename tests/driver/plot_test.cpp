// Plots: PNG signature and IHDR dimensions, SVG structure, skipped charts, bad input.
#include <gtest/gtest.h>

#include <fstream>

#include "driver/plot.hpp"
#include "tests/driver/driver_test_util.hpp"

namespace tessera::driver {
namespace {

using nlohmann::json;

std::string read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

uint32_t be32(const std::string& s, size_t at) {
  return (uint32_t(uint8_t(s[at])) << 24) | (uint32_t(uint8_t(s[at + 1])) << 16) | (uint32_t(uint8_t(s[at + 2])) << 8) |
         uint32_t(uint8_t(s[at + 3]));
}

std::string metrics_log(int steps, bool with_kl) {
  std::string out;
  for (int s = 1; s <= steps; ++s) {
    json row = {{"step", s},
                {"critic/score/mean", 0.1 * s},
                {"actor/entropy", 2.0 - 0.1 * s},
                {"response_length/mean", 10 + s},
                {"timing_s/gen", 1.0},
                {"timing_s/update_actor", 0.5 * s},
                {"timing_s/step", 2.0}};
    if (with_kl) row["actor/ppo_kl"] = 0.01 * s;
    if (s % 2 == 0) row["val-core/tessera/arith/acc/mean@1"] = 0.2 * s;
    out += row.dump() + "\n";
  }
  return out;
}

TEST(Plot, WritesPngAndSvgAndSkipsMissingCharts) {
  testing::TempDir dir("plot");
  dir.write("metrics.jsonl", metrics_log(6, /*with_kl=*/false));
  auto report = plot_run(dir.path());
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  EXPECT_EQ(report->written.size(), 8u);  // reward, entropy, lengths, timing x (svg, png)
  ASSERT_EQ(report->notes.size(), 1u);
  EXPECT_NE(report->notes[0].find("kl"), std::string::npos);
  for (const char* name : {"reward", "entropy", "lengths", "timing"}) {
    std::string png = read_all(dir.path() / "plots" / (std::string(name) + ".png"));
    ASSERT_GT(png.size(), 33u) << name;
    EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8)) << name;
    EXPECT_EQ(png.substr(12, 4), "IHDR");
    EXPECT_EQ(be32(png, 16), 800u);  // width
    EXPECT_EQ(be32(png, 20), 450u);  // height
    EXPECT_EQ(uint8_t(png[24]), 8);  // bit depth
    EXPECT_EQ(uint8_t(png[25]), 2);  // RGB
    EXPECT_EQ(png.substr(png.size() - 8, 4), "IEND");
    std::string svg = read_all(dir.path() / "plots" / (std::string(name) + ".svg"));
    EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u) << name;
    EXPECT_NE(svg.find("</svg>"), std::string::npos);
  }
  std::string reward = read_all(dir.path() / "plots" / "reward.svg");
  EXPECT_NE(reward.find("val-core/tessera/arith/acc/mean@1"), std::string::npos);
  EXPECT_NE(reward.find("<polyline"), std::string::npos);
  EXPECT_NE(read_all(dir.path() / "plots" / "timing.svg").find("<polygon"), std::string::npos);  // stacked areas
  EXPECT_EQ(read_all(dir.path() / "plots" / "timing.svg").find("timing_s/step"), std::string::npos);
}

TEST(Plot, RasterDrawsTheSeries) {
  Chart chart{"t", "step", "y", {{"a", {0, 1, 2}, {0, 1, 0}}}, false};
  Image img = render_png_image(chart, 400, 300);
  ASSERT_EQ(img.rgb.size(), 400u * 300u * 3u);
  size_t coloured = 0;  // pixels of the first palette colour (31, 119, 180)
  for (size_t i = 0; i < img.rgb.size(); i += 3) coloured += img.rgb[i] == 31 && img.rgb[i + 1] == 119 && img.rgb[i + 2] == 180;
  EXPECT_GT(coloured, 200u);
}

TEST(Plot, BadInputNamesFileAndLine) {
  testing::TempDir dir("plot_bad");
  dir.write("metrics.jsonl", metrics_log(2, true) + "{oops\n");
  auto r = plot_run(dir.path());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("metrics.jsonl:3"), std::string::npos) << r.status().message();
  auto missing = plot_run(dir.path() / "nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nope"), std::string::npos);
}

}  // namespace
}  // namespace tessera::driver
