// Charts from metrics.jsonl, the shared layout and the SVG renderer (driver/plot.hpp).
#include "driver/plot.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <set>

#include "driver/checkpoint_manager.hpp"
#include "driver/internal/jsonl.hpp"
#include "driver/internal/plot_layout.hpp"

namespace tessera::driver {
namespace internal {

Rgb palette(size_t i) {
  static const Rgb colours[] = {{31, 119, 180}, {255, 127, 14}, {44, 160, 44},  {214, 39, 40},
                                {148, 103, 189}, {140, 86, 75}, {227, 119, 194}, {127, 127, 127},
                                {188, 189, 34},  {23, 190, 207}};
  return colours[i % (sizeof(colours) / sizeof(colours[0]))];
}

std::string hex(Rgb c) { return fmt::format("#{:02x}{:02x}{:02x}", c.r, c.g, c.b); }

std::vector<DrawnSeries> drawn_series(const Chart& chart) {
  std::vector<DrawnSeries> out;
  if (!chart.stacked) {
    for (const auto& s : chart.series) out.push_back({s.name, s.x, s.y, {}});
    return out;
  }
  std::set<double> xs;
  for (const auto& s : chart.series) xs.insert(s.x.begin(), s.x.end());
  std::vector<double> x(xs.begin(), xs.end()), base(x.size(), 0.0);
  for (const auto& s : chart.series) {
    DrawnSeries d{s.name, x, base, base};
    for (size_t i = 0; i < s.x.size(); ++i) {
      size_t k = static_cast<size_t>(std::lower_bound(x.begin(), x.end(), s.x[i]) - x.begin());
      if (std::isfinite(s.y[i])) d.y[k] += s.y[i];
    }
    base = d.y;
    out.push_back(std::move(d));
  }
  return out;
}

namespace {

// Ticks at 1/2/5 x 10^k covering [lo, hi] with about `target` intervals; widens the range to them.
std::vector<double> nice_ticks(double& lo, double& hi, int target) {
  if (!(hi > lo)) {
    double pad = lo == 0 ? 1.0 : std::fabs(lo) * 0.1;
    lo -= pad, hi += pad;
  }
  double raw = (hi - lo) / target, mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  }
  lo = std::floor(lo / step) * step;
  hi = std::ceil(hi / step) * step;
  std::vector<double> ticks;
  for (double t = lo; t <= hi + step * 1e-9; t += step) ticks.push_back(std::fabs(t) < step * 1e-9 ? 0.0 : t);
  return ticks;
}

}  // namespace

Layout make_layout(const std::vector<DrawnSeries>& series, int width, int height) {
  Layout l;
  l.width = width, l.height = height;
  size_t longest = 0;
  for (const auto& s : series) longest = std::max(longest, legend_label(s.name).size());
  l.left = 70, l.right = width - static_cast<double>(std::min<size_t>(40 + 6 * longest, 330)), l.top = 40;
  l.bottom = height - 50.0;
  double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
  for (const auto& s : series) {
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.y[i]) || !std::isfinite(s.x[i])) continue;
      xmin = std::min(xmin, s.x[i]), xmax = std::max(xmax, s.x[i]);
      ymin = std::min(ymin, s.y[i]), ymax = std::max(ymax, s.y[i]);
      if (!s.lower.empty()) ymin = std::min(ymin, s.lower[i]);
    }
  }
  if (!std::isfinite(xmin)) xmin = 0, xmax = 1, ymin = 0, ymax = 1;
  l.xticks = nice_ticks(xmin, xmax, 8);
  l.yticks = nice_ticks(ymin, ymax, 6);
  l.xmin = xmin, l.xmax = xmax, l.ymin = ymin, l.ymax = ymax;
  return l;
}

std::string legend_label(const std::string& name) {
  constexpr size_t kMax = 48;  // characters; longer names keep their (distinguishing) tail
  return name.size() <= kMax ? name : "..." + name.substr(name.size() - (kMax - 3));
}

std::string tick_label(double v) {
  if (v != 0 && (std::fabs(v) >= 1e5 || std::fabs(v) < 1e-3)) return fmt::format("{:.1e}", v);
  std::string s = fmt::format("{:.4f}", v);
  while (s.find('.') != std::string::npos && (s.back() == '0' || s.back() == '.')) {
    bool dot = s.back() == '.';
    s.pop_back();
    if (dot) break;
  }
  return s;
}

}  // namespace internal

