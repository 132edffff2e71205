// Drawing a Chart with cairo (driver/plot.hpp): one drawing path, rendered to a PNG or an SVG
// surface. Text goes through cairo's font selection ("sans-serif" via fontconfig).
#include <cairo/cairo-svg.h>
#include <cairo/cairo.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <set>

#include "driver/plot.hpp"

namespace tessera::driver {
namespace {

struct Rgb {
  double r, g, b;
};

// Tableau 10, cycled.
Rgb palette(size_t i) {
  static const int colours[][3] = {{31, 119, 180}, {255, 127, 14}, {44, 160, 44},  {214, 39, 40},
                                   {148, 103, 189}, {140, 86, 75}, {227, 119, 194}, {127, 127, 127},
                                   {188, 189, 34},  {23, 190, 207}};
  const auto& c = colours[i % std::size(colours)];
  return {c[0] / 255.0, c[1] / 255.0, c[2] / 255.0};
}

// A series as drawn: stacked charts get cumulative sums (`lower` is the layer below).
struct Drawn {
  std::string name;
  std::vector<double> x, y, lower, raw;  // raw: the unsmoothed y when smoothing, else empty
};

std::vector<Drawn> drawn_series(const Chart& chart) {
  std::vector<Drawn> out;
  if (!chart.stacked) {
    for (const auto& s : chart.series) {
      if (chart.smoothing > 0) {
        out.push_back({s.name, s.x, smooth(s.y, chart.smoothing), {}, s.y});
      } else {
        out.push_back({s.name, s.x, s.y, {}, {}});
      }
    }
    return out;
  }
  std::set<double> xs;
  for (const auto& s : chart.series) xs.insert(s.x.begin(), s.x.end());
  std::vector<double> x(xs.begin(), xs.end()), base(x.size(), 0.0);
  for (const auto& s : chart.series) {
    const std::vector<double> y = chart.smoothing > 0 ? smooth(s.y, chart.smoothing) : s.y;
    Drawn d{s.name, x, base, base, {}};
    for (size_t i = 0; i < s.x.size(); ++i) {
      const auto k = static_cast<size_t>(std::lower_bound(x.begin(), x.end(), s.x[i]) - x.begin());
      if (std::isfinite(y[i])) d.y[k] += y[i];
    }
    base = d.y;
    out.push_back(std::move(d));
  }
  return out;
}

// Ticks at 1/2/5 x 10^k covering [lo, hi] with about `target` intervals; widens the range to them.
std::vector<double> nice_ticks(double& lo, double& hi, int target) {
  if (!(hi > lo)) {
    const double pad = lo == 0 ? 1.0 : std::fabs(lo) * 0.1;
    lo -= pad, hi += pad;
  }
  const double raw = (hi - lo) / target, mag = std::pow(10.0, std::floor(std::log10(raw)));
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

std::string tick_label(double v) {
  if (v != 0 && (std::fabs(v) >= 1e5 || std::fabs(v) < 1e-3)) return fmt::format("{:.1e}", v);
  std::string s = fmt::format("{:.4f}", v);
  while (s.find('.') != std::string::npos && (s.back() == '0' || s.back() == '.')) {
    const bool dot = s.back() == '.';
    s.pop_back();
    if (dot) break;
  }
  return s;
}

// A legend entry: long names keep their (distinguishing) tail.
std::string legend_label(const std::string& name) {
  constexpr size_t kMax = 48;
  return name.size() <= kMax ? name : "..." + name.substr(name.size() - (kMax - 3));
}

// The plot area and the data -> device mapping.
struct Layout {
  double left = 0, right = 0, top = 0, bottom = 0;
  double xmin = 0, xmax = 1, ymin = 0, ymax = 1;
  std::vector<double> xticks, yticks;

  double px(double x) const { return left + (x - xmin) / (xmax - xmin) * (right - left); }
  double py(double y) const { return bottom - (y - ymin) / (ymax - ymin) * (bottom - top); }
};

constexpr double kLegendFont = 11, kTickFont = 11, kLabelFont = 12, kTitleFont = 16;

double text_width(cairo_t* cr, const std::string& s, double size) {
  cairo_set_font_size(cr, size);
  cairo_text_extents_t e;
  cairo_text_extents(cr, s.c_str(), &e);
  return e.x_advance;
}

Layout make_layout(cairo_t* cr, const std::vector<Drawn>& series, int width, int height) {
  Layout l;
  double legend = 0;
  for (const auto& s : series) legend = std::max(legend, text_width(cr, legend_label(s.name), kLegendFont));
  l.left = 70, l.top = 40, l.bottom = height - 50.0;
  l.right = width - std::min(legend + 44, width * 0.45);
  double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
  auto include = [&](double x, double y) {
    if (!std::isfinite(x) || !std::isfinite(y)) return;
    xmin = std::min(xmin, x), xmax = std::max(xmax, x);
    ymin = std::min(ymin, y), ymax = std::max(ymax, y);
  };
  for (const auto& s : series) {
    for (size_t i = 0; i < s.x.size(); ++i) {
      include(s.x[i], s.y[i]);
      if (!s.lower.empty()) include(s.x[i], s.lower[i]);
      if (!s.raw.empty()) include(s.x[i], s.raw[i]);
    }
  }
  if (!std::isfinite(xmin)) xmin = 0, xmax = 1, ymin = 0, ymax = 1;
  l.xticks = nice_ticks(xmin, xmax, 8);
  l.yticks = nice_ticks(ymin, ymax, 6);
  l.xmin = xmin, l.xmax = xmax, l.ymin = ymin, l.ymax = ymax;
  return l;
}

enum class Align { left, centre, right };

void text(cairo_t* cr, const std::string& s, double x, double y, double size, Align align, double angle = 0) {
  cairo_save(cr);
  cairo_set_font_size(cr, size);
  cairo_text_extents_t e;
  cairo_text_extents(cr, s.c_str(), &e);
  cairo_translate(cr, x, y);
  cairo_rotate(cr, angle);
  const double dx = align == Align::left ? 0 : align == Align::centre ? -e.x_advance / 2 : -e.x_advance;
  cairo_move_to(cr, dx, 0);
  cairo_show_text(cr, s.c_str());
  cairo_restore(cr);
}

void draw_axes(cairo_t* cr, const Chart& chart, const Layout& l) {
  cairo_set_line_width(cr, 1);
  cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
  for (double t : l.yticks) {
    cairo_move_to(cr, l.left, std::round(l.py(t)) + 0.5);
    cairo_line_to(cr, l.right, std::round(l.py(t)) + 0.5);
  }
  cairo_stroke(cr);
  cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
  for (double t : l.yticks) text(cr, tick_label(t), l.left - 6, l.py(t) + 4, kTickFont, Align::right);
  for (double t : l.xticks) text(cr, tick_label(t), l.px(t), l.bottom + 16, kTickFont, Align::centre);
  cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
  cairo_rectangle(cr, std::round(l.left) + 0.5, std::round(l.top) + 0.5, std::round(l.right - l.left),
                  std::round(l.bottom - l.top));
  cairo_stroke(cr);
  cairo_set_source_rgb(cr, 0, 0, 0);
  text(cr, chart.title, (l.left + l.right) / 2, 24, kTitleFont, Align::centre);
  text(cr, chart.x_label, (l.left + l.right) / 2, l.bottom + 38, kLabelFont, Align::centre);
  text(cr, chart.y_label, 20, (l.top + l.bottom) / 2, kLabelFont, Align::centre, -M_PI / 2);
}

// A polyline through the finite points of (x, y), broken at gaps.
void trace(cairo_t* cr, const Layout& l, const std::vector<double>& x, const std::vector<double>& y) {
  bool pen = false;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(y[i]) || !std::isfinite(x[i])) {
      pen = false;
      continue;
    }
    if (pen) {
      cairo_line_to(cr, l.px(x[i]), l.py(y[i]));
    } else {
      cairo_move_to(cr, l.px(x[i]), l.py(y[i]));
      pen = true;
    }
  }
}

void draw_series(cairo_t* cr, const Chart& chart, const std::vector<Drawn>& series, const Layout& l) {
  cairo_save(cr);
  cairo_rectangle(cr, l.left, l.top, l.right - l.left, l.bottom - l.top);
  cairo_clip(cr);
  cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
  for (size_t i = 0; i < series.size(); ++i) {
    const auto& s = series[i];
    const Rgb c = palette(i);
    if (chart.stacked && !s.x.empty()) {
      cairo_move_to(cr, l.px(s.x[0]), l.py(s.y[0]));
      for (size_t k = 1; k < s.x.size(); ++k) cairo_line_to(cr, l.px(s.x[k]), l.py(s.y[k]));
      for (size_t k = s.x.size(); k-- > 0;) cairo_line_to(cr, l.px(s.x[k]), l.py(s.lower[k]));
      cairo_close_path(cr);
      cairo_set_source_rgba(cr, c.r, c.g, c.b, 0.75);
      cairo_fill_preserve(cr);
      cairo_set_source_rgb(cr, c.r, c.g, c.b);
      cairo_set_line_width(cr, 1);
      cairo_stroke(cr);
      continue;
    }
    if (!s.raw.empty()) {
      trace(cr, l, s.x, s.raw);
      cairo_set_source_rgba(cr, c.r, c.g, c.b, 0.25);
      cairo_set_line_width(cr, 1.5);
      cairo_stroke(cr);
    }
    trace(cr, l, s.x, s.y);
    cairo_set_source_rgb(cr, c.r, c.g, c.b);
    cairo_set_line_width(cr, 2);
    cairo_stroke(cr);
    // A point between two gaps draws no line: mark it.
    auto finite = [&](size_t k) { return k < s.y.size() && std::isfinite(s.y[k]) && std::isfinite(s.x[k]); };
    for (size_t k = 0; k < s.x.size(); ++k) {
      if (!finite(k) || (k > 0 && finite(k - 1)) || finite(k + 1)) continue;
      cairo_new_sub_path(cr);
      cairo_arc(cr, l.px(s.x[k]), l.py(s.y[k]), 3, 0, 2 * M_PI);
    }
    cairo_fill(cr);
  }
  cairo_restore(cr);
}

void draw_legend(cairo_t* cr, const std::vector<Drawn>& series, const Layout& l) {
  for (size_t i = 0; i < series.size(); ++i) {
    const double y = l.top + 14 + 18.0 * static_cast<double>(i);
    const Rgb c = palette(i);
    cairo_set_source_rgb(cr, c.r, c.g, c.b);
    cairo_rectangle(cr, l.right + 12, y - 10, 12, 12);
    cairo_fill(cr);
    cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
    text(cr, legend_label(series[i].name), l.right + 30, y, kLegendFont, Align::left);
  }
}

void draw(cairo_t* cr, const Chart& chart, int width, int height) {
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  const auto series = drawn_series(chart);
  const Layout l = make_layout(cr, series, width, height);
  draw_axes(cr, chart, l);
  draw_series(cr, chart, series, l);
  draw_legend(cr, series, l);
}

cairo_status_t append_bytes(void* closure, const unsigned char* data, unsigned int length) {
  static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), length);
  return CAIRO_STATUS_SUCCESS;
}

