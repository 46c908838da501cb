// PNG writing with libpng, and the plots the tool draws.
#include "io/png.hpp"

#include <png.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <csetjmp>
#include <cstdio>

#include "io/file.hpp"
#include "ir/error.hpp"

namespace qkv::io {

void Image::set(std::int64_t x, std::int64_t y, std::uint8_t r, std::uint8_t g, std::uint8_t b) {
  if (x < 0 || y < 0 || x >= width || y >= height) return;
  auto* p = rgb.data() + (y * width + x) * 3;
  p[0] = r;
  p[1] = g;
  p[2] = b;
}

void Image::paste(const Image& other, std::int64_t x, std::int64_t y) {
  for (std::int64_t j = 0; j < other.height; ++j)
    for (std::int64_t i = 0; i < other.width; ++i) {
      const auto* p = other.rgb.data() + (j * other.width + i) * 3;
      set(x + i, y + j, p[0], p[1], p[2]);
    }
}

void write_png(const std::string& path, const Image& image) { write_file_atomic(path, encode_png(image)); }

std::string encode_png(const Image& image) {
  std::string bytes;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (!png || !info || setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    throw IoError("PNG encoding failed");
  }
  png_set_write_fn(
      png, &bytes,
      [](png_structp p, png_bytep data, png_size_t n) { static_cast<std::string*>(png_get_io_ptr(p))->append(reinterpret_cast<char*>(data), n); },
      nullptr);
  png_set_IHDR(png, info, static_cast<png_uint_32>(image.width), static_cast<png_uint_32>(image.height), 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (std::int64_t y = 0; y < image.height; ++y) png_write_row(png, const_cast<png_bytep>(image.rgb.data() + y * image.width * 3));
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return bytes;
}

std::pair<std::int64_t, std::int64_t> png_size(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw IoError(path + ": cannot open");
  unsigned char h[24] = {};
  const bool read = std::fread(h, 1, sizeof h, f) == sizeof h;
  std::fclose(f);
  if (!read || png_sig_cmp(h, 0, 8) != 0) throw IoError(path + ": not a PNG file");
  auto be32 = [&](int o) { return (std::int64_t{h[o]} << 24) | (std::int64_t{h[o + 1]} << 16) | (std::int64_t{h[o + 2]} << 8) | h[o + 3]; };
  return {be32(16), be32(20)};
}

namespace {

/// Viridis at t in [0, 1], interpolated between nine of its colours.
std::array<std::uint8_t, 3> viridis(double t) {
  static constexpr std::array<std::array<double, 3>, 9> stops = {
      {{68, 1, 84}, {72, 40, 120}, {62, 74, 137}, {49, 104, 142}, {38, 130, 142}, {31, 158, 137}, {53, 183, 121}, {109, 205, 89}, {253, 231, 37}}};
  if (!(t >= 0)) t = 0;  // NaN too
  t = std::min(t, 1.0) * static_cast<double>(stops.size() - 1);
  const auto i = std::min(static_cast<std::size_t>(t), stops.size() - 2);
  const double f = t - static_cast<double>(i);
  std::array<std::uint8_t, 3> c{};
  for (std::size_t k = 0; k < 3; ++k) c[k] = static_cast<std::uint8_t>(std::lround(stops[i][k] * (1 - f) + stops[i + 1][k] * f));
  return c;
}

/// 5x7 glyphs, one byte a row (bit 4 is the left column).
struct Glyph {
  char c;
  std::array<std::uint8_t, 7> rows;
};
constexpr Glyph kFont[] = {
    {'0', {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}}, {'1', {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'2', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}}, {'3', {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E}},
    {'4', {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}}, {'5', {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E}},
    {'6', {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}}, {'7', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}},
    {'8', {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}}, {'9', {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}},
    {'A', {0x0E, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}}, {'B', {0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E}},
    {'C', {0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E}}, {'D', {0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C}},
    {'E', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F}}, {'F', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10}},
    {'G', {0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F}}, {'H', {0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}},
    {'I', {0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}}, {'J', {0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C}},
    {'K', {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11}}, {'L', {0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F}},
    {'M', {0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11}}, {'N', {0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11}},
    {'O', {0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}}, {'P', {0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10}},
    {'Q', {0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D}}, {'R', {0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11}},
    {'S', {0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E}}, {'T', {0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04}},
    {'U', {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}}, {'V', {0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04}},
    {'W', {0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A}}, {'X', {0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11}},
    {'Y', {0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04}}, {'Z', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F}},
    {'.', {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C}}, {'-', {0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00}},
    {':', {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00}}, {'/', {0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00}},
    {'_', {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1F}}, {'=', {0x00, 0x00, 0x1F, 0x00, 0x1F, 0x00, 0x00}},
    {'(', {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02}}, {')', {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08}},
    {'+', {0x00, 0x04, 0x04, 0x1F, 0x04, 0x04, 0x00}}, {',', {0x00, 0x00, 0x00, 0x00, 0x0C, 0x04, 0x08}},
    {'>', {0x08, 0x04, 0x02, 0x01, 0x02, 0x04, 0x08}}, {'<', {0x02, 0x04, 0x08, 0x10, 0x08, 0x04, 0x02}},
    {'[', {0x0E, 0x08, 0x08, 0x08, 0x08, 0x08, 0x0E}}, {']', {0x0E, 0x02, 0x02, 0x02, 0x02, 0x02, 0x0E}},
    {'%', {0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03}},
};

}  // namespace