namespace {

using internal::DrawnSeries;
using internal::Layout;

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// Polyline point lists split at non-finite values (gaps).
std::vector<std::string> svg_runs(const DrawnSeries& s, const Layout& l) {
  std::vector<std::string> runs(1);
  for (size_t i = 0; i < s.x.size(); ++i) {
    if (!std::isfinite(s.y[i])) {
      if (!runs.back().empty()) runs.emplace_back();
      continue;
    }
    runs.back() += fmt::format("{:.1f},{:.1f} ", l.px(s.x[i]), l.py(s.y[i]));
  }
  return runs;
}

void svg_axes(std::string& svg, const Chart& chart, const Layout& l) {
  for (double t : l.yticks) {
    svg += fmt::format(R"(<line x1="{:.1f}" y1="{:.1f}" x2="{:.1f}" y2="{:.1f}" stroke="#e0e0e0"/>)", l.left, l.py(t),
                       l.right, l.py(t));
    svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="end" font-size="11">{}</text>)", l.left - 6,
                       l.py(t) + 4, internal::tick_label(t));
  }
  for (double t : l.xticks) {
    svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle" font-size="11">{}</text>)", l.px(t),
                       l.bottom + 16, internal::tick_label(t));
  }
  svg += fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="none" stroke="#333"/>)", l.left,
                     l.top, l.right - l.left, l.bottom - l.top);
  svg += fmt::format(R"(<text x="{:.1f}" y="24" text-anchor="middle" font-size="16">{}</text>)",
                     (l.left + l.right) / 2, xml_escape(chart.title));
  svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" text-anchor="middle" font-size="12">{}</text>)",
                     (l.left + l.right) / 2, l.bottom + 38, xml_escape(chart.x_label));
  svg += fmt::format(R"svg(<text x="16" y="{:.1f}" text-anchor="middle" font-size="12" transform="rotate(-90 16 {:.1f})">{}</text>)svg",
                     (l.top + l.bottom) / 2, (l.top + l.bottom) / 2, xml_escape(chart.y_label));
}

}  // namespace

std::string render_svg(const Chart& chart, int width, int height) {
  auto series = internal::drawn_series(chart);
  Layout l = internal::make_layout(series, width, height);
  std::string svg = fmt::format(
      R"(<svg xmlns="http://www.w3.org/2000/svg" width="{0}" height="{1}" viewBox="0 0 {0} {1}" font-family="sans-serif">)",
      width, height);
  svg += R"(<rect width="100%" height="100%" fill="white"/>)";
  svg_axes(svg, chart, l);
  for (size_t i = 0; i < series.size(); ++i) {
    const auto& s = series[i];
    std::string colour = internal::hex(internal::palette(i));
    if (chart.stacked && !s.x.empty()) {
      std::string pts;
      for (size_t k = 0; k < s.x.size(); ++k) pts += fmt::format("{:.1f},{:.1f} ", l.px(s.x[k]), l.py(s.y[k]));
      for (size_t k = s.x.size(); k-- > 0;) pts += fmt::format("{:.1f},{:.1f} ", l.px(s.x[k]), l.py(s.lower[k]));
      svg += fmt::format(R"(<polygon points="{}" fill="{}" fill-opacity="0.75" stroke="{}"/>)", pts, colour, colour);
    } else {
      for (const auto& run : svg_runs(s, l)) {
        if (run.empty()) continue;
        svg += fmt::format(R"(<polyline points="{}" fill="none" stroke="{}" stroke-width="2"/>)", run, colour);
      }
    }
    double ly = l.top + 14 + 18.0 * static_cast<double>(i);
    svg += fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="12" height="12" fill="{}"/>)", l.right + 12, ly - 10, colour);
    svg += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" font-size="10">{}</text>)", l.right + 30, ly,
                       xml_escape(internal::legend_label(s.name)));
  }
  svg += "</svg>\n";
  return svg;
}

