// plot_layout.hpp: the geometry both chart renderers share (private to driver/).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "driver/plot.hpp"

namespace tessera::driver::internal {

/// An RGB colour.
struct Rgb {
  uint8_t r, g, b;
};

/// The series palette (cycled).
Rgb palette(size_t i);
/// "#rrggbb".
std::string hex(Rgb c);

/// Where things go in a chart of a given pixel size, and the data -> pixel mapping.
struct Layout {
  int width = 0, height = 0;
  double left = 0, right = 0, top = 0, bottom = 0;  ///< Plot area in pixels.
  double xmin = 0, xmax = 1, ymin = 0, ymax = 1;    ///< Data range.
  std::vector<double> xticks, yticks;

  double px(double x) const { return left + (x - xmin) / (xmax - xmin) * (right - left); }
  double py(double y) const { return bottom - (y - ymin) / (ymax - ymin) * (bottom - top); }
};

/// Series as drawn: stacked charts get cumulative sums (`lower` is the previous layer).
struct DrawnSeries {
  std::string name;
  std::vector<double> x, y, lower;
};

/// Cumulative layers for stacked charts (points aligned on the union of x); plain copies otherwise.
std::vector<DrawnSeries> drawn_series(const Chart& chart);

/// Axis ranges with "nice" ticks for the drawn series.
Layout make_layout(const std::vector<DrawnSeries>& series, int width, int height);

/// A legend entry: the series name, cut to its last 45 characters after "..." when long.
std::string legend_label(const std::string& name);

/// A tick label ("0.25", "1e+03", "120").
std::string tick_label(double v);

}  // namespace tessera::driver::internal