void draw_text(Image& image, std::int64_t x, std::int64_t y, const std::string& text, int scale, bool vertical) {
  for (char ch : text) {
    const char c = (ch >= 'a' && ch <= 'z') ? static_cast<char>(ch - 'a' + 'A') : ch;
    for (const auto& g : kFont) {
      if (g.c != c) continue;
      for (int r = 0; r < 7; ++r)
        for (int col = 0; col < 5; ++col)
          if (g.rows[static_cast<std::size_t>(r)] & (0x10 >> col))
            for (int dy = 0; dy < scale; ++dy)
              for (int dx = 0; dx < scale; ++dx) image.set(x + (col * scale) + dx, y + r * scale + dy, 0, 0, 0);
    }
    (vertical ? y : x) += (vertical ? 9 : 6) * scale;
  }
}

std::int64_t text_width(const std::string& text, int scale) { return static_cast<std::int64_t>(text.size()) * 6 * scale; }

std::string tick_label(double v) {
  char buf[32];
  if (v == 0) return "0";
  if (std::abs(v) >= 1e-2 && std::abs(v) < 1e4) std::snprintf(buf, sizeof buf, "%.3g", v);
  else std::snprintf(buf, sizeof buf, "%.1e", v);
  return buf;
}

Image heatmap(const std::vector<double>& values, std::int64_t rows, std::int64_t cols, std::int64_t cell, double lo, double hi,
              const std::vector<std::uint8_t>* masked) {
  if (lo == hi && !values.empty()) {
    auto [mn, mx] = std::minmax_element(values.begin(), values.end());
    lo = *mn;
    hi = *mx;
  }
  const double span = hi > lo ? hi - lo : 1.0;
  Image img(cols * cell, rows * cell);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) {
      const auto k = static_cast<std::size_t>(i * cols + j);
      const bool hidden = masked && (*masked)[k];
      auto c = viridis((values[k] - lo) / span);
      for (std::int64_t y = 0; y < cell; ++y)
        for (std::int64_t x = 0; x < cell; ++x) {
          if (hidden) {
            const std::uint8_t g = (x + y) % 6 == 0 ? 170 : 225;  // grey with a hatch: "no weight here"
            img.set(j * cell + x, i * cell + y, g, g, g);
          } else {
            img.set(j * cell + x, i * cell + y, c[0], c[1], c[2]);
          }
        }
    }
  return img;
}