Result<std::vector<nlohmann::json>> read_metrics_jsonl(const std::filesystem::path& path) {
  std::vector<nlohmann::json> rows;
  TESSERA_RETURN_IF_ERROR(internal::for_each_jsonl(path, [&](const nlohmann::json& row, const std::string& where) {
    if (!row.contains("step") || !row["step"].is_number()) {
      return make_error(ErrorCode::corrupt_data, "{}: no numeric \"step\"", where);
    }
    rows.push_back(row);
    return Status();
  }));
  return rows;
}

namespace {

// The series of metric `key` over the rows that hold it (null -> a gap); nullopt if absent.
std::optional<Series> extract(const std::vector<nlohmann::json>& rows, const std::string& key) {
  Series s{key, {}, {}};
  for (const auto& row : rows) {
    auto it = row.find(key);
    if (it == row.end()) continue;
    s.x.push_back(row["step"].get<double>());
    s.y.push_back(it->is_number() ? it->get<double>() : NAN);
  }
  if (s.x.empty()) return std::nullopt;
  return s;
}

std::vector<std::string> keys_matching(const std::vector<nlohmann::json>& rows, const std::string& prefix,
                                       const std::vector<std::string>& contains, const std::string& exclude = "") {
  std::set<std::string> keys;
  for (const auto& row : rows) {
    for (const auto& [k, v] : row.items()) {
      if (k.rfind(prefix, 0) != 0 || (!exclude.empty() && k == exclude)) continue;
      bool ok = contains.empty();
      for (const auto& c : contains) ok = ok || k.find(c) != std::string::npos;
      if (ok) keys.insert(k);
    }
  }
  return {keys.begin(), keys.end()};
}

}  // namespace

std::vector<std::pair<std::string, Chart>> build_charts(const std::vector<nlohmann::json>& rows,
                                                        std::vector<std::string>& notes) {
  struct Spec {
    std::string file, title, y_label;
    std::vector<std::string> keys;
    bool stacked;
  };
  std::vector<std::string> reward_keys = {"critic/score/mean", "critic/rewards/mean"};
  for (const auto& k : keys_matching(rows, "val-core/", {"/mean@", "/best@", "/maj@"})) reward_keys.push_back(k);
  std::vector<Spec> specs = {
      {"reward", "Reward", "reward", reward_keys, false},
      {"kl", "KL", "KL", {"actor/ppo_kl", "actor/kl_loss", "actor/reward_kl_penalty", "critic/kl"}, false},
      {"entropy", "Entropy", "entropy", {"actor/entropy"}, false},
      {"lengths", "Lengths", "tokens",
       {"response_length/mean", "response_length/max", "response_length/min", "prompt_length/mean"}, false},
      {"timing", "Step time breakdown", "seconds", keys_matching(rows, "timing_s/", {}, "timing_s/step"), true},
  };
  std::vector<std::pair<std::string, Chart>> charts;
  for (const auto& spec : specs) {
    Chart chart{spec.title, "step", spec.y_label, {}, spec.stacked};
    for (const auto& key : spec.keys) {
      if (auto s = extract(rows, key)) chart.series.push_back(std::move(*s));
    }
    if (chart.series.empty()) {
      notes.push_back(fmt::format("{}: skipped (none of its metrics are in the log)", spec.file));
      continue;
    }
    charts.emplace_back(spec.file, std::move(chart));
  }
  return charts;
}

Result<PlotReport> plot_run(const std::filesystem::path& run_dir) {
  TESSERA_ASSIGN_OR_RETURN(auto rows, read_metrics_jsonl(run_dir / "metrics.jsonl"));
  PlotReport report;
  if (rows.empty()) {
    report.notes.push_back("metrics.jsonl has no rows: nothing to plot");
    return report;
  }
  std::filesystem::path out = run_dir / "plots";
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) return make_error(ErrorCode::io_error, "cannot create {}: {}", out.string(), ec.message());
  for (const auto& [name, chart] : build_charts(rows, report.notes)) {
    std::filesystem::path svg = out / (name + ".svg"), png = out / (name + ".png");
    TESSERA_RETURN_IF_ERROR(write_file_atomic(svg, render_svg(chart)));
    TESSERA_RETURN_IF_ERROR(write_png(render_png_image(chart), png));
    report.written.push_back(svg);
    report.written.push_back(png);
  }
  return report;
}

}  // namespace tessera::driver
