// PNG images for plots: heatmaps of matrices and line plots, written with libpng.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qkv::io {

/// An 8-bit RGB image, row-major.
struct Image {
  std::int64_t width = 0, height = 0;
  std::vector<std::uint8_t> rgb;  // 3 bytes per pixel
  Image(std::int64_t w, std::int64_t h, std::uint8_t fill = 255) : width(w), height(h), rgb(static_cast<std::size_t>(w * h * 3), fill) {}
  void set(std::int64_t x, std::int64_t y, std::uint8_t r, std::uint8_t g, std::uint8_t b);
  /// Copies `other` with its top-left corner at (x, y), clipped.
  void paste(const Image& other, std::int64_t x, std::int64_t y);
};

/// Writes `image` as PNG through a temporary file renamed into place; throws IoError.
void write_png(const std::string& path, const Image& image);
/// Reads back width and height of a PNG (for tests); throws IoError for a file that is not one.
std::pair<std::int64_t, std::int64_t> png_size(const std::string& path);

/// A heatmap of a rows x cols matrix (row-major `values`), `cell` pixels per entry, colours from
/// the viridis map over [lo, hi] (lo == hi: the matrix's own range). Rows run top to bottom.
Image heatmap(const std::vector<double>& values, std::int64_t rows, std::int64_t cols, std::int64_t cell, double lo = 0, double hi = 0);
/// A line plot of `ys` (x = index) on a white background with axes, width x height pixels.
Image line_plot(const std::vector<double>& ys, std::int64_t width, std::int64_t height);
/// Draws `text` (digits, letters, a few signs; 5x7 pixels a glyph, `scale` times) at (x, y).
void draw_text(Image& image, std::int64_t x, std::int64_t y, const std::string& text, int scale = 1);

}  // namespace qkv::io