struct SurfaceDeleter {
  void operator()(cairo_surface_t* s) const { cairo_surface_destroy(s); }
};
struct ContextDeleter {
  void operator()(cairo_t* c) const { cairo_destroy(c); }
};

Status check(cairo_status_t status, const char* what) {
  if (status == CAIRO_STATUS_SUCCESS) return Status();
  return make_error(ErrorCode::internal, "plot: cairo could not {}: {}", what, cairo_status_to_string(status));
}

}  // namespace

std::vector<double> smooth(const std::vector<double>& y, double w) {
  std::vector<double> out(y.size(), NAN);
  double last = 0;
  int n = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (!std::isfinite(y[i])) continue;
    last = last * w + (1 - w) * y[i];
    ++n;
    const double debias = 1 - std::pow(w, n);
    out[i] = debias > 0 ? last / debias : y[i];
  }
  return out;
}

Result<std::string> render_chart(const Chart& chart, ImageFormat format, int width, int height) {
  std::string bytes;
  std::unique_ptr<cairo_surface_t, SurfaceDeleter> surface(
      format == ImageFormat::png
          ? cairo_image_surface_create(CAIRO_FORMAT_RGB24, width, height)
          : cairo_svg_surface_create_for_stream(append_bytes, &bytes, width, height));
  TESSERA_RETURN_IF_ERROR(check(cairo_surface_status(surface.get()), "create a surface"));
  if (format == ImageFormat::svg) cairo_svg_surface_set_document_unit(surface.get(), CAIRO_SVG_UNIT_PX);
  {
    std::unique_ptr<cairo_t, ContextDeleter> cr(cairo_create(surface.get()));
    draw(cr.get(), chart, width, height);
    TESSERA_RETURN_IF_ERROR(check(cairo_status(cr.get()), "draw the chart"));
  }
  if (format == ImageFormat::png) {
    TESSERA_RETURN_IF_ERROR(check(cairo_surface_write_to_png_stream(surface.get(), append_bytes, &bytes), "encode PNG"));
  } else {
    cairo_surface_finish(surface.get());
    TESSERA_RETURN_IF_ERROR(check(cairo_surface_status(surface.get()), "write SVG"));
  }
  return bytes;
}

}  // namespace tessera::driver
