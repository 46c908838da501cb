// Causal attention: the look-ahead mask, the weights with zeros above the diagonal, and dropout
// on the weights (training only), on the six tokens of "Your journey starts with one step".
//   example_03_causal_attention [backend]
#include <qkv/dsl.hpp>
#include <qkv/ir.hpp>

#include "examples/example.hpp"

int main(int argc, char** argv) {
  using namespace qkv;
  auto be = example::open_backend(argc, argv);
  auto x = input<"x">(dim<"N">, dim<3>);
  auto seed = input<"seed", DType::i32>();
  auto scores = matmul<false, true>(x, x);
  auto weights = attention_weights(x, x);
  auto causal_weights = attention_weights(x, x, causal);
  auto dropped = attention_weights(x, x, causal, attn_dropout(0.5, seed));
  ir::Graph graph = lower(named<"mask">(cast(look_ahead_mask(scores))), named<"weights">(weights), named<"causal_weights">(causal_weights),
                          named<"causal_context">(matmul(causal_weights, x)), named<"dropped">(dropped));
  std::printf("The lowered IR:\n%s\n", ir::print(graph).c_str());
  try {
    auto out = be->compile(graph)->run({{"x", example::journey()}, {"seed", Tensor::from<std::int32_t>({}, {123})}});
    example::print_matrix("The look-ahead mask (1 keeps: query i sees keys j <= i):", out.at("mask"));
    example::print_matrix("Weights without the mask:", out.at("weights"));
    example::print_matrix("Causal weights (zeros above the diagonal; each row still sums to 1):", out.at("causal_weights"));
    example::print_matrix("Causal context vectors:", out.at("causal_context"));
    example::print_matrix("Causal weights after dropout p = 0.5 (seed 123; kept weights doubled, the same bits on every backend):",
                          out.at("dropped"));
    for (std::int64_t i = 0; i < 6; ++i)
      for (std::int64_t j = i + 1; j < 6; ++j)
        if (out.at("causal_weights").at(i * 6 + j) != 0.0) return 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
