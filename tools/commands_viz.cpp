// qkv viz (attention heatmaps as PNG) and qkv train (the copy task with a loss curve).
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "io/png.hpp"
#include "tools/commands.hpp"
#include "tools/models/models.hpp"
#include "train/init.hpp"
#include "train/trainer.hpp"

namespace qkv::tool {

namespace {

constexpr std::int64_t kCell = 24, kMargin = 70;

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

/// A weights heatmap in [0, 1] with a title and, when given, token labels down the left (queries)
/// and across the top (keys, first letters).
io::Image weights_image(const std::vector<double>& m, std::int64_t rows, std::int64_t cols, const std::string& title,
                        const std::vector<std::string>& labels) {
  io::Image img(cols * kCell + kMargin + 10, rows * kCell + kMargin + 10);
  img.paste(io::heatmap(m, rows, cols, kCell, 0.0, 1.0), kMargin, kMargin);
  io::draw_text(img, 4, 4, title);
  for (std::int64_t i = 0; i < rows && static_cast<std::size_t>(i) < labels.size(); ++i)
    io::draw_text(img, 4, kMargin + i * kCell + kCell / 2 - 3, labels[static_cast<std::size_t>(i)].substr(0, 10));
  for (std::int64_t j = 0; j < cols && static_cast<std::size_t>(j) < labels.size(); ++j)
    io::draw_text(img, kMargin + j * kCell + 2, kMargin - 12, labels[static_cast<std::size_t>(j)].substr(0, 3));
  return img;
}

}  // namespace

int cmd_viz(const Request& r, const std::string& backend_name, const std::string& dir, const std::string& labels_text) {
  if (dir.empty()) throw UsageError("--png DIR is required");
  std::filesystem::create_directories(dir);
  const auto labels = split_labels(labels_text);
  auto be = backend::create(backend_name);
  auto weights_of = [&](const Request& req) {
    Prepared p = prepare(req);
    auto out = be->compile(p.graph)->run(p.inputs);
    return std::make_pair(p, out);
  };
  auto [p, out] = weights_of(r);
  std::vector<std::string> written;
  auto save = [&](const io::Image& img, const std::string& name) {
    const std::string path = dir + "/" + name;
    io::write_png(path, img);
    written.push_back(path);
  };
  for (const auto& [name, t] : out) {
    if (name.rfind("weights", 0) != 0 || t.rank() < 2) continue;
    const std::int64_t rows = t.shape().end()[-2], cols = t.shape().back();
    if (t.rank() == 4) {  // [B, H, N, M]: each head of the first sequence, and their mean
      const std::int64_t heads = t.shape()[1];
      std::vector<double> mean(static_cast<std::size_t>(rows * cols), 0.0);
      for (std::int64_t h = 0; h < heads; ++h) {
        auto m = matrix(t, h, rows, cols);
        for (std::size_t i = 0; i < m.size(); ++i) mean[i] += m[i] / static_cast<double>(heads);
        save(weights_image(m, rows, cols, "head " + std::to_string(h), labels), name + "_head" + std::to_string(h) + ".png");
      }
      save(weights_image(mean, rows, cols, "mean over heads", labels), name + "_mean.png");
    } else {
      save(weights_image(matrix(t, 0, rows, cols), rows, cols, name, labels), name + ".png");
    }
  }
  // Causal next to full, for models with a causal option.
  const auto& spec_opts = [&]() -> std::vector<models::OptionSpec> {
    try {
      return models::find_model(r.target).options;
    } catch (const std::invalid_argument&) {
      return {};
    }
  }();
  if (std::any_of(spec_opts.begin(), spec_opts.end(), [](const auto& o) { return o.name == "causal"; })) {
    Request full = r, causal = r;
    full.set["causal"] = "false";
    causal.set["causal"] = "true";
    auto a = weights_of(full).second.at("weights");
    auto b = weights_of(causal).second.at("weights");
    const std::int64_t rows = a.shape().end()[-2], cols = a.shape().back();
    auto left = weights_image(matrix(a, 0, rows, cols), rows, cols, "full", labels);
    auto right = weights_image(matrix(b, 0, rows, cols), rows, cols, "causal", labels);
    io::Image both(left.width + right.width, left.height);
    both.paste(left, 0, 0);
    both.paste(right, left.width, 0);
    save(both, "causal_vs_full.png");
  }
  // The sinusoidal position encoding for the model's sequence length.
  std::int64_t n = 0;
  for (const auto& [name, t] : out)
    if (name.rfind("weights", 0) == 0 && t.rank() >= 2) n = t.shape().end()[-2];
  n = std::max<std::int64_t>(n, 32);  // enough rows to see the waves
  ir::Graph pe_graph = models::sinusoidal_positions_graph();
  auto pe = be->compile(pe_graph)->run({{"x", Tensor(DType::f32, {n, 64})}}).at("pe");
  io::Image pe_img(64 * 8 + kMargin, n * 8 + kMargin);
  pe_img.paste(io::heatmap(matrix(pe, 0, n, 64), n, 64, 8, -1.0, 1.0), kMargin, kMargin);
  io::draw_text(pe_img, 4, 4, "sinusoidal positions: " + std::to_string(n) + " x 64");
  save(pe_img, "positions.png");
  std::printf("%s on %s: wrote\n", p.title.c_str(), be->name().c_str());
  for (const auto& w : written) std::printf("  %s\n", w.c_str());
  return 0;
}

int cmd_train(const TrainFlags& f) {
  if (f.steps < 1 || f.batch < 1 || !(f.lr > 0)) throw UsageError("--steps and --batch must be positive, --lr above 0");
  auto be = backend::create(f.backend);
  ir::Graph model = models::copy_task_model();
  auto params = models::copy_task_params();
  train::Trainer trainer(model, "loss", params, train::Sgd{.lr = f.lr, .momentum = 0.9}, *be,
                         train::initialize(model, params, {train::Init::xavier_uniform}, f.seed));
  std::printf("copy task on %s (%s): %d steps, batch %d, SGD lr %g momentum 0.9; chance loss %.4f\n", be->name().c_str(),
              be->device().c_str(), f.steps, f.batch, f.lr, models::copy_task_chance_loss());
  std::vector<double> losses;
  for (int s = 0; s < f.steps; ++s) {
    losses.push_back(trainer.step(models::copy_task_batch(f.batch, f.seed * 1000 + static_cast<std::uint64_t>(s))));
    const int width = 30, done = (s + 1) * width / f.steps;
    std::printf("step %4d/%d [%s%s] loss %.4f\n", s + 1, f.steps, std::string(static_cast<std::size_t>(done), '#').c_str(),
                std::string(static_cast<std::size_t>(width - done), '.').c_str(), losses.back());
  }
  std::printf("loss %.4f -> %.4f\n", losses.front(), losses.back());
  if (!f.png.empty()) {
    io::Image img = io::line_plot(losses, 640, 360);
    io::draw_text(img, 60, 12, "copy task loss per step");
    io::write_png(f.png, img);
    std::printf("loss curve -> %s\n", f.png.c_str());
  }
  return 0;
}

}  // namespace qkv::tool
