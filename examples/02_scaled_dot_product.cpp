// Scaled dot-product attention by hand on 2x2 matrices, then on random batches, and why the
// scores are divided by sqrt(d_k): without it, large d_k makes the softmax saturate into one-hot
// rows whose gradients vanish.
//   example_02_scaled_dot_product [backend]
#include <cmath>

#include <qkv/backends.hpp>
#include <qkv/dsl.hpp>

#include "examples/example.hpp"

int main(int argc, char** argv) {
  using namespace qkv;
  auto be = example::open_backend(argc, argv);
  try {
    // 1. By hand: q = [[1, 0], [0, 1]], k = [[1, 0], [1, 1]], v = [[1, 2], [3, 4]], d_k = 2.
    auto q = input<"q">(dim<2>, dim<2>);
    auto k = input<"k">(dim<2>, dim<2>);
    auto v = input<"v">(dim<2>, dim<2>);
    auto w = attention_weights(q, k);
    auto r = be->compile(lower(named<"weights">(w), named<"out">(matmul(w, v))))
                 ->run({{"q", Tensor::from<float>({2, 2}, {1, 0, 0, 1})},
                        {"k", Tensor::from<float>({2, 2}, {1, 0, 1, 1})},
                        {"v", Tensor::from<float>({2, 2}, {1, 2, 3, 4})}});
    std::printf("q kT = [[1, 1], [0, 1]]; / sqrt(2) = [[0.7071, 0.7071], [0, 0.7071]]\n");
    example::print_matrix("softmax per row (row 1: e^0 / (e^0 + e^0.7071) = 0.3302):", r.at("weights"));
    example::print_matrix("weights @ v:", r.at("out"));
    if (std::abs(r.at("weights").at(2) - 0.3302) > 1e-3) return 1;

    // 2. Random batches: 4 sequences of 5 queries over 7 keys, d_k = 64.
    auto qb = input<"q">(dim<"B">, dim<5>, dim<64>);
    auto kb = input<"k">(dim<"B">, dim<7>, dim<64>);
    auto vb = input<"v">(dim<"B">, dim<7>, dim<8>);
    ir::Graph batched = lower(named<"scaled">(attention_weights(qb, kb)), named<"unscaled">(attention_weights(qb, kb, scale(1.0))),
                              named<"out">(scaled_dot_product_attention(qb, kb, vb)));
    auto in = backend::random_inputs(batched, {{"B", 4}}, 1);
    auto rb = be->compile(batched)->run(in);
    std::printf("\nbatched: out %s from q %s, k %s, v %s\n", rb.at("out").type_string().c_str(), in.at("q").type_string().c_str(),
                in.at("k").type_string().c_str(), in.at("v").type_string().c_str());

    // 3. Saturation: with d_k = 64 unit-variance entries, q.k has standard deviation 8.
    auto stats = [&](const Tensor& t) {
      double max_sum = 0, entropy = 0;
      const std::int64_t rows = t.numel() / 7;
      for (std::int64_t i = 0; i < rows; ++i) {
        double mx = 0;
        for (std::int64_t j = 0; j < 7; ++j) {
          const double p = t.at(i * 7 + j);
          mx = std::max(mx, p);
          if (p > 0) entropy -= p * std::log(p);
        }
        max_sum += mx;
      }
      return std::make_pair(max_sum / static_cast<double>(rows), entropy / static_cast<double>(rows));
    };
    auto [scaled_max, scaled_h] = stats(rb.at("scaled"));
    auto [raw_max, raw_h] = stats(rb.at("unscaled"));
    std::printf("\n%-28s %14s %16s\n", "", "mean max weight", "mean entropy");
    std::printf("%-28s %14.4f %16.4f\n", "scaled by 1/sqrt(64)", scaled_max, scaled_h);
    std::printf("%-28s %14.4f %16.4f\n", "unscaled", raw_max, raw_h);
    std::printf(
        "(uniform over 7 keys: max 0.1429, entropy %.4f) unscaled rows are nearly one-hot: softmax saturates,\n"
        "and its gradient y (dy - sum(dy y)) vanishes where y is 0 or 1.\n",
        std::log(7.0));
    if (!(raw_max > scaled_max)) return 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
