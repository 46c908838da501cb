// Figures: what the SVG says (its text elements, cells and colour bar), and that librsvg renders it
// to PNG and PDF of the expected size.
#include "plot/figure.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

namespace {

using namespace qkv::plot;

const std::vector<std::string> kJourney = {"Your", "journey", "starts", "with", "one", "step"};

/// Every <text> element's content, by class ("xtick", "annotation", ...). (Read by hand: GCC 12
/// warns inside std::regex under the sanitizers.)
std::multimap<std::string, std::string> texts(const std::string& svg) {
  std::multimap<std::string, std::string> out;
  const std::string open = "<text class=\"";
  for (std::size_t at = svg.find(open); at != std::string::npos; at = svg.find(open, at + 1)) {
    const std::size_t cls = at + open.size(), body = svg.find('>', at) + 1;
    out.emplace(svg.substr(cls, svg.find('"', cls) - cls), svg.substr(body, svg.find("</text>", body) - body));
  }
  return out;
}

std::vector<std::string> of_class(const std::multimap<std::string, std::string>& t, const std::string& cls) {
  std::vector<std::string> out;
  for (auto [b, e] = t.equal_range(cls); b != e; ++b) out.push_back(b->second);
  return out;
}

std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + what.size())) ++n;
  return n;
}

/// The value of attribute `name` of the first element that has it.
std::string attribute(const std::string& svg, const std::string& name) {
  const std::size_t at = svg.find(" " + name + "=\"") + name.size() + 3;
  return svg.substr(at, svg.find('"', at) - at);
}

/// The SVG's width and height attributes.
std::pair<double, double> svg_size(const std::string& svg) {
  const std::string root = svg.substr(svg.find("<svg "));
  return {std::stod(attribute(root, "width")), std::stod(attribute(root, "height"))};
}

Heatmap softmax_rows(const std::string& title, std::int64_t n, bool causal, const std::vector<std::string>& labels) {
  Heatmap h{.title = title, .rows = n, .cols = n, .values = {}, .x_labels = labels, .y_labels = labels, .x_name = "key", .y_name = "query"};
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      const bool hidden = causal && j > i;
      h.values.push_back(hidden ? 0.0 : 1.0 / static_cast<double>(causal ? i + 1 : n));
      if (causal) h.masked.push_back(hidden);
    }
  return h;
}

TEST(Figure, HeadsSideBySideAnnotatedWithWholeLabels) {
  HeatmapFigure f{.title = "two heads",
                  .panels = {softmax_rows("head 1", 6, false, kJourney), softmax_rows("head 2", 6, false, kJourney)},
                  .bar_label = "weight"};
  const std::string svg = to_svg(f);
  const auto t = texts(svg);
  EXPECT_EQ(of_class(t, "title"), (std::vector<std::string>{"head 1", "head 2"}));
  EXPECT_EQ(of_class(t, "figure-title"), (std::vector<std::string>{"two heads"}));
  std::vector<std::string> expected;
  for (int panel = 0; panel < 2; ++panel) expected.insert(expected.end(), kJourney.begin(), kJourney.end());
  EXPECT_EQ(of_class(t, "xtick"), expected);  // whole labels, on both panels
  EXPECT_EQ(of_class(t, "ytick"), expected);
  const auto notes = of_class(t, "annotation");
  ASSERT_EQ(notes.size(), 72u);
  EXPECT_TRUE(std::all_of(notes.begin(), notes.end(), [](const std::string& s) { return s == "0.167"; }));  // fmt '.3f'
  EXPECT_EQ(count(svg, "class=\"colour-bar\""), 1u);                                                        // one bar for both
  EXPECT_EQ(of_class(t, "axis-name"), (std::vector<std::string>{"key", "query", "key", "weight"}));         // the query axis named once a row
  EXPECT_FALSE(of_class(t, "bar-tick").empty());
  const std::string png = render(svg, Format::png);
  const auto [w, h] = svg_size(svg);
  ASSERT_TRUE(png_size(png));
  EXPECT_EQ(*png_size(png), (std::pair<std::int64_t, std::int64_t>{static_cast<std::int64_t>(2 * w), static_cast<std::int64_t>(2 * h)}));
  EXPECT_GT(w, 2 * 6 * 30);  // two panels of six cells at least 30 pixels wide
  const std::string pdf = render(svg, Format::pdf);
  EXPECT_EQ(pdf.rfind("%PDF-", 0), 0u);
  EXPECT_EQ(render(svg, Format::svg), svg);
}

TEST(Figure, MaskedCellsAreHatchedAndNotAnnotated) {
  HeatmapFigure f{.panels = {softmax_rows("full", 4, false, {}), softmax_rows("causal", 4, true, {})}};
  const std::string svg = to_svg(f);
  EXPECT_EQ(count(svg, "fill=\"url(#hatch)\""), 6u);  // the upper triangle of 4 x 4
  EXPECT_EQ(count(svg, "<pattern id=\"hatch\""), 1u);
  EXPECT_EQ(of_class(texts(svg), "annotation").size(), 16u + 10u);
  EXPECT_EQ(of_class(texts(svg), "xtick"), (std::vector<std::string>{"0", "1", "2", "3", "0", "1", "2", "3"}));  // no labels: numbered
}

