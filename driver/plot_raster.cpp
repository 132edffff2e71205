// The PNG side of the charts: a small rasteriser (lines, rectangles, stacked areas, a 5x7
// bitmap font) and libpng encoding (driver/plot.hpp).
#include <png.h>

#include <cmath>
#include <cstdio>
#include <unistd.h>

#include "driver/internal/plot_layout.hpp"
#include "driver/plot.hpp"

namespace tessera::driver {
namespace {

using internal::Layout;
using internal::Rgb;

// A classic public-domain 5x7 font for ASCII 32..126: five column bytes per glyph, bit 0 on top.
const uint8_t kFont[95][5] = {
    {0x00, 0x00, 0x00, 0x00, 0x00}, {0x00, 0x00, 0x5F, 0x00, 0x00}, {0x00, 0x07, 0x00, 0x07, 0x00},
    {0x14, 0x7F, 0x14, 0x7F, 0x14}, {0x24, 0x2A, 0x7F, 0x2A, 0x12}, {0x23, 0x13, 0x08, 0x64, 0x62},
    {0x36, 0x49, 0x55, 0x22, 0x50}, {0x00, 0x05, 0x03, 0x00, 0x00}, {0x00, 0x1C, 0x22, 0x41, 0x00},
    {0x00, 0x41, 0x22, 0x1C, 0x00}, {0x08, 0x2A, 0x1C, 0x2A, 0x08}, {0x08, 0x08, 0x3E, 0x08, 0x08},
    {0x00, 0x50, 0x30, 0x00, 0x00}, {0x08, 0x08, 0x08, 0x08, 0x08}, {0x00, 0x60, 0x60, 0x00, 0x00},
    {0x20, 0x10, 0x08, 0x04, 0x02}, {0x3E, 0x51, 0x49, 0x45, 0x3E}, {0x00, 0x42, 0x7F, 0x40, 0x00},
    {0x42, 0x61, 0x51, 0x49, 0x46}, {0x21, 0x41, 0x45, 0x4B, 0x31}, {0x18, 0x14, 0x12, 0x7F, 0x10},
    {0x27, 0x45, 0x45, 0x45, 0x39}, {0x3C, 0x4A, 0x49, 0x49, 0x30}, {0x01, 0x71, 0x09, 0x05, 0x03},
    {0x36, 0x49, 0x49, 0x49, 0x36}, {0x06, 0x49, 0x49, 0x29, 0x1E}, {0x00, 0x36, 0x36, 0x00, 0x00},
    {0x00, 0x56, 0x36, 0x00, 0x00}, {0x08, 0x14, 0x22, 0x41, 0x00}, {0x14, 0x14, 0x14, 0x14, 0x14},
    {0x00, 0x41, 0x22, 0x14, 0x08}, {0x02, 0x01, 0x51, 0x09, 0x06}, {0x32, 0x49, 0x79, 0x41, 0x3E},
    {0x7E, 0x11, 0x11, 0x11, 0x7E}, {0x7F, 0x49, 0x49, 0x49, 0x36}, {0x3E, 0x41, 0x41, 0x41, 0x22},
    {0x7F, 0x41, 0x41, 0x22, 0x1C}, {0x7F, 0x49, 0x49, 0x49, 0x41}, {0x7F, 0x09, 0x09, 0x09, 0x01},
    {0x3E, 0x41, 0x49, 0x49, 0x7A}, {0x7F, 0x08, 0x08, 0x08, 0x7F}, {0x00, 0x41, 0x7F, 0x41, 0x00},
    {0x20, 0x40, 0x41, 0x3F, 0x01}, {0x7F, 0x08, 0x14, 0x22, 0x41}, {0x7F, 0x40, 0x40, 0x40, 0x40},
    {0x7F, 0x02, 0x0C, 0x02, 0x7F}, {0x7F, 0x04, 0x08, 0x10, 0x7F}, {0x3E, 0x41, 0x41, 0x41, 0x3E},
    {0x7F, 0x09, 0x09, 0x09, 0x06}, {0x3E, 0x41, 0x51, 0x21, 0x5E}, {0x7F, 0x09, 0x19, 0x29, 0x46},
    {0x46, 0x49, 0x49, 0x49, 0x31}, {0x01, 0x01, 0x7F, 0x01, 0x01}, {0x3F, 0x40, 0x40, 0x40, 0x3F},
    {0x1F, 0x20, 0x40, 0x20, 0x1F}, {0x3F, 0x40, 0x38, 0x40, 0x3F}, {0x63, 0x14, 0x08, 0x14, 0x63},
    {0x07, 0x08, 0x70, 0x08, 0x07}, {0x61, 0x51, 0x49, 0x45, 0x43}, {0x00, 0x7F, 0x41, 0x41, 0x00},
    {0x02, 0x04, 0x08, 0x10, 0x20}, {0x00, 0x41, 0x41, 0x7F, 0x00}, {0x04, 0x02, 0x01, 0x02, 0x04},
    {0x40, 0x40, 0x40, 0x40, 0x40}, {0x00, 0x01, 0x02, 0x04, 0x00}, {0x20, 0x54, 0x54, 0x54, 0x78},
    {0x7F, 0x48, 0x44, 0x44, 0x38}, {0x38, 0x44, 0x44, 0x44, 0x20}, {0x38, 0x44, 0x44, 0x48, 0x7F},
    {0x38, 0x54, 0x54, 0x54, 0x18}, {0x08, 0x7E, 0x09, 0x01, 0x02}, {0x0C, 0x52, 0x52, 0x52, 0x3E},
    {0x7F, 0x08, 0x04, 0x04, 0x78}, {0x00, 0x44, 0x7D, 0x40, 0x00}, {0x20, 0x40, 0x44, 0x3D, 0x00},
    {0x7F, 0x10, 0x28, 0x44, 0x00}, {0x00, 0x41, 0x7F, 0x40, 0x00}, {0x7C, 0x04, 0x18, 0x04, 0x78},
    {0x7C, 0x08, 0x04, 0x04, 0x78}, {0x38, 0x44, 0x44, 0x44, 0x38}, {0x7C, 0x14, 0x14, 0x14, 0x08},
    {0x08, 0x14, 0x14, 0x18, 0x7C}, {0x7C, 0x08, 0x04, 0x04, 0x08}, {0x48, 0x54, 0x54, 0x54, 0x20},
    {0x04, 0x3F, 0x44, 0x40, 0x20}, {0x3C, 0x40, 0x40, 0x20, 0x7C}, {0x1C, 0x20, 0x40, 0x20, 0x1C},
    {0x3C, 0x40, 0x30, 0x40, 0x3C}, {0x44, 0x28, 0x10, 0x28, 0x44}, {0x0C, 0x50, 0x50, 0x50, 0x3C},
    {0x44, 0x64, 0x54, 0x4C, 0x44}, {0x00, 0x08, 0x36, 0x41, 0x00}, {0x00, 0x00, 0x7F, 0x00, 0x00},
    {0x00, 0x41, 0x36, 0x08, 0x00}, {0x08, 0x04, 0x08, 0x10, 0x08},
};

class Canvas {
 public:
  Canvas(int w, int h) : img_{w, h, std::vector<uint8_t>(static_cast<size_t>(w) * h * 3, 255)} {}

