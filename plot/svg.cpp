// Figures laid out and written as SVG: heatmap panels with their labels, a shared colour bar, and
// line plots with ticked axes. Text is measured with the font the renderer draws it in
// (text_width), so labels are placed, rotated or thinned out where they would collide.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <stdexcept>

#include "plot/cairo_bytes.hpp"
#include "plot/figure.hpp"

namespace qkv::plot {

namespace {

constexpr double kLabelSize = 12, kAnnotationSize = 11, kTitleSize = 14, kFigureTitleSize = 16;
constexpr const char* kInk = "#262626";
constexpr const char* kFont = "DejaVu Sans, Verdana, sans-serif";
constexpr std::size_t kLongestLabel = 32;  // characters of a label drawn; longer ones end in an ellipsis

std::string escaped(std::string_view raw) {
  std::string out;
  for (char c : displayable(raw)) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

/// A coordinate: two decimals at most, no trailing zeros.
std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", std::abs(v) < 0.005 ? 0.0 : v);
  std::string s(buf);
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s;
}

std::string hex(std::uint32_t rgb) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%06x", rgb & 0xffffffu);
  return buf;
}

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  std::string s(buf);
  if (s.find_first_not_of("-0.") == std::string::npos && s[0] == '-') s.erase(0, 1);  // "-0.000" is 0
  return s;
}

/// A label cut to kLongestLabel characters (whole UTF-8 sequences), with an ellipsis if cut.
std::string shortened(const std::string& s) {
  std::size_t chars = 0, i = 0;
  for (; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xc0) != 0x80 && chars++ == kLongestLabel) break;
  }
  return i < s.size() ? s.substr(0, i) + "\u2026" : s;
}

/// About `target` round-valued ticks covering [lo, hi] (steps 1, 2 or 5 times a power of ten).
std::vector<double> nice_ticks(double lo, double hi, int target, double* step_out = nullptr) {
  const double span = hi - lo;
  if (!(span > 0) || !std::isfinite(span)) {
    if (step_out) *step_out = 1;
    return {lo};
  }
  const double raw = span / target, magnitude = std::pow(10.0, std::floor(std::log10(raw))), r = raw / magnitude;
  const double step = (r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10) * magnitude;
  if (step_out) *step_out = step;
  std::vector<double> ticks;
  for (double k = std::ceil(lo / step - 1e-9); k * step <= hi + step * 1e-9; k += 1) ticks.push_back(k * step == 0 ? 0.0 : k * step);
  return ticks;
}

/// Decimals that tell ticks `step` apart.
int decimals_for(double step) { return std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9))); }

class Svg {
 public:
  void text(double x, double y, std::string_view s, double size, const char* anchor, const char* cls, double rotate = 0, bool bold = false,
            const char* fill = kInk) {
    body_ += "<text class=\"" + std::string(cls) + "\" x=\"" + num(x) + "\" y=\"" + num(y) + "\" font-size=\"" + num(size) + "\"";
    if (std::string_view(anchor) != "start") body_ += " text-anchor=\"" + std::string(anchor) + "\"";
    if (rotate != 0) body_ += " transform=\"rotate(" + num(rotate) + " " + num(x) + " " + num(y) + ")\"";
    if (bold) body_ += " font-weight=\"bold\"";
    if (std::string_view(fill) != kInk) body_ += " fill=\"" + std::string(fill) + "\"";
    body_ += ">" + escaped(s) + "</text>\n";
  }
  /// Text centred vertically on y (the baseline put a third of the size below).
  void centred(double x, double y, std::string_view s, double size, const char* anchor, const char* cls, double rotate = 0, bool bold = false,
               const char* fill = kInk) {
    if (rotate == 0) y += 0.36 * size;
    else x += 0.36 * size;  // turned a quarter: "below" the baseline is to the right
    text(x, y, s, size, anchor, cls, rotate, bold, fill);
  }
  void rect(double x, double y, double w, double h, const std::string& fill, const std::string& extra = "") {
    body_ +=
        "<rect x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" + num(w) + "\" height=\"" + num(h) + "\" fill=\"" + fill + "\"" + extra + "/>\n";
  }
  void line(double x1, double y1, double x2, double y2, const char* stroke, double width = 1, const char* extra = "") {
    body_ += "<line x1=\"" + num(x1) + "\" y1=\"" + num(y1) + "\" x2=\"" + num(x2) + "\" y2=\"" + num(y2) + "\" stroke=\"" + stroke +
             "\" stroke-width=\"" + num(width) + "\"" + extra + "/>\n";
  }
  void raw(const std::string& s) { body_ += s; }
  std::string document(double width, double height, const std::string& defs = "") const {
    const std::string w = num(std::ceil(width)), h = num(std::ceil(height));
    return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + w + "\" height=\"" + h +
           "\" viewBox=\"0 0 " + w + " " + h + "\" font-family=\"" + kFont + "\">\n" + (defs.empty() ? "" : "<defs>\n" + defs + "</defs>\n") +
           "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n" + body_ + "</svg>\n";
  }

