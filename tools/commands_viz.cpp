// qkv viz: a model's attention weights as figures (every head side by side with one colour bar,
// causal next to full, the positional encoding) and as an interactive explorer in one HTML file.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "io/file.hpp"
#include "io/tokenizer.hpp"
#include "models/models.hpp"
#include "models/pretrained.hpp"
#include "plot/figure.hpp"
#include "tools/commands.hpp"
#include "tools/explorer.hpp"

namespace qkv::tool {

namespace {

/// The most weights an explorer page holds (a few tens of MB of HTML a browser opens at once).
constexpr std::int64_t kExplorerWeights = 4'000'000;

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, sep);) out.push_back(item);
  return out;
}

std::vector<plot::Format> parse_formats(const std::string& text) {
  std::vector<plot::Format> out;
  for (const std::string& f : split(text, ',')) {
    const auto format = plot::format_of("." + f);
    if (!format) throw UsageError("--format " + text + ": '" + f + "' is not a figure format (png, svg, pdf)");
    if (std::find(out.begin(), out.end(), *format) == out.end()) out.push_back(*format);
  }
  if (out.empty()) throw UsageError("--format: name png, svg or pdf");
  return out;
}

/// Matrix `index` ([rows, cols]) of a tensor [..., rows, cols] as doubles.
std::vector<double> matrix(const Tensor& t, std::int64_t index, std::int64_t rows, std::int64_t cols) {
  std::vector<double> m(static_cast<std::size_t>(rows * cols));
  for (std::int64_t i = 0; i < rows * cols; ++i) m[static_cast<std::size_t>(i)] = t.at(index * rows * cols + i);
  return m;
}

/// One panel of attention weights: queries down, keys across, masked keys (weight exactly 0)
/// hatched.
plot::Heatmap weights_panel(std::vector<double> m, std::int64_t rows, std::int64_t cols, const std::string& title,
                            const std::vector<std::string>& labels) {
  plot::Heatmap h;
  h.title = title, h.rows = rows, h.cols = cols, h.values = std::move(m);
  h.x_labels = h.y_labels = labels;
  h.x_name = "key", h.y_name = "query";
  if (std::any_of(h.values.begin(), h.values.end(), [](double v) { return v == 0.0; }))
    for (double v : h.values) h.masked.push_back(v == 0.0);
  return h;
}

/// Weights figures share one colour scale from 0 to the largest weight (random attention at about
/// 1/N is not one flat block), at least 0.05.
plot::HeatmapFigure weights_figure(std::string title, std::vector<plot::Heatmap> panels) {
  double hi = 0.05;
  for (const auto& p : panels)
    for (double v : p.values)
      if (std::isfinite(v)) hi = std::max(hi, v);
  plot::HeatmapFigure f;
  f.title = std::move(title), f.panels = std::move(panels);
  f.lo = 0, f.hi = hi;
  f.colormap = plot::Colormap::blues;
  f.bar_label = "attention weight";
  return f;
}

/// The labels of the axes: --labels, or a model folder's prompt as its tokenizer cut it.
std::vector<std::string> token_labels(const Request& r, const std::string& labels_text) {
  std::vector<std::string> labels = split(labels_text, ',');
  if (labels.empty() && !r.prompt.empty() && models::is_model_dir(r.target)) {
    const io::Tokenizer tokenizer = io::Tokenizer::from_folder(r.target);
    const std::vector<std::int32_t> ids = tokenizer.encode(r.prompt);
    for (std::size_t i = 0; i < ids.size(); ++i) labels.push_back(tokenizer.piece(ids[i], i == 0));
  }
  return labels;
}

bool has_causal_option(const std::string& target) {
  try {
    const auto& options = models::find_model(target).options;
    return std::any_of(options.begin(), options.end(), [](const auto& o) { return o.name == "causal"; });
  } catch (const UsageError&) {  // a graph's IR text or a model folder, not a built-in model
    return false;
  }
}

}  // namespace

