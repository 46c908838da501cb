// qkv viz (attention heatmaps as PNG) and qkv train (the copy task with a loss curve).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <sstream>

#include "io/file.hpp"
#include "io/png.hpp"
#include "io/tokenizer.hpp"
#include "models/models.hpp"
#include "models/pretrained.hpp"
#include "tools/commands.hpp"
#include "train/init.hpp"
#include "train/trainer.hpp"

namespace qkv::tool {

namespace {

constexpr std::int64_t kCell = 24;

std::vector<std::string> split_labels(const std::string& labels) {
  std::vector<std::string> out;
  std::stringstream ss(labels);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

/// Matrix `index` ([rows, cols]) of a tensor [..., rows, cols] as doubles.
std::vector<double> matrix(const Tensor& t, std::int64_t index, std::int64_t rows, std::int64_t cols) {
  std::vector<double> m(static_cast<std::size_t>(rows * cols));
  for (std::int64_t i = 0; i < rows * cols; ++i) m[static_cast<std::size_t>(i)] = t.at(index * rows * cols + i);
  return m;
}

/// A figure: `title` on top, `x_name` and labels across the top, `y_name` and labels down the
/// left, the heatmap, and a colour bar for [lo, hi] named `bar` at the right.
io::Image figure(const io::Image& map, const std::string& title, const std::string& x_name, const std::string& y_name,
                 const std::vector<std::string>& x_labels, const std::vector<std::string>& y_labels, std::int64_t cell, double lo, double hi,
                 const std::string& bar, const std::string& note) {
  std::int64_t label_w = 0;
  for (const auto& l : y_labels) label_w = std::max(label_w, io::text_width(l.substr(0, 10)));
  const bool x_labelled = !x_labels.empty();
  const std::int64_t left = 14 + label_w + (label_w ? 6 : 0), top = 14 + 12 + (x_labelled ? 12 : 0);
  const io::Image key = io::colour_bar(lo, hi, map.height, bar);
  const std::int64_t width = std::max(left + map.width + 12 + key.width + 4, io::text_width(title) + 8);
  const std::int64_t height = top + map.height + (note.empty() ? 6 : 20);
  io::Image img(width, height);
  io::draw_text(img, 4, 2, title);
  io::draw_text(img, left + map.width / 2 - io::text_width(x_name) / 2, 14, x_name);
  io::draw_text(img, 2, top + map.height / 2 - 9 * static_cast<std::int64_t>(y_name.size()) / 2, y_name, 1, true);
  for (std::size_t j = 0; j < x_labels.size() && static_cast<std::int64_t>(j) * cell < map.width; ++j)
    io::draw_text(img, left + static_cast<std::int64_t>(j) * cell + 2, top - 11,
                  x_labels[j].substr(0, static_cast<std::size_t>(std::max<std::int64_t>((cell - 4) / 6, 1))));
  for (std::size_t i = 0; i < y_labels.size() && static_cast<std::int64_t>(i) * cell < map.height; ++i)
    io::draw_text(img, 12, top + static_cast<std::int64_t>(i) * cell + cell / 2 - 3, y_labels[i].substr(0, 10));
  img.paste(map, left, top);
  img.paste(key, left + map.width + 12, top - 14);
  if (!note.empty()) io::draw_text(img, 4, top + map.height + 8, note);
  return img;
}

/// An attention-weights figure: queries down, keys across, the colour scale fitted to the largest
/// weight (random attention at about 1/N is not one flat block), masked keys (weight exactly 0)
/// hatched grey.
io::Image weights_figure(const std::vector<double>& m, std::int64_t rows, std::int64_t cols, const std::string& title,
                         const std::vector<std::string>& labels) {
  std::vector<std::uint8_t> masked(m.size());
  double hi = 0;
  bool any_masked = false;
  for (std::size_t i = 0; i < m.size(); ++i) {
    masked[i] = m[i] == 0.0;
    any_masked |= m[i] == 0.0;
    if (std::isfinite(m[i])) hi = std::max(hi, m[i]);
  }
  if (hi <= 0) hi = 1;
  const std::int64_t cell = std::clamp<std::int64_t>(480 / std::max(rows, cols), 2, kCell);
  return figure(io::heatmap(m, rows, cols, cell, 0.0, hi, &masked), title, "key", "query", labels, labels, cell, 0.0, hi, "weight",
                any_masked ? "grey: masked (weight 0)" : "");
}

}  // namespace

int cmd_viz(const Request& request, const std::string& backend_name, const std::string& dir, const std::string& labels_text) {
  io::check_writable_dir(dir);  // before any work
  Request r = request;
  r.attention_weights = true;  // a model folder's graph: each layer's weights too
  auto labels = split_labels(labels_text);
  // A model folder's prompt labels the axes with its tokens, as the tokenizer cut it.
  if (labels.empty() && !r.prompt.empty() && models::is_model_dir(r.target)) {
    const io::Tokenizer tokenizer = io::Tokenizer::from_folder(r.target);
    const std::vector<std::int32_t> ids = tokenizer.encode(r.prompt);
    for (std::size_t i = 0; i < ids.size(); ++i) labels.push_back(tokenizer.piece(ids[i], i == 0));
  }
  auto be = backend::create(backend_name);
  auto weights_of = [&](const Request& req) {
    Prepared p = prepare(req);
    auto out = be->compile(p.graph)->run(p.inputs);
    return std::make_pair(p, out);
  };
  auto [p, out] = weights_of(r);
  std::vector<std::pair<std::string, io::Image>> images;  // file name, image: written together at the end
  for (const auto& [name, t] : out) {
    if (name.rfind("weights", 0) != 0 || t.rank() < 2) continue;
    const std::int64_t rows = t.shape().end()[-2], cols = t.shape().back();
    if (t.rank() == 4) {  // [B, H, N, M]: each head of the first sequence, and their mean (a model folder's per layer: weights.<layer>)
      const std::int64_t heads = t.shape()[1];
      std::vector<double> mean(static_cast<std::size_t>(rows * cols), 0.0);
      for (std::int64_t h = 0; h < heads; ++h) {
        auto m = matrix(t, h, rows, cols);
        for (std::size_t i = 0; i < m.size(); ++i) mean[i] += m[i] / static_cast<double>(heads);
        images.emplace_back(name + "_" + std::to_string(h) + ".png", weights_figure(m, rows, cols, name + ": head " + std::to_string(h), labels));
      }
      images.emplace_back(name + "_mean.png", weights_figure(mean, rows, cols, name + ": mean over heads", labels));
    } else {
      images.emplace_back(name + ".png", weights_figure(matrix(t, 0, rows, cols), rows, cols, name, labels));
    }
  }
  if (images.empty()) {
    std::string outs;
    for (const auto& [name, v] : p.graph.outputs()) outs += (outs.empty() ? "" : ", ") + name;
    std::printf("%s has no attention weights to draw (outputs: %s)%s; drawing the positional encoding only\n", p.title.c_str(), outs.c_str(),
                r.set.contains("weights") ? "" : "; models with a weights option draw them with --set weights=true");
  }
  // Causal next to full, for models with a causal option that output weights.
  const auto spec_opts = [&]() -> std::vector<models::OptionSpec> {
    try {
      return models::find_model(r.target).options;
    } catch (const UsageError&) {  // a graph's IR text, not a built-in model
      return {};
    }
  }();
  if (!images.empty() && std::any_of(spec_opts.begin(), spec_opts.end(), [](const auto& o) { return o.name == "causal"; })) {
    Request full = r, causal = r;
    full.set["causal"] = "false";
    causal.set["causal"] = "true";
    auto a = weights_of(full).second.at("weights");
    auto b = weights_of(causal).second.at("weights");
    const std::int64_t rows = a.shape().end()[-2], cols = a.shape().back();
    auto left = weights_figure(matrix(a, 0, rows, cols), rows, cols, "full", labels);
    auto right = weights_figure(matrix(b, 0, rows, cols), rows, cols, "causal", labels);
    io::Image both(left.width + right.width + 10, std::max(left.height, right.height));
    both.paste(left, 0, 0);
    both.paste(right, left.width + 10, 0);
    images.emplace_back("causal_vs_full.png", both);
  }
  // The sinusoidal position encoding for the model's sequence length.
  std::int64_t n = 0;
  for (const auto& [name, t] : out)
    if (name.rfind("weights", 0) == 0 && t.rank() >= 2) n = t.shape().end()[-2];
  n = std::max<std::int64_t>(n, 32);  // enough rows to see the waves
  ir::Graph pe_graph = models::sinusoidal_positions_graph();
  auto pe = be->compile(pe_graph)->run({{"x", Tensor(DType::f32, {n, 64})}}).at("pe");
  const std::int64_t cell = std::clamp<std::int64_t>(512 / n, 2, 8);
  images.emplace_back("positions.png",
                      figure(io::heatmap(matrix(pe, 0, n, 64), n, 64, cell, -1.0, 1.0), "sinusoidal positions: " + std::to_string(n) + " x 64",
                             "dimension 0-63", "position 0-" + std::to_string(n - 1), {}, {}, cell, -1.0, 1.0, "value", ""));
  io::make_dirs(dir);
  io::OutputBatch files;
  std::vector<std::string> written;
  for (const auto& [name, img] : images) {
    const std::string path = (std::filesystem::path(dir) / name).string();
    files.add(path, io::encode_png(img));
    written.push_back(path);
  }
  files.commit();
  std::printf("%s on %s: wrote\n", p.title.c_str(), be->name().c_str());
  if (!labels.empty() && labels_text.empty()) {
    std::string joined;
    for (const std::string& l : labels) joined += (joined.empty() ? "" : "|") + l;
    std::printf("  token labels: %s\n", joined.c_str());
  }
  for (const auto& w : written) std::printf("  %s\n", w.c_str());
  return 0;
}

int cmd_train(const TrainFlags& f) {
  if (f.steps < 1 || f.batch < 1 || !(f.lr > 0)) throw UsageError("--steps and --batch must be positive, --lr above 0");
  const std::optional<DType> dtype = parse_dtype(f.dtype);
  if (!dtype || (*dtype != DType::f32 && !is_half(*dtype))) throw UsageError("--dtype " + f.dtype + ": f32, f16 or bf16");
  train::MixedPrecision mixed;
  mixed.compute = *dtype;
  // Under mpirun, data-parallel: each rank trains on its shard of every batch, on its own backend
  // (--backend a,b: rank i takes the i-th, cycling), and rank 0 reports.
  dist::Communicator& comm = dist::Communicator::world();
  const bool lead = comm.rank() == 0;
  if (f.batch % comm.size() != 0)
    throw UsageError("--batch " + std::to_string(f.batch) + " does not divide into " + std::to_string(comm.size()) + " equal shards, one per rank");
  if (lead && !f.png.empty()) io::check_writable(f.png);  // before training, not after
  const std::vector<std::string> choices = backend_list(f.backend);
  auto be = backend::create(choices[static_cast<std::size_t>(comm.rank()) % choices.size()]);
  ir::Graph model = models::copy_task_model();
  auto params = models::copy_task_params();
  train::Trainer trainer(model, "loss", params, train::Sgd{.lr = f.lr, .momentum = 0.9}, *be,
                         train::initialize(model, params, {train::Init::xavier_uniform}, f.seed), train::DataParallel{.comm = &comm}, mixed);
  const std::vector<std::string> names = comm.allgather(be->name());
  if (lead) {
    if (comm.size() == 1) std::printf("copy task on %s (%s)", be->name().c_str(), be->device().c_str());
    else std::printf("copy task, data-parallel over %d ranks (batch %d each):", comm.size(), f.batch / comm.size());
    for (std::size_t r = 0; comm.size() > 1 && r < names.size(); ++r) std::printf("%s rank %zu on %s", r ? "," : "", r, names[r].c_str());
    std::printf("; %d steps, batch %d, SGD lr %g momentum 0.9; chance loss %.4f\n", f.steps, f.batch, f.lr, models::copy_task_chance_loss());
    if (mixed.compute != DType::f32)
      std::printf("mixed precision: matmuls and attention in %s, f32 parameters%s\n", f.dtype.c_str(),
                  mixed.scales_loss() ? ", dynamic loss scaling" : "");
  }
  std::vector<double> losses;
  int skipped = 0;
  for (int s = 0; s < f.steps; ++s) {
    const auto batch = models::copy_task_batch(f.batch, f.seed * 1000 + static_cast<std::uint64_t>(s));
    losses.push_back(trainer.step(train::shard_batch(batch, comm.rank(), comm.size())));
    skipped += trainer.last_step_skipped();
    if (!lead) continue;
    const int width = 30, done = (s + 1) * width / f.steps;
    std::printf("step %4d/%d [%s%s] loss %.4f\n", s + 1, f.steps, std::string(static_cast<std::size_t>(done), '#').c_str(),
                std::string(static_cast<std::size_t>(width - done), '.').c_str(), losses.back());
  }
  if (!lead) return 0;
  std::printf("loss %.4f -> %.4f\n", losses.front(), losses.back());
  if (mixed.scales_loss()) std::printf("loss scale %g; %d of %d steps skipped (gradients overflowed f16)\n", trainer.loss_scale(), skipped, f.steps);
  if (!f.png.empty()) {
    io::Image plot = io::line_plot(losses, 640, 340, "SGD step", "loss");
    io::Image img(plot.width, plot.height + 16);
    io::draw_text(img, 8, 4, "copy task: cross-entropy loss per step (chance " + io::tick_label(models::copy_task_chance_loss()) + ")");
    img.paste(plot, 0, 16);
    io::write_png(f.png, img);
    std::printf("loss curve -> %s\n", f.png.c_str());
  }
  return 0;
}

}  // namespace qkv::tool
