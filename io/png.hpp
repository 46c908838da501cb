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
/// The PNG file's bytes (for writing several files all or none through io::OutputBatch).
std::string encode_png(const Image& image);
/// Reads back width and height of a PNG (for tests); throws IoError for a file that is not one.
std::pair<std::int64_t, std::int64_t> png_size(const std::string& path);

/// A heatmap of a rows x cols matrix (row-major `values`), `cell` pixels per entry, colours from
/// the viridis map over [lo, hi] (lo == hi: the matrix's own range). Rows run top to bottom.
/// Cells where `masked` (same layout) is nonzero are drawn light grey with a hatch, apart from any
/// colour of the map.
Image heatmap(const std::vector<double>& values, std::int64_t rows, std::int64_t cols, std::int64_t cell, double lo = 0, double hi = 0,
              const std::vector<std::uint8_t>* masked = nullptr);
/// A vertical viridis colour bar for [lo, hi] (hi at the top), `height` pixels of colour, with
/// tick labels at lo, the middle and hi and `label` above it.
Image colour_bar(double lo, double hi, std::int64_t height, const std::string& label);
/// A line plot of `ys` (x = index) with axes, tick labels and the axes' names, width x height.
Image line_plot(const std::vector<double>& ys, std::int64_t width, std::int64_t height, const std::string& x_name = "",
                const std::string& y_name = "");
/// Draws `text` (digits, letters, a few signs; 5x7 pixels a glyph, `scale` times) at (x, y);
/// `vertical` stacks the letters top to bottom.
void draw_text(Image& image, std::int64_t x, std::int64_t y, const std::string& text, int scale = 1, bool vertical = false);
/// Width in pixels of `text` drawn at `scale`.
std::int64_t text_width(const std::string& text, int scale = 1);
/// A short label for a tick value: "0", "0.25", "1.5e-03".
std::string tick_label(double v);

}  // namespace qkv::io