  void set(int x, int y, Rgb c) {
    if (x < 0 || y < 0 || x >= img_.width || y >= img_.height) return;
    uint8_t* p = &img_.rgb[(static_cast<size_t>(y) * img_.width + x) * 3];
    p[0] = c.r, p[1] = c.g, p[2] = c.b;
  }
  void rect(int x0, int y0, int x1, int y1, Rgb c) {
    for (int y = y0; y <= y1; ++y)
      for (int x = x0; x <= x1; ++x) set(x, y, c);
  }
  // A line `thick` pixels wide (a square brush stamped along a DDA walk).
  void line(double x0, double y0, double x1, double y1, Rgb c, int thick = 1) {
    const int steps = static_cast<int>(std::max(std::fabs(x1 - x0), std::fabs(y1 - y0))) + 1;
    for (int i = 0; i <= steps; ++i) {
      const double t = static_cast<double>(i) / steps;
      const int x = static_cast<int>(std::lround(x0 + (x1 - x0) * t)), y = static_cast<int>(std::lround(y0 + (y1 - y0) * t));
      for (int dy = 0; dy < thick; ++dy)
        for (int dx = 0; dx < thick; ++dx) set(x + dx - thick / 2, y + dy - thick / 2, c);
    }
  }
  // Text with the top-left corner at (x, y); `scale` multiplies the 5x7 cells.
  void text(int x, int y, const std::string& s, Rgb c, int scale = 1) {
    for (char ch : s) {
      const int idx = (ch < 32 || ch > 126) ? '?' - 32 : ch - 32;
      for (int col = 0; col < 5; ++col)
        for (int row = 0; row < 7; ++row)
          if (kFont[idx][col] >> row & 1) rect(x + col * scale, y + row * scale, x + col * scale + scale - 1, y + row * scale + scale - 1, c);
      x += 6 * scale;
    }
  }
  static int text_width(const std::string& s, int scale = 1) { return static_cast<int>(s.size()) * 6 * scale; }
  Image take() { return std::move(img_); }

