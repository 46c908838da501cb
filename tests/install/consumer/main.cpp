// A complete program using installed qkv (docs/library.md shows this file): causal
// scaled dot-product attention written in the DSL, run on a backend chosen at run time, checked
// against the value worked out by hand.
#include <cmath>
#include <cstdio>

#include <qkv/backends.hpp>
#include <qkv/dsl.hpp>

int main(int argc, char** argv) {
  using namespace qkv;
  // Two tokens with 2-dim queries, keys and values; the sequence length N is named, so one
  // compiled graph serves every length.
  auto q = input<"q">(dim<"N">, dim<2>);
  auto k = input<"k">(dim<"N">, dim<2>);
  auto v = input<"v">(dim<"N">, dim<2>);
  auto weights = attention_weights(q, k, causal, scale(1.0));
  ir::Graph graph = lower(named<"out">(matmul(weights, v)), named<"weights">(weights));

  const Tensor qt = Tensor::from<float>({2, 2}, {1, 0, 0, 1});
  const Tensor vt = Tensor::from<float>({2, 2}, {1, 2, 3, 4});
  try {
    auto exe = backend::create(argc > 1 ? argv[1] : "cpu")->compile(graph);  // "reference", "cpu" or "vulkan"
    backend::TensorMap result = exe->run({{"q", qt}, {"k", qt}, {"v", vt}});
    // Query 1 sees keys 0 and 1 with scores 0 and 1: weights e^0 / (e^0 + e^1) and e^1 / (e^0 + e^1).
    const double w = result.at("weights").at(2), expected = 1.0 / (1.0 + std::exp(1.0));
    const double out = result.at("out").at(2);  // w * 1 + (1 - w) * 3
    std::printf("consumer: weight %.6f (expected %.6f), output %.6f\n", w, expected, out);
    return std::abs(w - expected) < 1e-6 && std::abs(out - (w + (1 - w) * 3)) < 1e-5 ? 0 : 1;
  } catch (const Error& e) {  // every qkv error: shapes, files, an unavailable backend
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 2;
  }
}