 private:
  std::string body_;
};

std::string base64(const std::string& bytes) {
  static constexpr char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  std::size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const unsigned v =
        (static_cast<unsigned char>(bytes[i]) << 16) | (static_cast<unsigned char>(bytes[i + 1]) << 8) | static_cast<unsigned char>(bytes[i + 2]);
    for (int s : {18, 12, 6, 0}) out += digits[(v >> s) & 63];
  }
  if (i < bytes.size()) {
    const unsigned v = (static_cast<unsigned char>(bytes[i]) << 16) | (i + 1 < bytes.size() ? static_cast<unsigned char>(bytes[i + 1]) << 8 : 0);
    out += digits[(v >> 18) & 63];
    out += digits[(v >> 12) & 63];
    out += i + 1 < bytes.size() ? digits[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

/// The cells of a large matrix as one PNG, `cell` pixels an entry (cheaper than a rect each).
std::string cells_png(const Heatmap& m, const std::vector<std::uint32_t>& colours, int cell) {
  const int w = static_cast<int>(m.cols) * cell, h = static_cast<int>(m.rows) * cell;
  std::unique_ptr<cairo_surface_t, decltype(&cairo_surface_destroy)> s(cairo_image_surface_create(CAIRO_FORMAT_RGB24, w, h), cairo_surface_destroy);
  if (cairo_surface_status(s.get()) != CAIRO_STATUS_SUCCESS)  // past 32767 pixels a side, or out of memory
    throw std::runtime_error("a heatmap of " + std::to_string(m.rows) + " x " + std::to_string(m.cols) + " cells is too large to draw (" +
                             cairo_status_to_string(cairo_surface_status(s.get())) + ")");
  cairo_surface_flush(s.get());
  unsigned char* data = cairo_image_surface_get_data(s.get());
  const int stride = cairo_image_surface_get_stride(s.get());
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      reinterpret_cast<std::uint32_t*>(data + static_cast<std::ptrdiff_t>(y) * stride)[x] =
          colours[static_cast<std::size_t>(y / cell * m.cols + x / cell)];
  cairo_surface_mark_dirty(s.get());
  return detail::png_bytes(s.get());
}

/// Where one panel's parts go, relative to its top-left corner. Every panel of a figure shares it.
struct PanelLayout {
  double cell = 0;                        // pixels an entry
  bool annotate = false;                  // values written in the cells
  std::int64_t x_every = 1, y_every = 1;  // a tick label every so many columns / rows
  bool rotate_x = false;                  // key labels turned 45 degrees
  double map_x = 0, map_y = 0;            // the matrix's top-left corner
  double map_w = 0, map_h = 0;
  double width = 0, height = 0;  // the whole panel
};

std::vector<std::string> tick_texts(const std::vector<std::string>& labels, std::int64_t n) {
  std::vector<std::string> out;
  for (std::int64_t i = 0; i < n; ++i)
    out.push_back(static_cast<std::size_t>(i) < labels.size() ? shortened(labels[static_cast<std::size_t>(i)]) : std::to_string(i));
  return out;
}

/// Every `every`-th label, `every` a 1-2-5 step, so that labels `extent` pixels long fit cells
/// `cell` pixels apart.
std::int64_t thinning(double extent, double cell) {
  for (std::int64_t every = 1;; every *= 10)
    for (std::int64_t k : {1, 2, 5})
      if (static_cast<double>(every * k) * cell >= extent) return every * k;
}

PanelLayout layout_panels(const HeatmapFigure& f) {
  PanelLayout l;
  std::int64_t rows = 0, cols = 0;
  double widest_value = 0, widest_x = 0, widest_y = 0;
  bool x_name = false, y_name = false, titled = false;
  for (const Heatmap& p : f.panels) {
    rows = std::max(rows, p.rows), cols = std::max(cols, p.cols);
    for (const auto& s : tick_texts(p.x_labels, p.cols)) widest_x = std::max(widest_x, text_width(s, kLabelSize));
    for (const auto& s : tick_texts(p.y_labels, p.rows)) widest_y = std::max(widest_y, text_width(s, kLabelSize));
    x_name |= !p.x_name.empty(), y_name |= !p.y_name.empty(), titled |= !p.title.empty();
  }
  l.annotate = f.annotate == Annotate::always || (f.annotate == Annotate::automatic && rows <= 16 && cols <= 16);
  if (l.annotate) {
    for (const Heatmap& p : f.panels)
      for (double v : p.values) widest_value = std::max(widest_value, text_width(fixed(v, f.digits), kAnnotationSize));
    l.cell = std::ceil(std::max(30.0, widest_value + 10));
  } else {
    l.cell = std::clamp(std::floor(480.0 / static_cast<double>(std::max(rows, cols))), 1.0, 28.0);
  }
  l.y_every = thinning(kLabelSize + 2, l.cell);
  l.x_every = thinning(kLabelSize + 2, l.cell);
  // Words turn 45 degrees when they do not fit level; numbers are thinned out until they do.
  const bool words = std::any_of(f.panels.begin(), f.panels.end(), [](const Heatmap& p) { return !p.x_labels.empty(); });
  l.rotate_x = words && widest_x + 6 > l.cell * static_cast<double>(l.x_every);
  if (!l.rotate_x) l.x_every = thinning(widest_x + 6, l.cell);
  const double x_band = l.rotate_x ? (widest_x + kLabelSize) * 0.7071 + 8 : kLabelSize + 8;
  l.map_w = static_cast<double>(cols) * l.cell, l.map_h = static_cast<double>(rows) * l.cell;
  l.map_x = (y_name ? 22 : 4) + widest_y + 8;
  l.map_y = titled ? 26 : 6;
  l.width = l.map_x + l.map_w + (l.rotate_x ? 0 : widest_x / 2) + 18;
  l.height = l.map_y + l.map_h + x_band + (x_name ? 22 : 4);
  return l;
}

void draw_panel(Svg& svg, const HeatmapFigure& f, const Heatmap& p, const PanelLayout& l, double ox, double oy, bool y_named, double lo, double hi,
                std::string& defs) {
  const double mx = ox + l.map_x, my = oy + l.map_y;
  if (!p.title.empty()) svg.text(mx + l.map_w / 2, oy + 18, p.title, kTitleSize, "middle", "title");
  std::vector<std::uint32_t> colours(p.values.size());
  for (std::size_t i = 0; i < p.values.size(); ++i) colours[i] = colour(f.colormap, (p.values[i] - lo) / (hi - lo));
  const auto masked = [&](std::size_t i) { return !p.masked.empty() && p.masked[i]; };
  if (p.rows * p.cols <= 80 * 80) {
    svg.raw("<g class=\"cells\" shape-rendering=\"crispEdges\">\n");
    for (std::int64_t r = 0; r < p.rows; ++r)
      for (std::int64_t c = 0; c < p.cols; ++c) {
        const auto i = static_cast<std::size_t>(r * p.cols + c);
        svg.rect(mx + static_cast<double>(c) * l.cell, my + static_cast<double>(r) * l.cell, l.cell, l.cell,
                 masked(i) ? "url(#hatch)" : hex(colours[i]));
      }
    svg.raw("</g>\n");
  } else {
    std::vector<std::uint32_t> px = colours;
    for (std::size_t i = 0; i < px.size(); ++i)
      if (masked(i)) px[i] = 0xe6e6e6;
    const int cell = static_cast<int>(l.cell);
    svg.raw("<image class=\"cells\" x=\"" + num(mx) + "\" y=\"" + num(my) + "\" width=\"" + num(l.map_w) + "\" height=\"" + num(l.map_h) +
            "\" image-rendering=\"optimizeSpeed\" href=\"data:image/png;base64," + base64(cells_png(p, px, cell)) + "\"/>\n");
  }
  if (!p.masked.empty() && defs.empty())
    defs =
        "<pattern id=\"hatch\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" patternTransform=\"rotate(45)\">"
        "<rect width=\"6\" height=\"6\" fill=\"#eeeeee\"/><line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#bbbbbb\" "
        "stroke-width=\"2\"/></pattern>\n";
  if (l.annotate)
    for (std::int64_t r = 0; r < p.rows; ++r)
      for (std::int64_t c = 0; c < p.cols; ++c) {
        const auto i = static_cast<std::size_t>(r * p.cols + c);
        if (masked(i)) continue;
        const std::uint32_t rgb = colours[i];
        const double luminance = (0.2126 * ((rgb >> 16) & 0xff) + 0.7152 * ((rgb >> 8) & 0xff) + 0.0722 * (rgb & 0xff)) / 255;
        svg.centred(mx + (static_cast<double>(c) + 0.5) * l.cell, my + (static_cast<double>(r) + 0.5) * l.cell, fixed(p.values[i], f.digits),
                    kAnnotationSize, "middle", "annotation", 0, false, luminance < 0.5 ? "#ffffff" : kInk);
      }
  // Tick labels: keys under the matrix (turned when long), queries at its left, then the axes' names.
  const auto xs = tick_texts(p.x_labels, p.cols), ys = tick_texts(p.y_labels, p.rows);
  const double below = my + l.map_h;
  double x_band = kLabelSize + 8;
  for (std::int64_t c = 0; c < p.cols; c += l.x_every) {
    const double x = mx + (static_cast<double>(c) + 0.5) * l.cell;
    svg.line(x, below, x, below + 3, kInk);
    const auto& s = xs[static_cast<std::size_t>(c)];
    if (l.rotate_x) {
      svg.text(x + 0.25 * kLabelSize, below + 8, s, kLabelSize, "end", "xtick", -45);
      x_band = std::max(x_band, (text_width(s, kLabelSize) + kLabelSize) * 0.7071 + 8);
    } else {
      svg.text(x, below + 5 + kLabelSize, s, kLabelSize, "middle", "xtick");
    }
  }
  for (std::int64_t r = 0; r < p.rows; r += l.y_every) {
    const double y = my + (static_cast<double>(r) + 0.5) * l.cell;
    svg.line(mx - 3, y, mx, y, kInk);
    svg.centred(mx - 6, y, ys[static_cast<std::size_t>(r)], kLabelSize, "end", "ytick");
  }
  if (!p.x_name.empty()) svg.text(mx + l.map_w / 2, below + x_band + 14, p.x_name, kLabelSize, "middle", "axis-name");
  if (!p.y_name.empty() && y_named) svg.centred(ox + 10, my + l.map_h / 2, p.y_name, kLabelSize, "middle", "axis-name", -90);
}

/// The colour bar for [lo, hi] with its ticks and label, at (x, y), `height` tall; its right edge.
double draw_colour_bar(Svg& svg, std::string& defs, const HeatmapFigure& f, double lo, double hi, double x, double y, double height) {
  constexpr double width = 16;
  std::string gradient = "<linearGradient id=\"bar\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">";
  for (int s = 0; s <= 16; ++s) gradient += "<stop offset=\"" + num(s / 16.0) + "\" stop-color=\"" + hex(colour(f.colormap, s / 16.0)) + "\"/>";
  defs += gradient + "</linearGradient>\n";
  svg.rect(x, y, width, height, "url(#bar)", " class=\"colour-bar\"");
  double step = 1, widest_tick = 0;
  for (double t : nice_ticks(lo, hi, 5, &step)) {
    const double at = y + height * (hi - t) / (hi - lo);
    const std::string s = fixed(t, decimals_for(step));
    svg.line(x + width, at, x + width + 3, at, kInk);
    svg.centred(x + width + 6, at, s, kLabelSize - 1, "start", "bar-tick");
    widest_tick = std::max(widest_tick, text_width(s, kLabelSize - 1));
  }
  const double label_x = x + width + 10 + widest_tick + 8;
  if (!f.bar_label.empty()) svg.centred(label_x, y + height / 2, f.bar_label, kLabelSize, "middle", "axis-name", -90);
  return label_x + 12;
}

/// The colour scale: the figure's, or its panels' range of finite, unmasked values.
std::pair<double, double> colour_range(const HeatmapFigure& f) {
  if (f.lo < f.hi) return {f.lo, f.hi};
  double lo = INFINITY, hi = -INFINITY;
  for (const Heatmap& p : f.panels)
    for (std::size_t i = 0; i < p.values.size(); ++i)
      if (std::isfinite(p.values[i]) && (p.masked.empty() || !p.masked[i])) lo = std::min(lo, p.values[i]), hi = std::max(hi, p.values[i]);
  if (!(lo < hi)) lo = std::isfinite(lo) ? lo - 0.5 : 0, hi = lo + 1;
  return {lo, hi};
}

}  // namespace

std::string to_svg(const HeatmapFigure& f) {
  if (f.panels.empty()) throw std::invalid_argument("a heatmap figure needs a panel");
  for (const Heatmap& p : f.panels)
    if (p.rows < 1 || p.cols < 1 || static_cast<std::int64_t>(p.values.size()) != p.rows * p.cols ||
        (!p.masked.empty() && p.masked.size() != p.values.size()))
      throw std::invalid_argument("heatmap '" + p.title + "': " + std::to_string(p.values.size()) + " values for " + std::to_string(p.rows) + " x " +
                                  std::to_string(p.cols));
  const auto [lo, hi] = colour_range(f);
  const PanelLayout l = layout_panels(f);
  const int columns = std::max(1, std::min(f.columns, static_cast<int>(f.panels.size())));
  const double top = f.title.empty() ? 4 : 34;
  Svg svg;
  std::string defs;
  for (std::size_t i = 0; i < f.panels.size(); ++i) {
    const double ox = static_cast<double>(static_cast<int>(i) % columns) * l.width,
                 oy = top + static_cast<double>(static_cast<int>(i) / columns) * l.height;
    draw_panel(svg, f, f.panels[i], l, ox, oy, static_cast<int>(i) % columns == 0, lo, hi, defs);
  }
  // One colour bar right of the panels, as tall as a panel's matrix (at least 120 pixels).
  const double bar_y = top + l.map_y, bar_h = std::max(l.map_h, 120.0);
  const double right = draw_colour_bar(svg, defs, f, lo, hi, static_cast<double>(columns) * l.width + 6, bar_y, bar_h);
  const double width = std::max(right, text_width(f.title, kFigureTitleSize, true) + 20);
  const double rows = std::ceil(static_cast<double>(f.panels.size()) / columns);
  if (!f.title.empty()) svg.text(width / 2, 22, f.title, kFigureTitleSize, "middle", "figure-title", 0, true);
  return svg.document(width, std::max(top + rows * l.height, bar_y + bar_h + 12), defs);
}

std::string to_svg(const LinePlot& p) {
  if (p.ys.empty()) throw std::invalid_argument("a line plot needs a value");
  double lo = INFINITY, hi = -INFINITY;
  for (double y : p.ys)
    if (std::isfinite(y)) lo = std::min(lo, y), hi = std::max(hi, y);
  if (p.reference) lo = std::min(lo, *p.reference), hi = std::max(hi, *p.reference);
  if (!(lo < hi)) lo = std::isfinite(lo) ? lo - 0.5 : 0, hi = lo + 1;
  const double pad = (hi - lo) * 0.05;
  lo -= pad, hi += pad;
  double y_step = 1, x_step = 1;
  const std::vector<double> y_ticks = nice_ticks(lo, hi, 6, &y_step);
  const double n = static_cast<double>(p.ys.size()), x_lo = 1, x_hi = std::max(n, 2.0);
  std::vector<double> x_ticks = nice_ticks(x_lo, x_hi, 8, &x_step);
  x_step = std::max(x_step, 1.0);
  x_ticks.erase(std::remove_if(x_ticks.begin(), x_ticks.end(), [](double t) { return t != std::round(t); }), x_ticks.end());
  double widest = 0;
  for (double t : y_ticks) widest = std::max(widest, text_width(fixed(t, decimals_for(y_step)), kLabelSize - 1));
  const double left = 24 + widest + 8, top = p.title.empty() ? 12 : 34, right = p.width - 16, bottom = p.height - 44;
  const auto X = [&](double x) { return left + (right - left) * (x - x_lo) / (x_hi - x_lo); };
  const auto Y = [&](double y) { return bottom - (bottom - top) * (y - lo) / (hi - lo); };
  Svg svg;
  if (!p.title.empty()) svg.text(p.width / 2, 22, p.title, kTitleSize, "middle", "title");
  for (double t : y_ticks) {
    svg.line(left, Y(t), right, Y(t), "#e6e6e6");
    svg.line(left - 4, Y(t), left, Y(t), kInk);
    svg.centred(left - 7, Y(t), fixed(t, decimals_for(y_step)), kLabelSize - 1, "end", "ytick");
  }
  for (double t : x_ticks) {
    svg.line(X(t), bottom, X(t), bottom + 4, kInk);
    svg.text(X(t), bottom + 6 + kLabelSize, fixed(t, 0), kLabelSize - 1, "middle", "xtick");
  }
  svg.line(left, top, left, bottom, kInk);
  svg.line(left, bottom, right, bottom, kInk);
  if (p.reference) {
    svg.line(left, Y(*p.reference), right, Y(*p.reference), "#7f7f7f", 1, " stroke-dasharray=\"5 4\"");
    if (!p.reference_label.empty())
      svg.text(right - 4, Y(*p.reference) - 5, p.reference_label, kLabelSize - 1, "end", "reference", 0, false, "#595959");
  }
  std::string points;
  for (std::size_t i = 0; i < p.ys.size(); ++i)
    if (std::isfinite(p.ys[i])) points += num(X(static_cast<double>(i) + 1)) + "," + num(Y(p.ys[i])) + " ";
  svg.raw("<polyline class=\"line\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.8\" stroke-linejoin=\"round\" points=\"" + points + "\"/>\n");
  if (!p.x_name.empty()) svg.text((left + right) / 2, bottom + 36, p.x_name, kLabelSize, "middle", "axis-name");
  if (!p.y_name.empty()) svg.centred(12, (top + bottom) / 2, p.y_name, kLabelSize, "middle", "axis-name", -90);
  return svg.document(p.width, p.height);
}

}  // namespace qkv::plot