int cmd_viz(const Request& request, const std::string& backend_name, const VizFlags& flags) {
  if (flags.dir.empty() && flags.html.empty()) throw UsageError("viz: name a folder for the figures (--dir), an explorer file (--html), or both");
  const std::vector<plot::Format> formats = parse_formats(flags.formats);
  if (!flags.dir.empty()) io::check_writable_dir(flags.dir);  // before any work
  namespace fs = std::filesystem;
  const auto normal = [](const fs::path& p) {  // "out/" and "out" alike
    const fs::path n = p.lexically_normal();
    return n.has_filename() ? n : n.parent_path();
  };
  const bool html_in_dir = !flags.dir.empty() && normal(fs::path(flags.html).parent_path()) == normal(flags.dir);
  if (!flags.html.empty() && !html_in_dir) io::check_writable(flags.html);  // (the figures' folder is made if missing)
  Request r = request;
  r.attention_weights = true;  // a model folder's graph: each layer's weights too
  const std::vector<std::string> labels = token_labels(r, flags.labels);
  // A built-in model's sequence as long as the labels, one sequence (only the first is drawn).
  if (r.in.empty() && !models::is_model_dir(r.target)) {
    r.fallback_dims["B"] = 1;
    if (!labels.empty())
      for (const char* d : {"N", "M", "T"}) r.fallback_dims[d] = static_cast<std::int64_t>(labels.size());
  }
  auto be = backend::create(backend_name);
  auto weights_of = [&](const Request& req) {
    Prepared p = prepare(req);
    auto out = be->compile(p.graph)->run(p.inputs);
    return std::make_pair(p, out);
  };
  auto [p, out] = weights_of(r);

  std::vector<std::pair<std::string, plot::HeatmapFigure>> figures;  // file name without extension, figure
  Explorer explorer{.title = p.title, .backend = be->name(), .tokens = labels, .layers = {}};
  const bool has_mean = out.contains("weights") && out.at("weights").rank() == 3;
  for (const auto& [name, t] : out) {
    if (name.rfind("weights", 0) != 0 || t.rank() < 2) continue;
    const std::int64_t rows = t.shape().end()[-2], cols = t.shape().back();
    std::vector<plot::Heatmap> panels;
    if (t.rank() == 4) {  // [B, H, N, M]: each head of the first sequence (a model folder's per layer: weights.<layer>)
      const std::int64_t heads = t.shape()[1];
      std::vector<double> mean(static_cast<std::size_t>(rows * cols), 0.0);
      ExplorerLayer layer{.name = name, .heads = heads, .rows = rows, .cols = cols, .weights = {}};
      for (std::int64_t h = 0; h < heads; ++h) {
        std::vector<double> m = matrix(t, h, rows, cols);
        for (std::size_t i = 0; i < m.size(); ++i) mean[i] += m[i] / static_cast<double>(heads);
        layer.weights.insert(layer.weights.end(), m.begin(), m.end());
        panels.push_back(weights_panel(std::move(m), rows, cols, "head " + std::to_string(h + 1), labels));
      }
      if (heads > 1 && !has_mean) panels.push_back(weights_panel(std::move(mean), rows, cols, "mean over heads", labels));
      explorer.layers.push_back(std::move(layer));
    } else {
      panels.push_back(weights_panel(matrix(t, 0, rows, cols), rows, cols, name, labels));
    }
    figures.emplace_back(name, weights_figure(p.title + ": " + name, std::move(panels)));
  }
  if (explorer.layers.empty())  // no per-head weights: each weights output as a layer of one head
    for (const auto& [name, t] : out)
      if (name.rfind("weights", 0) == 0 && t.rank() >= 2) {
        const std::int64_t rows = t.shape().end()[-2], cols = t.shape().back();
        std::vector<double> m = matrix(t, 0, rows, cols);
        explorer.layers.push_back({.name = name, .heads = 1, .rows = rows, .cols = cols, .weights = m});
      }
  if (figures.empty()) {
    std::string outs;
    for (const auto& [name, v] : p.graph.outputs()) outs += (outs.empty() ? "" : ", ") + name;
    if (!flags.html.empty()) throw UsageError(p.title + " has no attention weights to explore (outputs: " + outs + ")");
    std::printf("%s has no attention weights to draw (outputs: %s)%s; drawing the positional encoding only\n", p.title.c_str(), outs.c_str(),
                r.set.contains("weights") ? "" : "; models with a weights option draw them with --set weights=true");
  }
  // Causal next to full, for models with a causal option that output weights.
  if (!figures.empty() && has_causal_option(r.target)) {
    Request full = r, causal = r;
    full.set["causal"] = "false";
    causal.set["causal"] = "true";
    const Tensor a = weights_of(full).second.at("weights"), b = weights_of(causal).second.at("weights");
    const std::int64_t rows = a.shape().end()[-2], cols = a.shape().back();
    figures.emplace_back("causal_vs_full",
                         weights_figure(p.title + ": full and causal", {weights_panel(matrix(a, 0, rows, cols), rows, cols, "full", labels),
                                                                        weights_panel(matrix(b, 0, rows, cols), rows, cols, "causal", labels)}));
  }
  // The sinusoidal position encoding for the model's sequence length.
  std::int64_t n = 0;
  for (const auto& [name, t] : out)
    if (name.rfind("weights", 0) == 0 && t.rank() >= 2) n = t.shape().end()[-2];
  n = std::max<std::int64_t>(n, 32);  // enough rows to see the waves
  ir::Graph pe_graph = models::sinusoidal_positions_graph();
  const Tensor pe = be->compile(pe_graph)->run({{"x", Tensor(DType::f32, {n, 64})}}).at("pe");
  plot::Heatmap positions;
  positions.rows = n, positions.cols = 64, positions.values = matrix(pe, 0, n, 64);
  positions.x_name = "dimension", positions.y_name = "position";
  plot::HeatmapFigure positions_figure;
  positions_figure.title = "sinusoidal positions: " + std::to_string(n) + " x 64";
  positions_figure.panels = {positions};
  positions_figure.lo = -1, positions_figure.hi = 1;
  positions_figure.colormap = plot::Colormap::red_blue;
  positions_figure.bar_label = "value";
  positions_figure.annotate = plot::Annotate::never;
  figures.emplace_back("positions", positions_figure);

  io::OutputBatch files;  // every file written, or none
  std::vector<std::string> written;
  if (!flags.dir.empty()) {
    io::make_dirs(flags.dir);
    for (const auto& [name, figure] : figures) {
      const std::string base = (std::filesystem::path(flags.dir) / name).string();
      std::vector<std::string> bytes;
      try {
        const std::string svg = plot::to_svg(figure);
        for (plot::Format format : formats) bytes.push_back(plot::render(svg, format));
      } catch (const std::runtime_error& e) {  // a figure past Cairo's 32767 pixels a side
        throw UsageError(base + ": " + e.what());
      }
      for (std::size_t i = 0; i < formats.size(); ++i) {
        files.add(base + "." + plot::extension(formats[i]), bytes[i]);
        written.push_back(base + "." + plot::extension(formats[i]));
      }
    }
  }
  if (!flags.html.empty()) {
    std::int64_t held = 0;
    for (const ExplorerLayer& l : explorer.layers) held += l.heads * l.rows * l.cols;
    if (held > kExplorerWeights)
      throw UsageError("--html " + flags.html + ": " + std::to_string(held) + " weights (" + std::to_string(explorer.layers.size()) +
                       " layers) are more than an explorer holds (" + std::to_string(kExplorerWeights) + "); give fewer tokens");
    files.add(flags.html, explorer_html(explorer));
    written.push_back(flags.html);
  }
  files.commit();
  std::printf("%s on %s: wrote\n", p.title.c_str(), be->name().c_str());
  if (!labels.empty() && flags.labels.empty()) {
    std::string joined;
    for (const std::string& l : labels) joined += (joined.empty() ? "" : "|") + l;
    std::printf("  token labels: %s\n", joined.c_str());
  }
  for (const auto& w : written) std::printf("  %s\n", w.c_str());
  return 0;
}

}  // namespace qkv::tool
