// Positional encodings: the sinusoidal table of "Attention Is All You Need" (sin on even dims, cos
// on odd, wavelengths from 2π to 10000·2π), printed and drawn as a heatmap PNG; then rotary
// embeddings, whose scores depend only on relative positions.
//   example_06_positional_encodings [backend] [png-folder]
#include <cmath>
#include <filesystem>

#include <qkv/dsl.hpp>

#include "examples/example.hpp"
#include "io/file.hpp"
#include "plot/figure.hpp"

int main(int argc, char** argv) {
  using namespace qkv;
  auto be = example::open_backend(argc, argv);
  const std::string dir = argc > 2 ? argv[2] : (std::filesystem::temp_directory_path() / "qkv_examples").string();
  try {
    auto x = input<"x">(dim<"N">, dim<16>);
    auto r = be->compile(lower(named<"pe">(sinusoidal_positions(x))))->run({{"x", Tensor(DType::f32, {50, 16})}});
    const Tensor& pe = r.at("pe");
    std::printf("PE[pos, 2i] = sin(pos / 10000^(2i/16)), PE[pos, 2i+1] = cos(...); the first 6 positions, dims 0..7:\n");
    for (int p = 0; p < 6; ++p) {
      std::printf("  pos %d:", p);
      for (int d = 0; d < 8; ++d) std::printf(" %7.4f", pe.at(p * 16 + d));
      std::printf("\n");
    }
    std::vector<double> values(static_cast<std::size_t>(pe.numel()));
    for (std::int64_t i = 0; i < pe.numel(); ++i) values[static_cast<std::size_t>(i)] = pe.at(i);
    std::filesystem::create_directories(dir);
    plot::HeatmapFigure figure;
    figure.panels.resize(1);
    plot::Heatmap& map = figure.panels[0];
    map.title = "sinusoidal positions", map.rows = 50, map.cols = 16, map.values = values;
    map.x_name = "dimension", map.y_name = "position";
    figure.lo = -1, figure.hi = 1, figure.colormap = plot::Colormap::red_blue, figure.bar_label = "value";
    io::write_file_atomic(dir + "/sinusoidal_positions.png", plot::render(plot::to_svg(figure), plot::Format::png));
    std::printf("heatmap (50 positions down, 16 dims across) -> %s/sinusoidal_positions.png\n", dir.c_str());
    if (std::abs(pe.at(1 * 16 + 0) - std::sin(1.0)) > 1e-5 || std::abs(pe.at(1 * 16 + 1) - std::cos(1.0)) > 1e-5) return 1;

    // Rotary embeddings: q at position m and k at position n score the same as at m + s, n + s.
    auto q = input<"q">(dim<1>, dim<8>);
    auto k = input<"k">(dim<1>, dim<8>);
    auto pq = cast(input<"pq", DType::i32>(dim<1>));
    auto pk = cast(input<"pk", DType::i32>(dim<1>));
    auto exe = be->compile(lower(matmul<false, true>(rotary_at(q, pq), rotary_at(k, pk))));
    auto vec = Tensor::from<float>({1, 8}, {0.3f, -1.0f, 0.5f, 0.2f, 0.9f, -0.4f, 0.1f, 0.7f});
    std::printf("\nrotary embeddings: score of q at m and k at n\n");
    double first = 0;
    for (auto [m, n] : {std::pair{3, 1}, std::pair{10, 8}, std::pair{42, 40}, std::pair{3, 2}}) {
      auto s = exe->run({{"q", vec}, {"k", vec}, {"pq", Tensor::from<std::int32_t>({1}, {m})}, {"pk", Tensor::from<std::int32_t>({1}, {n})}})
                   .at("out")
                   .at(0);
      std::printf("  m = %2d, n = %2d (m - n = %d): %.6f\n", m, n, m - n, s);
      if (m == 3 && n == 1) first = s;
      else if (m - n == 2 && std::abs(s - first) > 1e-5) return 1;
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
