// The DSL: static shapes, named dims, lowering with shared subexpressions.
#include <gtest/gtest.h>

#include <cmath>
#include <type_traits>

#include "backends/backend.hpp"
#include "dsl/dsl.hpp"
#include "ir/printer.hpp"
#include "ir/verifier.hpp"

namespace qkv {
namespace {

TEST(Dsl, StaticShapesAreComputedAtCompileTime) {
  auto q = input<"q">(dim<2>, dim<5>, dim<8>);
  auto k = input<"k">(dim<2>, dim<7>, dim<8>);
  using Scores = decltype(matmul<false, true>(q, k));
  static_assert(Scores::shape == ir::Shape{2, 5, 7});
  using Summed = decltype(sum<-1, false>(matmul<false, true>(q, k)));
  static_assert(Summed::shape == ir::Shape{2, 5});
  using Permuted = decltype(permute<1, 0, 2>(q));
  static_assert(Permuted::shape == ir::Shape{5, 2, 8});
  using Split = decltype(reshape(q, dim<2>, dim<5>, dim<2>, dim<4>));
  static_assert(Split::shape == ir::Shape{2, 5, 2, 4});
  SUCCEED();
}

TEST(Dsl, NamedDimsLowerToSymbols) {
  auto x = input<"x">(dim<"B">, dim<"N">, dim<16>);
  ir::Graph g = lower(softmax(x));
  EXPECT_EQ(g.type_string(g.inputs()[0]), "f32[B,N,16]");
  EXPECT_EQ(g.outputs()[0].first, "out");
}

TEST(Dsl, LoweringSharesSubexpressions) {
  auto x = input<"x">(dim<4>, dim<4>);
  auto e = exp(x);
  ir::Graph g = lower(e * e + e);  // exp(x) appears three times in the expression tree
  int exps = 0;
  for (const auto& n : g.nodes()) exps += n.op == ir::Op::exp;
  EXPECT_EQ(exps, 1);
  ir::verify(g);
}

TEST(Dsl, AnExpressionsTypeIsItsShapeAndDtype) {
  // What an expression computes is not in its type, so a loop can build a model of any depth
  // (a run-time number of layers) and equal shapes share one instantiation of every builder.
  auto x = input<"x">(dim<"B">, dim<8>);
  static_assert(std::is_same_v<decltype(exp(x)), decltype(tanh(x) * 2.0 + exp(x))>);
  auto h = exp(x);
  for (int layer = 0; layer < 3; ++layer) h = tanh(h) + h;
  ir::Graph g = lower(h);
  int tanhs = 0;
  for (const auto& n : g.nodes()) tanhs += n.op == ir::Op::tanh;
  EXPECT_EQ(tanhs, 3);
  ir::verify(g);
}

TEST(Dsl, HalfPrecisionInputsKeepTheirDtypeThroughAttention) {
  auto q = input<"q", DType::f16>(dim<"B">, dim<"N">, dim<16>);
  auto kv = input<"kv", DType::bf16>(dim<"B">, dim<"N">, dim<16>);
  auto k = cast<DType::f16>(kv);
  auto y = scaled_dot_product_attention(q, k, k, causal) * 0.5;  // a scalar takes the tensor's dtype
  static_assert(decltype(y)::dtype == DType::f16);
  auto out = cast(y);
  static_assert(decltype(out)::dtype == DType::f32);
  static_assert(decltype(cast<DType::bf16>(out))::dtype == DType::bf16);
  ir::Graph g = lower(out);
  ir::verify(g);
  EXPECT_EQ(g.node(g.inputs()[0]).dtype, DType::f16);
  EXPECT_EQ(g.node(g.inputs()[1]).dtype, DType::bf16);
  int casts = 0;
  for (const auto& n : g.nodes()) casts += n.op == ir::Op::cast;
  EXPECT_EQ(casts, 2);
}

TEST(Dsl, DeepExpressionsLowerAndReleaseWithoutRecursion) {
  // 200000 nodes deep: a recursive walk or a recursive release would overflow the stack (under
  // the sanitizers' larger frames well before this).
  auto x = input<"x">(dim<2>);
  auto h = exp(x);
  constexpr int kDepth = 200000;
  for (int i = 0; i < kDepth; ++i) h = h + 1.0;
  ir::Graph g = lower(h);
  int adds = 0;
  for (const auto& n : g.nodes()) adds += n.op == ir::Op::add;
  EXPECT_EQ(adds, kDepth);
  EXPECT_EQ(g.outputs().size(), 1u);
}

TEST(Dsl, ScaledDotProductAttentionGraph) {
  auto q = input<"q">(dim<"B">, dim<"N">, dim<64>);
  auto k = input<"k">(dim<"B">, dim<"M">, dim<64>);
  auto v = input<"v">(dim<"B">, dim<"M">, dim<32>);
  auto w = attention_weights(q, k, causal);
  auto out = matmul(w, v);
  static_assert(decltype(out)::shape.back(0) == 32);
  ir::Graph g = lower(named<"out">(out), named<"weights">(w));
  std::string text = ir::print(g);
  EXPECT_NE(text.find("transpose_b=true"), std::string::npos);
  EXPECT_NE(text.find("value=0.125"), std::string::npos);
  EXPECT_NE(text.find("causal_mask"), std::string::npos);
  EXPECT_NE(text.find("softmax"), std::string::npos);
  EXPECT_EQ(g.outputs().size(), 2u);
  // The weights output is the softmax the attention output reads: shared, not computed twice.
  int softmaxes = 0;
  for (const auto& n : g.nodes()) softmaxes += n.op == ir::Op::softmax;
  EXPECT_EQ(softmaxes, 1);
}

TEST(Dsl, ExplicitScaleAndMask) {
  auto q = input<"q">(dim<"N">, dim<"D">);
  auto k = input<"k">(dim<"M">, dim<"D">);
  auto v = input<"v">(dim<"M">, dim<"D">);
  auto mask = input<"mask", DType::boolean>(dim<"N">, dim<"M">);
  ir::Graph g = lower(scaled_dot_product_attention(q, k, v, mask, scale(0.5)));
  EXPECT_NE(ir::print(g).find("value=0.5"), std::string::npos);
  EXPECT_NE(ir::print(g).find("where"), std::string::npos);
}

TEST(Dsl, ExpressionsOutliveTheirParts) {
  auto make = [] {
    auto x = input<"x">(dim<3>);
    return exp(x) + 1.0;  // terms are shared and owned: nothing dangles after x goes out of scope
  };
  auto e = make();
  ir::Graph g = lower(e);
  EXPECT_EQ(g.size(), 4u);
}

}  // namespace
}  // namespace qkv

