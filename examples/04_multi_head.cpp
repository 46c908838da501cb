// Multi-head attention: two heads over the six tokens, their weights one by one, and the same
// computation with the weights laid out as PyTorch's nn.MultiheadAttention holds them
// (in_proj_weight stacks W_q, W_k, W_v; out_proj).
//   example_04_multi_head [backend]
#include <qkv/backends.hpp>
#include <qkv/dsl.hpp>

#include "examples/example.hpp"

int main(int argc, char** argv) {
  using namespace qkv;
  auto be = example::open_backend(argc, argv);
  try {
    auto x = input<"x">(dim<1>, dim<6>, dim<4>);
    auto wq = input<"wq">(dim<4>, dim<4>);
    auto wk = input<"wk">(dim<4>, dim<4>);
    auto wv = input<"wv">(dim<4>, dim<4>);
    auto wo = input<"wo">(dim<4>, dim<4>);
    auto r = multi_head_attention<2>(x, x, x, wq, wk, wv, no_bias, no_bias, no_bias, wo, no_bias, causal);
    // The same, reading torch's packed parameters: in_proj_weight = [W_q; W_k; W_v].
    auto torch = causal_self_attention<2>(x, mha_params<"", 4, false>());
    ir::Graph g =
        lower(named<"out">(r.output), named<"weights">(r.weights), named<"mean">(mean_over_heads(r.weights)), named<"torch_out">(torch.output));
    auto in = backend::random_inputs(g, {}, 4);
    // Pack the separate matrices into in_proj_weight [12, 4] as torch does.
    Tensor packed(DType::f32, {12, 4});
    for (int m = 0; m < 3; ++m)
      for (int i = 0; i < 16; ++i) packed.data<float>()[m * 16 + i] = in.at(m == 0 ? "wq" : m == 1 ? "wk" : "wv").data<float>()[i];
    in.insert_or_assign("in_proj_weight", packed);
    in.insert_or_assign("out_proj.weight", in.at("wo"));
    Tensor x6(DType::f32, {1, 6, 4});
    for (int t = 0; t < 6; ++t)
      for (int e = 0; e < 4; ++e) x6.data<float>()[t * 4 + e] = e < 3 ? example::journey().at(t * 3 + e) : 1.0f;
    in.insert_or_assign("x", x6);
    auto out = be->compile(g)->run(in);
    example::print_matrix("Head 0 weights (causal):", out.at("weights"), 0);
    example::print_matrix("Head 1 weights (its own projections, its own pattern):", out.at("weights"), 1);
    example::print_matrix("Mean over heads (torch's need_weights=True, average_attn_weights=True):", out.at("mean"));
    example::print_matrix("Output, separate matrices:", out.at("out"));
    example::print_matrix("Output, torch's packed in_proj_weight:", out.at("torch_out"));
    for (std::int64_t i = 0; i < out.at("out").numel(); ++i)
      if (std::abs(out.at("out").at(i) - out.at("torch_out").at(i)) > 1e-5) return 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