Image colour_bar(double lo, double hi, std::int64_t height, const std::string& label) {
  const std::int64_t bar = 16, top = 14;
  const std::string labels[3] = {tick_label(hi), tick_label((lo + hi) / 2), tick_label(lo)};
  std::int64_t text = text_width(label);
  for (const auto& l : labels) text = std::max(text, bar + 6 + text_width(l));
  Image img(text + 2, height + top + 4);
  draw_text(img, 0, 0, label);
  for (std::int64_t y = 0; y < height; ++y) {
    auto c = viridis(1.0 - static_cast<double>(y) / static_cast<double>(std::max<std::int64_t>(height - 1, 1)));
    for (std::int64_t x = 0; x < bar; ++x) img.set(x, top + y, c[0], c[1], c[2]);
  }
  for (int t = 0; t < 3; ++t) {
    const std::int64_t y = top + (height - 1) * t / 2;
    for (std::int64_t x = bar; x < bar + 4; ++x) img.set(x, y, 0, 0, 0);
    draw_text(img, bar + 6, std::clamp<std::int64_t>(y - 3, top, top + height - 7), labels[t]);
  }
  return img;
}

Image line_plot(const std::vector<double>& ys, std::int64_t width, std::int64_t height, const std::string& x_name, const std::string& y_name) {
  Image img(width, height);
  auto [mn, mx] = ys.empty() ? std::pair{ys.end(), ys.end()} : std::minmax_element(ys.begin(), ys.end());
  const double lo = ys.empty() ? 0.0 : std::min(0.0, *mn), hi = ys.empty() ? 1.0 : (*mx > lo ? *mx : lo + 1);
  const std::string y_ticks[3] = {tick_label(hi), tick_label((lo + hi) / 2), tick_label(lo)};
  std::int64_t tick_w = 0;
  for (const auto& t : y_ticks) tick_w = std::max(tick_w, text_width(t));
  const std::int64_t left = 14 + tick_w + 8, right = 12, top = 8, bottom = 30;
  if (!y_name.empty()) draw_text(img, 2, top + (height - top - bottom) / 2 - 9 * static_cast<std::int64_t>(y_name.size()) / 2, y_name, 1, true);
  for (std::int64_t x = left; x < width - right; ++x) img.set(x, height - bottom, 0, 0, 0);
  for (std::int64_t y = top; y <= height - bottom; ++y) img.set(left, y, 0, 0, 0);
  for (int t = 0; t < 3; ++t) {
    const std::int64_t y = top + (height - bottom - top) * t / 2;
    for (std::int64_t x = left - 4; x < left; ++x) img.set(x, y, 0, 0, 0);
    draw_text(img, left - 6 - text_width(y_ticks[t]), std::max<std::int64_t>(y - 3, 0), y_ticks[t]);
  }
  const std::size_t last = ys.empty() ? 0 : ys.size() - 1;
  for (int t = 0; t < 3; ++t) {
    const std::size_t step = last * static_cast<std::size_t>(t) / 2;
    const std::int64_t x =
        left + static_cast<std::int64_t>(step) * (width - left - right - 1) / static_cast<std::int64_t>(std::max<std::size_t>(last, 1));
    for (std::int64_t y = height - bottom; y < height - bottom + 4; ++y) img.set(x, y, 0, 0, 0);
    const std::string label = std::to_string(step);
    draw_text(img, std::clamp<std::int64_t>(x - text_width(label) / 2, 0, width - text_width(label)), height - bottom + 6, label);
  }
  if (!x_name.empty()) draw_text(img, left + (width - left - right) / 2 - text_width(x_name) / 2, height - 10, x_name);
  if (ys.empty()) return img;
  auto px = [&](std::size_t i) {
    return left + static_cast<std::int64_t>(std::lround(static_cast<double>(i) * static_cast<double>(width - left - right - 1) /
                                                        static_cast<double>(std::max<std::size_t>(ys.size() - 1, 1))));
  };
  auto py = [&](double v) { return top + static_cast<std::int64_t>(std::lround((hi - v) / (hi - lo) * static_cast<double>(height - top - bottom))); };
  for (std::size_t i = 0; i + 1 < std::max<std::size_t>(ys.size(), 2); ++i) {
    const std::size_t j = std::min(i + 1, ys.size() - 1);
    const std::int64_t x0 = px(i), x1 = px(j), y0 = py(ys[i]), y1 = py(ys[j]);
    const std::int64_t steps = std::max<std::int64_t>({std::abs(x1 - x0), std::abs(y1 - y0), 1});
    for (std::int64_t s = 0; s <= steps; ++s) img.set(x0 + (x1 - x0) * s / steps, y0 + (y1 - y0) * s / steps, 31, 119, 180);
  }
  return img;
}

}  // namespace qkv::io
