// Plots: the PNG decodes (through cairo's own PNG reader) to the right size with each series in
// its colour and text drawn; the SVG parses as XML (Python's ElementTree) and strokes each
// series in its colour; metric selection, overlays, smoothing and bad input.
#include <gtest/gtest.h>

#include <cairo/cairo.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>

#include "driver/plot.hpp"
#include "tests/driver/driver_test_util.hpp"

namespace tessera::driver {
namespace {

using nlohmann::json;

constexpr int kPalette[][3] = {{31, 119, 180}, {255, 127, 14}, {44, 160, 44}};

std::string read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string metrics_log(int steps, bool with_kl, double scale = 1.0) {
  std::string out;
  for (int s = 1; s <= steps; ++s) {
    json row = {{"step", s},
                {"critic/score/mean", 0.1 * s * scale},
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

// A decoded PNG: width, height and 0x00RRGGBB pixels.
struct Pixels {
  int width = 0, height = 0;
  std::vector<uint32_t> argb;

  // Pixels within `tol` (per channel) of the colour.
  size_t near(const int rgb[3], int tol = 24) const {
    size_t n = 0;
    for (uint32_t p : argb) {
      const int r = (p >> 16) & 0xFF, g = (p >> 8) & 0xFF, b = p & 0xFF;
      n += std::abs(r - rgb[0]) <= tol && std::abs(g - rgb[1]) <= tol && std::abs(b - rgb[2]) <= tol;
    }
    return n;
  }
};

struct PngSource {
  const std::string* bytes;
  size_t at = 0;
};

Pixels decode_png(const std::string& bytes) {
  PngSource src{&bytes};
  cairo_surface_t* s = cairo_image_surface_create_from_png_stream(
      [](void* closure, unsigned char* data, unsigned int length) {
        auto* in = static_cast<PngSource*>(closure);
        if (in->at + length > in->bytes->size()) return CAIRO_STATUS_READ_ERROR;
        std::memcpy(data, in->bytes->data() + in->at, length);
        in->at += length;
        return CAIRO_STATUS_SUCCESS;
      },
      &src);
  Pixels px;
  if (cairo_surface_status(s) == CAIRO_STATUS_SUCCESS) {
    cairo_surface_flush(s);
    px.width = cairo_image_surface_get_width(s);
    px.height = cairo_image_surface_get_height(s);
    const int stride = cairo_image_surface_get_stride(s);
    const unsigned char* data = cairo_image_surface_get_data(s);
    for (int y = 0; y < px.height; ++y) {
      const auto* row = reinterpret_cast<const uint32_t*>(data + static_cast<ptrdiff_t>(y) * stride);
      px.argb.insert(px.argb.end(), row, row + px.width);
    }
  }
  cairo_surface_destroy(s);
  return px;
}

// Python's ElementTree parses the SVG and prints "WIDTH HEIGHT" and then one "R G B" line per
// distinct stroke colour (0-255), or fails.
std::string svg_facts(const std::filesystem::path& svg) {
  const std::string script = R"(
import re, sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
assert root.tag == '{http://www.w3.org/2000/svg}svg', root.tag
print(root.get('width'), root.get('height'))
colours = set()
for e in root.iter():
    for m in re.finditer(r'stroke:rgb\(([\d.]+)%,([\d.]+)%,([\d.]+)%\)', e.get('style', '')):
        colours.add(tuple(round(float(v) * 2.55) for v in m.groups()))
glyphs = sum(1 for e in root.iter() if (e.get('id') or '').startswith('glyph'))
print('glyphs', glyphs)
for c in sorted(colours): print(*c)
)";
  const std::filesystem::path py = svg.parent_path() / "svg_facts.py";
  std::ofstream(py) << script;
  return testing::run_command("python3 " + py.string() + " " + svg.string() + " 2>&1").text;
}

std::string colour_line(const int rgb[3]) { return fmt::format("\n{} {} {}\n", rgb[0], rgb[1], rgb[2]); }

TEST(Plot, WritesPngAndSvgAndSkipsMissingCharts) {
  testing::TempDir dir("plot");
  dir.write("metrics.jsonl", metrics_log(6, /*with_kl=*/false));
  auto report = plot_run(dir.path());
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  EXPECT_EQ(report->written.size(), 8u);  // reward, entropy, lengths, timing x (png, svg)
  ASSERT_EQ(report->notes.size(), 1u);
  EXPECT_NE(report->notes[0].find("kl"), std::string::npos);
  for (const char* name : {"reward", "entropy", "lengths", "timing"}) {
    Pixels png = decode_png(read_all(dir.path() / "plots" / (std::string(name) + ".png")));
    EXPECT_EQ(png.width, 800) << name;
    EXPECT_EQ(png.height, 450) << name;
    EXPECT_GT(png.near(kPalette[0]), 100u) << name;  // the first series, in the first colour
    const std::string svg = svg_facts(dir.path() / "plots" / (std::string(name) + ".svg"));
    EXPECT_EQ(svg.rfind("800px 450px\n", 0), 0u) << name << ": " << svg;
    EXPECT_NE(svg.find(colour_line(kPalette[0])), std::string::npos) << name << ": " << svg;
    EXPECT_EQ(svg.find("glyphs 0\n"), std::string::npos) << name << ": no text drawn";
  }
  // reward: score and the validation metric; timing: two stacked layers, timing_s/step left out.
  const std::string reward = svg_facts(dir.path() / "plots" / "reward.svg");
  EXPECT_NE(reward.find(colour_line(kPalette[1])), std::string::npos) << reward;
  EXPECT_EQ(reward.find(colour_line(kPalette[2])), std::string::npos) << reward;
  const std::string timing = svg_facts(dir.path() / "plots" / "timing.svg");
  EXPECT_NE(timing.find(colour_line(kPalette[1])), std::string::npos) << timing;
  EXPECT_EQ(timing.find(colour_line(kPalette[2])), std::string::npos) << timing;
}

TEST(Plot, PngDrawsEachSeriesInItsColourWithText) {
  Chart chart{"Title", "step", "y", {{"a", {0, 1, 2}, {0, 1, 0}}, {"b", {0, 1, 2}, {1, 0, 1}}}, false};
  auto png = render_chart(chart, ImageFormat::png, 400, 300);
  ASSERT_TRUE(png.ok()) << png.status().to_string();
  Pixels px = decode_png(*png);
  ASSERT_EQ(px.width, 400);
  ASSERT_EQ(px.height, 300);
  EXPECT_GT(px.near(kPalette[0]), 200u);
  EXPECT_GT(px.near(kPalette[1]), 200u);
  EXPECT_EQ(px.near(kPalette[2], 8), 0u);
  // The title's glyphs: dark, anti-aliased (grey edges) pixels in the band above the plot area.
  size_t dark = 0, grey = 0;
  for (int y = 5; y < 30; ++y) {
    for (int x = 0; x < px.width; ++x) {
      const int v = px.argb[static_cast<size_t>(y * px.width + x)] & 0xFF;
      dark += v < 60;
      grey += v > 60 && v < 200;
    }
  }
  EXPECT_GT(dark, 20u);
  EXPECT_GT(grey, 20u);
}

TEST(Plot, SmoothingIsTensorBoards) {
  // w = 0.5 over 1, 2, gap, 3: debiased EMA 1, 5/3, gap, 17/7.
  auto s = smooth({1, 2, NAN, 3}, 0.5);
  ASSERT_EQ(s.size(), 4u);
  EXPECT_DOUBLE_EQ(s[0], 1.0);
  EXPECT_DOUBLE_EQ(s[1], 5.0 / 3.0);
  EXPECT_TRUE(std::isnan(s[2]));
  EXPECT_DOUBLE_EQ(s[3], 17.0 / 7.0);
  EXPECT_EQ(smooth({4, 5}, 0.0), (std::vector<double>{4, 5}));
}

TEST(Plot, MetricSelectionAndOverlays) {
  testing::TempDir dir("plot_overlay");
  dir.write("a/metrics.jsonl", metrics_log(4, true));
  dir.write("b/metrics.jsonl", metrics_log(4, false, 2.0));
  PlotOptions options;
  options.metrics = {"critic/*", "timing_s/gen", "critic/score/mean"};
  options.smoothing = 0.6;
  options.out_dir = dir.path() / "cmp";
  auto report = plot_runs({dir.path() / "a", dir.path() / "b"}, options);
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  std::set<std::string> names;
  for (const auto& p : report->written) names.insert(p.filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"critic_score_mean.png", "critic_score_mean.svg", "timing_s_gen.png",
                                          "timing_s_gen.svg"}));
  // One chart per metric, one series per run, named after the run; smoothing keeps the raw line.
  std::vector<RunMetrics> runs = {{"a", *read_metrics_jsonl(dir.path() / "a" / "metrics.jsonl")},
                                  {"b", *read_metrics_jsonl(dir.path() / "b" / "metrics.jsonl")}};
  std::vector<std::string> notes;
  auto charts = build_charts(runs, options, notes);
  ASSERT_TRUE(charts.ok());
  ASSERT_EQ(charts->size(), 2u);
  const Chart& score = (*charts)[0].second;
  ASSERT_EQ(score.series.size(), 2u);
  EXPECT_EQ(score.series[0].name, "a: critic/score/mean");
  EXPECT_EQ(score.series[1].name, "b: critic/score/mean");
  EXPECT_DOUBLE_EQ(score.series[1].y[3], 0.8);
  EXPECT_EQ(score.smoothing, 0.6);
  const std::string svg = svg_facts(dir.path() / "cmp" / "critic_score_mean.svg");
  EXPECT_NE(svg.find(colour_line(kPalette[0])), std::string::npos) << svg;
  EXPECT_NE(svg.find(colour_line(kPalette[1])), std::string::npos) << svg;
  // Overlaid standard charts compare the step time instead of stacking across runs.
  auto standard = build_charts(runs, PlotOptions{}, notes);
  ASSERT_TRUE(standard.ok());
  ASSERT_EQ(standard->back().first, "timing");
  EXPECT_FALSE(standard->back().second.stacked);
  EXPECT_EQ(standard->back().second.series[1].name, "b: timing_s/step");
}

TEST(Plot, BadInputIsOneLineNamingIt) {
  testing::TempDir dir("plot_bad");
  dir.write("metrics.jsonl", metrics_log(2, true) + "{oops\n");
  auto r = plot_run(dir.path());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("metrics.jsonl:3"), std::string::npos) << r.status().message();
  auto missing = plot_run(dir.path() / "nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nope"), std::string::npos);

  dir.write("ok/metrics.jsonl", metrics_log(2, true));
  PlotOptions options;
  options.metrics = {"actor/*", "critic/nothing*"};
  auto unmatched = plot_runs({dir.path() / "ok"}, options);
  ASSERT_FALSE(unmatched.ok());
  EXPECT_NE(unmatched.status().message().find("'critic/nothing*'"), std::string::npos) << unmatched.status().message();
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "ok" / "plots"));  // nothing half-written

  auto two = plot_runs({dir.path() / "ok", dir.path() / "ok"}, PlotOptions{});
  ASSERT_FALSE(two.ok());
  EXPECT_NE(two.status().message().find("--out"), std::string::npos);

  PlotOptions rough;
  rough.smoothing = 1.0;
  auto bad_smooth = plot_runs({dir.path() / "ok"}, rough);
  ASSERT_FALSE(bad_smooth.ok());
  EXPECT_NE(bad_smooth.status().message().find("--smooth"), std::string::npos);
}

}  // namespace
}  // namespace tessera::driver