 private:
  Image img_;
};

constexpr Rgb kInk{51, 51, 51}, kGrid{224, 224, 224};

void draw_axes(Canvas& cv, const Chart& chart, const Layout& l) {
  for (double t : l.yticks) {
    cv.line(l.left, l.py(t), l.right, l.py(t), kGrid);
    std::string s = internal::tick_label(t);
    cv.text(static_cast<int>(l.left) - 6 - Canvas::text_width(s), static_cast<int>(l.py(t)) - 3, s, kInk);
  }
  for (double t : l.xticks) {
    std::string s = internal::tick_label(t);
    cv.text(static_cast<int>(l.px(t)) - Canvas::text_width(s) / 2, static_cast<int>(l.bottom) + 8, s, kInk);
  }
  cv.line(l.left, l.top, l.right, l.top, kInk);
  cv.line(l.left, l.bottom, l.right, l.bottom, kInk);
  cv.line(l.left, l.top, l.left, l.bottom, kInk);
  cv.line(l.right, l.top, l.right, l.bottom, kInk);
  int mid = static_cast<int>((l.left + l.right) / 2);
  cv.text(mid - Canvas::text_width(chart.title, 2) / 2, 12, chart.title, kInk, 2);
  cv.text(mid - Canvas::text_width(chart.x_label) / 2, static_cast<int>(l.bottom) + 28, chart.x_label, kInk);
  cv.text(6, static_cast<int>(l.top) - 14, chart.y_label, kInk);
}

// Fills between `lower` and `y` column by column, interpolating linearly between points.
void fill_area(Canvas& cv, const internal::DrawnSeries& s, const Layout& l, Rgb c) {
  for (size_t k = 0; k + 1 < s.x.size(); ++k) {
    const double xa = l.px(s.x[k]), xb = l.px(s.x[k + 1]);
    for (int x = static_cast<int>(std::ceil(xa)); x <= static_cast<int>(std::floor(xb)); ++x) {
      const double t = xb > xa ? (x - xa) / (xb - xa) : 0.0;
      const double top = l.py(s.y[k] + (s.y[k + 1] - s.y[k]) * t);
      const double bot = l.py(s.lower[k] + (s.lower[k + 1] - s.lower[k]) * t);
      for (int y = static_cast<int>(std::lround(top)); y <= static_cast<int>(std::lround(bot)); ++y) cv.set(x, y, c);
    }
  }
}

}  // namespace

Image render_png_image(const Chart& chart, int width, int height) {
  Canvas cv(width, height);
  auto series = internal::drawn_series(chart);
  Layout l = internal::make_layout(series, width, height);
  draw_axes(cv, chart, l);
  for (size_t i = 0; i < series.size(); ++i) {
    const auto& s = series[i];
    const Rgb c = internal::palette(i);
    if (chart.stacked) {
      fill_area(cv, s, l, c);
    } else {
      for (size_t k = 0; k + 1 < s.x.size(); ++k) {
        if (std::isfinite(s.y[k]) && std::isfinite(s.y[k + 1])) {
          cv.line(l.px(s.x[k]), l.py(s.y[k]), l.px(s.x[k + 1]), l.py(s.y[k + 1]), c, 2);
        }
      }
      if (s.x.size() == 1 && std::isfinite(s.y[0])) cv.rect(static_cast<int>(l.px(s.x[0])) - 2, static_cast<int>(l.py(s.y[0])) - 2, static_cast<int>(l.px(s.x[0])) + 2, static_cast<int>(l.py(s.y[0])) + 2, c);
    }
    const int ly = static_cast<int>(l.top) + 4 + 18 * static_cast<int>(i);
    cv.rect(static_cast<int>(l.right) + 12, ly, static_cast<int>(l.right) + 23, ly + 11, c);
    cv.text(static_cast<int>(l.right) + 30, ly + 2, internal::legend_label(s.name), kInk);
  }
  return cv.take();
}

Status write_png(const Image& image, const std::filesystem::path& path) {
  if (image.width <= 0 || image.height <= 0 ||
      image.rgb.size() != static_cast<size_t>(image.width) * image.height * 3) {
    return make_error(ErrorCode::invalid_argument, "write_png {}: image buffer does not match {}x{}", path.string(),
                      image.width, image.height);
  }
  std::filesystem::path tmp = path;
  tmp += fmt::format(".tmp.{}", ::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return make_error(ErrorCode::io_error, "cannot create {}", tmp.string());
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png != nullptr ? png_create_info_struct(png) : nullptr;
  if (png == nullptr || info == nullptr || setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    std::fclose(f);
    std::filesystem::remove(tmp);
    return make_error(ErrorCode::io_error, "libpng failed writing {}", path.string());
  }
  png_init_io(png, f);
  png_set_IHDR(png, info, static_cast<png_uint_32>(image.width), static_cast<png_uint_32>(image.height), 8,
               PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int y = 0; y < image.height; ++y) {
    png_write_row(png, const_cast<png_bytep>(&image.rgb[static_cast<size_t>(y) * image.width * 3]));
  }
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  const bool ok = std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  std::fclose(f);
  std::error_code ec;
  if (ok) std::filesystem::rename(tmp, path, ec);
  if (!ok || ec) {
    std::filesystem::remove(tmp, ec);
    return make_error(ErrorCode::io_error, "cannot write {}", path.string());
  }
  return Status();
}

}  // namespace tessera::driver