TEST(Figure, LongKeyLabelsTurnAndSpecialCharactersAreEscaped) {
  const std::vector<std::string> labels = {"<s>", "an extraordinarily long token label", "a&b"};
  Heatmap h = softmax_rows("", 3, false, labels);
  const std::string svg = to_svg(HeatmapFigure{.panels = {h}});
  EXPECT_NE(svg.find("&lt;s&gt;"), std::string::npos);
  EXPECT_NE(svg.find("a&amp;b"), std::string::npos);
  EXPECT_NE(svg.find("rotate(-45"), std::string::npos) << "a long key label drawn level would run into the next";
  EXPECT_NO_THROW(render(svg, Format::png));  // well-formed XML
  const std::string short_svg = to_svg(HeatmapFigure{.panels = {softmax_rows("", 3, false, {"a", "b", "c"})}});
  EXPECT_EQ(short_svg.find("rotate(-45"), std::string::npos);
}

TEST(Figure, LabelsThatAreNotTextAreShownAsReplacements) {
  // A byte-level token's piece of a character (the first two bytes of a CJK one), a control
  // character, and a whole character: the SVG stays well-formed UTF-8 that librsvg reads.
  EXPECT_EQ(displayable("\xe6\x97"), "\uFFFD\uFFFD");
  EXPECT_EQ(displayable("a\x01"
                        "b"),
            "a\uFFFD"
            "b");
  EXPECT_EQ(displayable("\xed\xa0\x80"), "\uFFFD\uFFFD\uFFFD");  // a surrogate
  EXPECT_EQ(displayable("\xf0\x9f\x98\x80 ok \u65e5"), "\xf0\x9f\x98\x80 ok \u65e5");
  const std::string svg = to_svg(HeatmapFigure{.panels = {softmax_rows("", 3, false, {"\xe6\x97", "\x01", "\u65e5"})}});
  EXPECT_NE(svg.find(">\uFFFD\uFFFD</text>"), std::string::npos);
  EXPECT_NO_THROW(render(svg, Format::png));
}

TEST(Figure, LargeMatricesAreOneImageWithThinnedTicks) {
  Heatmap h{.rows = 300, .cols = 200, .values = std::vector<double>(60000, 0.5)};
  for (std::size_t i = 0; i < h.values.size(); i += 7) h.values[i] = 1;
  const std::string svg = to_svg(HeatmapFigure{.panels = {h}, .colormap = Colormap::viridis});
  EXPECT_EQ(count(svg, "data:image/png;base64,"), 1u);
  EXPECT_EQ(count(svg, "<rect"), 2u);  // the background and the colour bar: no rect per cell
  const auto t = texts(svg);
  EXPECT_TRUE(of_class(t, "annotation").empty());
  const auto x = of_class(t, "xtick");
  EXPECT_GT(x.size(), 3u);
  EXPECT_LT(x.size(), 60u);  // every so many columns, not 200 overlapping numbers
  const std::string png = render(svg, Format::png, 1);
  const auto [w, hgt] = svg_size(svg);
  EXPECT_EQ(png_size(png)->first, static_cast<std::int64_t>(w));
  EXPECT_EQ(png_size(png)->second, static_cast<std::int64_t>(hgt));
}

TEST(Figure, LinePlotHasTickedAxesAndAReference) {
  std::vector<double> loss;
  for (int i = 0; i < 40; ++i) loss.push_back(2.8 * std::exp(-0.08 * i) + 0.05);
  const LinePlot p{.title = "loss", .x_name = "step", .y_name = "loss", .ys = loss, .reference = 2.77, .reference_label = "chance"};
  const std::string svg = to_svg(p);
  const auto t = texts(svg);
  EXPECT_EQ(of_class(t, "axis-name"), (std::vector<std::string>{"step", "loss"}));
  EXPECT_EQ(of_class(t, "reference"), (std::vector<std::string>{"chance"}));
  const auto x = of_class(t, "xtick"), y = of_class(t, "ytick");
  EXPECT_GE(x.size(), 4u);
  EXPECT_GE(y.size(), 4u);
  EXPECT_EQ(x.front(), "5");  // whole steps from 1 to 40 in round numbers
  EXPECT_EQ(count(attribute(svg, "points"), ","), 40u);
  EXPECT_EQ(*png_size(render(svg, Format::png)), (std::pair<std::int64_t, std::int64_t>{1280, 720}));
}

TEST(Figure, ColourMapsAndFormats) {
  EXPECT_EQ(colour(Colormap::blues, 0), 0xf7fbffu);
  EXPECT_EQ(colour(Colormap::blues, 1), 0x08306bu);
  EXPECT_EQ(colour(Colormap::blues, -3), colour(Colormap::blues, 0));
  EXPECT_EQ(colour(Colormap::viridis, 2), 0xfde725u);
  EXPECT_EQ(colour(Colormap::red_blue, 0.5), 0xf7f7f7u);  // white at the middle
  EXPECT_EQ(format_of("a/b.SVG"), Format::svg);
  EXPECT_EQ(format_of("x.png"), Format::png);
  EXPECT_EQ(format_of("x.pdf"), Format::pdf);
  EXPECT_FALSE(format_of("x.jpg"));
  EXPECT_FALSE(format_of("png"));
  EXPECT_FALSE(png_size("GIF89a this is not one"));
  EXPECT_GT(text_width("WWWW", 12), text_width("iiii", 12));
  EXPECT_GT(text_width("journey", 24), 1.9 * text_width("journey", 12));
  EXPECT_THROW(render("<svg not closed", Format::png), std::runtime_error);
  EXPECT_THROW(to_svg(HeatmapFigure{}), std::invalid_argument);
  EXPECT_THROW(to_svg(HeatmapFigure{.panels = {Heatmap{.rows = 2, .cols = 2, .values = {1, 2, 3}}}}), std::invalid_argument);
}

}  // namespace
