// The attention explorer: one self-contained HTML page (no network; the weights inline) in which a
// user picks a layer and a head, or all heads overlaid, and hovers or clicks a token to see its
// attention to every other token, as lines weighted by the weight and as a heatmap. The page's
// markup, style and script are tools/explorer.html, embedded at build time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qkv::tool {

/// One attention layer's weights for one sequence: heads x rows (queries) x cols (keys).
struct ExplorerLayer {
  std::string name;  // "weights_per_head", "weights.3"
  std::int64_t heads = 1, rows = 0, cols = 0;
  std::vector<double> weights;  // heads * rows * cols, row-major
};

struct Explorer {
  std::string title;                // the model, as `qkv run` names it
  std::string backend;              // that computed the weights
  std::vector<std::string> tokens;  // labels of the positions; fewer than a layer's rows: numbered
  std::vector<ExplorerLayer> layers;
};

/// The page, ready to write.
std::string explorer_html(const Explorer& explorer);

}  // namespace qkv::tool
