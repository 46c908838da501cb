// What the figures borrow from libraries: colour maps, text measurement with Pango, and rendering
// SVG to PNG and PDF with librsvg on Cairo surfaces.
#include <cairo-pdf.h>
#include <cairo.h>
#include <librsvg/rsvg.h>
#include <pango/pangocairo.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "plot/cairo_bytes.hpp"
#include "plot/figure.hpp"

#if defined(__SANITIZE_ADDRESS__)
// fontconfig (under Pango) keeps the fonts it has read for the life of the process and never frees
// them: what LeakSanitizer calls a leak at exit in every program that draws a figure.
extern "C" const char* __lsan_default_suppressions() { return "leak:libfontconfig.so\n"; }
#endif

namespace qkv::plot {

std::optional<Format> format_of(std::string_view path) {
  const auto dot = path.rfind('.');
  if (dot == std::string_view::npos) return std::nullopt;
  std::string ext(path.substr(dot + 1));
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (ext == "svg") return Format::svg;
  if (ext == "png") return Format::png;
  if (ext == "pdf") return Format::pdf;
  return std::nullopt;
}

const char* extension(Format format) {
  switch (format) {
    case Format::svg: return "svg";
    case Format::png: return "png";
    case Format::pdf: return "pdf";
  }
  return "";
}

namespace {

using Stops = std::array<std::uint32_t, 9>;

// Nine evenly spaced colours of each map, interpolated linearly between: ColorBrewer's Blues and
// RdBu (as matplotlib and seaborn use them), and viridis.
constexpr Stops kBlues = {0xf7fbff, 0xdeebf7, 0xc6dbef, 0x9ecae1, 0x6baed6, 0x4292c6, 0x2171b5, 0x08519c, 0x08306b};
constexpr Stops kViridis = {0x440154, 0x472878, 0x3e4a89, 0x31688e, 0x26828e, 0x1f9e89, 0x35b779, 0x6dcd59, 0xfde725};
constexpr Stops kRedBlue = {0x2166ac, 0x4393c3, 0x92c5de, 0xd1e5f0, 0xf7f7f7, 0xfddbc7, 0xf4a582, 0xd6604d, 0xb2182b};

const Stops& stops_of(Colormap map) {
  switch (map) {
    case Colormap::blues: return kBlues;
    case Colormap::viridis: return kViridis;
    case Colormap::red_blue: return kRedBlue;
  }
  return kBlues;
}

}  // namespace

std::uint32_t colour(Colormap map, double t) {
  const Stops& s = stops_of(map);
  if (!(t >= 0)) t = 0;  // NaN too
  t = std::min(t, 1.0) * static_cast<double>(s.size() - 1);
  const auto i = std::min(static_cast<std::size_t>(t), s.size() - 2);
  const double f = t - static_cast<double>(i);
  std::uint32_t out = 0;
  for (int shift : {16, 8, 0}) {
    const double a = (s[i] >> shift) & 0xff, b = (s[i + 1] >> shift) & 0xff;
    out |= static_cast<std::uint32_t>(std::lround(a + (b - a) * f)) << shift;
  }
  return out;
}

std::string displayable(std::string_view text) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
  std::string out;
  const auto byte = [&](std::size_t i) { return i < text.size() ? static_cast<unsigned char>(text[i]) : 0u; };
  for (std::size_t i = 0; i < text.size();) {
    const unsigned c = byte(i);
    // The length of a well-formed sequence starting here (Unicode's table 3-7), or 0.
    std::size_t n = 0;
    if (c >= 0x20 && c < 0x7f) n = 1;
    else if (c >= 0xc2 && c <= 0xdf) n = 2;
    else if (c >= 0xe0 && c <= 0xef) n = 3;
    else if (c >= 0xf0 && c <= 0xf4) n = 4;
    const unsigned lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80, hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
    bool ok = n > 0;
    for (std::size_t k = 1; ok && k < n; ++k) {
      const unsigned b = byte(i + k);
      ok = k == 1 ? b >= lo && b <= hi : (b & 0xc0) == 0x80;
    }
    if (ok) {
      out.append(text.substr(i, n));
      i += n;
    } else {
      out.append(kReplacement);
      ++i;
    }
  }
  return out;
}

