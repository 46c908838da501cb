// Simplified self-attention, step by step: six tokens of "Your journey starts with one step" as
// 3-d embeddings; scores are dot products x xᵀ, weights their softmax per row, context vectors
// the weighted sums of the tokens. No trainable weights yet.
//   example_01_simplified_self_attention [backend]
#include <cmath>

#include <qkv/dsl.hpp>

#include "examples/example.hpp"

int main(int argc, char** argv) {
  using namespace qkv;
  auto be = example::open_backend(argc, argv);
  auto x = input<"x">(dim<"T">, dim<3>);
  auto scores = matmul<false, true>(x, x);  // ω_ij = x_i · x_j
  auto weights = softmax<-1>(scores);       // α_ij = softmax_j(ω_ij)
  auto context = matmul(weights, x);        // z_i = Σ_j α_ij x_j
  ir::Graph g = lower(named<"scores">(scores), named<"weights">(weights), named<"context">(context), named<"row_sums">(sum<-1>(weights)),
                      named<"same">(simple_self_attention(x)));
  try {
    auto r = be->compile(g)->run({{"x", example::journey()}});
    example::print_matrix("1. attention scores x xT (row 2 is 'journey' against every token):", r.at("scores"));
    example::print_matrix("2. attention weights, softmax of each row:", r.at("weights"));
    example::print_matrix("   each row sums to 1:", r.at("row_sums"));
    example::print_matrix("3. context vectors, weights @ x (row 2 is 'journey': 0.4419 0.6515 0.5683):", r.at("context"));
    const double z = r.at("context").at(3);
    if (std::abs(z - 0.4419) > 1e-3 || std::abs(r.at("same").at(3) - z) > 1e-6) {
      std::fprintf(stderr, "unexpected context vector\n");
      return 1;
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
