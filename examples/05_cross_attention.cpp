// Cross-attention: a 5-token decoder sequence attends to an 8-token encoder sequence; the
// weights are 5 x 8, every decoder token spreading its attention over the encoder's tokens.
//   example_05_cross_attention [backend]
#include <qkv/backends.hpp>
#include <qkv/dsl.hpp>

#include "examples/example.hpp"

int main(int argc, char** argv) {
  using namespace qkv;
  auto be = example::open_backend(argc, argv);
  try {
    auto decoder = input<"decoder">(dim<1>, dim<5>, dim<16>);
    auto encoder = input<"encoder">(dim<1>, dim<8>, dim<16>);
    auto r = cross_attention<2>(decoder, encoder, mha_params<"cross", 16>());
    ir::Graph g = lower(named<"out">(r.output), named<"weights">(mean_over_heads(r.weights)));
    auto in = backend::random_inputs(g, {}, 5);
    for (auto& [name, t] : in)
      if (name.starts_with("cross.")) t = Tensor::from<float>(t.shape(), std::vector<float>(static_cast<std::size_t>(t.numel()), 0.0f));
    // Identity-like projections keep the example readable: W_q = W_k = W_v = W_o = I / 2.
    for (const char* name : {"cross.out_proj.weight"})
      for (int i = 0; i < 16; ++i) in.at(name).data<float>()[i * 16 + i] = 1.0f;
    for (int m = 0; m < 3; ++m)
      for (int i = 0; i < 16; ++i) in.at("cross.in_proj_weight").data<float>()[(m * 16 + i) * 16 + i] = 0.5f;
    auto out = be->compile(g)->run(in);
    std::printf("decoder %s attends to encoder %s\n", in.at("decoder").type_string().c_str(), in.at("encoder").type_string().c_str());
    example::print_matrix("Weights (5 decoder queries x 8 encoder keys, mean over 2 heads):", out.at("weights"));
    std::printf("output %s: one context vector per decoder token\n", out.at("out").type_string().c_str());
    if (out.at("weights").numel() != 40) return 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