namespace qkv {
namespace {

// Dims as expressions: a packed weight [3*E, E] and heads split from a named E name their dims
// in the graph; with sizes instead of names the same builders make static shapes.
TEST(Dsl, DimExpressionsAndNamedHeadsLowerToDerivedDims) {
  constexpr DimArg E = "E", H = "H";
  static_assert((3 * E).is_named() && (3 * E).name_view() == "3*E" && (E / H * 2).name_view() == "(E/H)*2");
  static_assert((DimArg(3) * DimArg(8)).value == 24 && !(DimArg(3) * DimArg(8)).is_named());
  auto x = input<"x">(dim<"B">, dim<"N">, dim<E>);
  auto w = input<"w">(dim<3 * E>, dim<E>);
  auto heads = split_heads<H>(linear(x, w));
  static_assert(decltype(heads)::shape[1] == ir::symbol_id("H"));
  ir::Graph g = lower(named<"w">(w), named<"heads">(heads), named<"joined">(merge_heads(heads)));
  EXPECT_EQ(g.type_string(g.output("w")), "f32[3*E,E]");
  EXPECT_EQ(g.type_string(g.output("heads")), "f32[B,H,N,3*E/H]");
  EXPECT_EQ(g.type_string(g.output("joined")), "f32[B,N,H*(3*E/H)]");
  EXPECT_EQ(ir::print(ir::parse_graph(ir::print(g))), ir::print(g));
  auto fixed = split_heads<4>(linear(input<"x">(dim<"B">, dim<"N">, dim<32>), input<"w">(dim<3 * DimArg(32)>, dim<32>)));
  static_assert(decltype(fixed)::shape == ir::Shape{ir::symbol_id("B"), 4, ir::symbol_id("N"), 24});
}

TEST(Lower, DefaultScaleOfANamedHeadDimIsResolvedWhenBound) {
  // One graph for every D: at D = 3 the default scale is 1/sqrt(3), at D = 5 it is 1/sqrt(5).
  auto q = input<"q">(dim<"N">, dim<"D">);
  const ir::Graph auto_scale = lower(attention_weights(q, q));
  for (std::int64_t d : {3, 5}) {
    const ir::Graph fixed = lower(attention_weights(q, q, scale(1.0 / std::sqrt(static_cast<double>(d)))));
    std::vector<float> x(static_cast<std::size_t>(4 * d));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::cos(static_cast<float>(i) * 0.7f);
    const backend::TensorMap in{{"q", Tensor::from<float>({4, d}, x)}};
    for (const char* name : {"reference", "cpu"}) {
      auto be = backend::create(name);
      const Tensor a = be->compile(auto_scale)->run(in).at("out"), b = be->compile(fixed)->run(in).at("out");
      for (std::int64_t i = 0; i < a.numel(); ++i) EXPECT_NEAR(a.at(i), b.at(i), 1e-6) << name << " D=" << d << " at " << i;
    }
  }
}

}  // namespace
}  // namespace qkv