double text_width(std::string_view raw, double size, bool bold) {
  const std::string text = displayable(raw);
  // One Pango layout for the process, behind a lock: measuring is rare and cheap. The font map is
  // Pango's own for Cairo, the one librsvg lays the SVG's text out with, so the widths agree.
  static std::mutex lock;
  static PangoLayout* layout = [] {
    PangoFontMap* map = pango_cairo_font_map_new();
    PangoContext* context = pango_font_map_create_context(map);
    return pango_layout_new(context);
  }();
  std::lock_guard guard(lock);
  PangoFontDescription* font = pango_font_description_from_string("DejaVu Sans");
  pango_font_description_set_absolute_size(font, size * PANGO_SCALE);
  pango_font_description_set_weight(font, bold ? PANGO_WEIGHT_BOLD : PANGO_WEIGHT_NORMAL);
  pango_layout_set_font_description(layout, font);
  pango_font_description_free(font);
  pango_layout_set_text(layout, text.data(), static_cast<int>(text.size()));
  PangoRectangle logical{};
  pango_layout_get_extents(layout, nullptr, &logical);
  return static_cast<double>(logical.width) / PANGO_SCALE;
}

namespace detail {

cairo_status_t append_bytes(void* closure, const unsigned char* data, unsigned int length) {
  static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), length);
  return CAIRO_STATUS_SUCCESS;
}

std::string png_bytes(cairo_surface_t* surface) {
  std::string bytes;
  if (cairo_surface_write_to_png_stream(surface, append_bytes, &bytes) != CAIRO_STATUS_SUCCESS) throw std::runtime_error("PNG encoding failed");
  return bytes;
}

}  // namespace detail

namespace {

struct Unref {
  void operator()(RsvgHandle* h) const { g_object_unref(h); }
  void operator()(cairo_surface_t* s) const { cairo_surface_destroy(s); }
  void operator()(cairo_t* c) const { cairo_destroy(c); }
};

}  // namespace

std::string render(const std::string& svg, Format format, double scale) {
  if (format == Format::svg) return svg;
  GError* error = nullptr;
  std::unique_ptr<RsvgHandle, Unref> handle(rsvg_handle_new_from_data(reinterpret_cast<const guint8*>(svg.data()), svg.size(), &error));
  if (!handle) {
    const std::string why = error ? error->message : "unknown error";
    if (error) g_error_free(error);
    throw std::runtime_error("librsvg cannot read the figure: " + why);
  }
  rsvg_handle_set_dpi(handle.get(), 96);
  double width = 0, height = 0;
  if (!rsvg_handle_get_intrinsic_size_in_pixels(handle.get(), &width, &height)) throw std::runtime_error("the figure's SVG has no size");
  std::string bytes;
  const double s = format == Format::png ? scale : 0.75;  // PDF: 72 points per 96 pixels
  std::unique_ptr<cairo_surface_t, Unref> surface(
      format == Format::png
          ? cairo_image_surface_create(CAIRO_FORMAT_ARGB32, static_cast<int>(std::ceil(width * s)), static_cast<int>(std::ceil(height * s)))
          : cairo_pdf_surface_create_for_stream(detail::append_bytes, &bytes, width * s, height * s));
  {
    std::unique_ptr<cairo_t, Unref> cr(cairo_create(surface.get()));
    cairo_scale(cr.get(), s, s);
    const RsvgRectangle viewport{0, 0, width, height};
    if (!rsvg_handle_render_document(handle.get(), cr.get(), &viewport, &error)) {
      const std::string why = error ? error->message : "unknown error";
      if (error) g_error_free(error);
      throw std::runtime_error("librsvg cannot draw the figure: " + why);
    }
  }
  if (format == Format::png) {
    bytes = detail::png_bytes(surface.get());
  } else {
    cairo_surface_finish(surface.get());  // the PDF's last bytes
  }
  if (cairo_surface_status(surface.get()) != CAIRO_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cairo: ") + cairo_status_to_string(cairo_surface_status(surface.get())));
  return bytes;
}

std::optional<std::pair<std::int64_t, std::int64_t>> png_size(std::string_view bytes) {
  static constexpr std::string_view signature("\x89PNG\r\n\x1a\n", 8);
  if (bytes.size() < 24 || bytes.substr(0, 8) != signature || bytes.substr(12, 4) != "IHDR") return std::nullopt;
  auto be32 = [&](std::size_t o) {
    std::int64_t v = 0;
    for (std::size_t i = 0; i < 4; ++i) v = (v << 8) | static_cast<unsigned char>(bytes[o + i]);
    return v;
  };
  return std::pair{be32(16), be32(20)};
}

}  // namespace qkv::plot
