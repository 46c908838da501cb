// Figures for people: heatmaps side by side with one colour bar (attention weights, positional
// encodings) and line plots (loss curves). A figure is first an SVG document whose text stays
// text (labels, titles and annotations are <text> elements, searchable and editable); PNG and
// PDF are rendered from it by librsvg, which draws with Cairo and lays text out with Pango.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qkv::plot {

/// A file format for a figure.
enum class Format { svg, png, pdf };

/// The format a file name's extension names (.svg, .png or .pdf, any case), or nullopt.
std::optional<Format> format_of(std::string_view path);
/// The extension of `format`, without the dot: "svg", "png", "pdf".
const char* extension(Format format);

/// How values map to colours.
enum class Colormap {
  blues,     ///< white to dark blue (seaborn's 'Blues'): weights, probabilities
  viridis,   ///< dark violet to yellow, perceptually uniform
  red_blue,  ///< diverging, blue below the middle and red above (matplotlib's 'RdBu_r'): signed values
};

/// The sRGB colour of `t` in [0, 1] on `map` (t outside is clamped, NaN is 0).
std::uint32_t colour(Colormap map, double t);

/// One panel: a rows x cols matrix drawn as cells, rows top to bottom.
struct Heatmap {
  std::string title;                            ///< above the panel ("head 1")
  std::int64_t rows = 0, cols = 0;              ///< the matrix's shape
  std::vector<double> values;                   ///< rows * cols values, row-major
  std::vector<std::string> x_labels, y_labels;  ///< one per column / row; empty: numbered ticks
  std::string x_name, y_name;                   ///< the axes' names ("key", "query")
  std::vector<std::uint8_t> masked;             ///< empty, or rows * cols flags: nonzero cells are hatched grey
};

/// Whether values are written in the cells.
enum class Annotate { automatic, always, never };

/// Panels side by side (`columns` to a row), sharing one colour scale and one colour bar.
struct HeatmapFigure {
  std::string title;            ///< above all panels; may be empty
  std::vector<Heatmap> panels;  ///< at least one
  double lo = 0, hi = 0;        ///< the colour scale; lo == hi: fitted to the panels' values
  Colormap colormap = Colormap::blues;
  std::string bar_label;                    ///< beside the colour bar ("weight")
  Annotate annotate = Annotate::automatic;  ///< automatic: when every panel is at most 16 x 16
  int digits = 3;                           ///< decimals of annotations (seaborn's fmt='.3f')
  int columns = 4;                          ///< panels to a row before the next row starts
};

/// A line through ys[0], ys[1], ... over x = 1, 2, ..., with an optional dashed reference level.
struct LinePlot {
  std::string title, x_name, y_name;
  std::vector<double> ys;            ///< at least one value
  std::optional<double> reference;   ///< e.g. the loss of guessing
  std::string reference_label;       ///< written at the reference line's right end
  double width = 640, height = 360;  ///< the figure's size in SVG pixels
};

/// The figure as a standalone SVG document.
std::string to_svg(const HeatmapFigure& figure);
std::string to_svg(const LinePlot& plot);

/// An SVG document as the bytes of `format`: itself for svg; a PNG with `scale` pixels per SVG
/// pixel; a PDF with one point per SVG pixel at 96 dpi (vector, text as text). Throws
/// std::runtime_error if librsvg cannot read the document.
std::string render(const std::string& svg, Format format, double scale = 2);

/// Width and height of a PNG file's bytes, or nullopt for bytes that are not PNG.
std::optional<std::pair<std::int64_t, std::int64_t>> png_size(std::string_view bytes);

/// `text` as a figure can show it: valid UTF-8, each byte of a broken sequence (a byte-level
/// token's piece of a character) and each control character replaced by U+FFFD.
std::string displayable(std::string_view text);

/// Width in SVG pixels of `text` in the figures' font (DejaVu Sans) at `size` pixels, as Pango
/// lays it out: what placing labels needs.
double text_width(std::string_view text, double size, bool bold = false);

}  // namespace qkv::plot
