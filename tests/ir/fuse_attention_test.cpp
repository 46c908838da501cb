// The attention fusion pass on graphs the DSL writes.
#include <gtest/gtest.h>

#include "dsl/dsl.hpp"
#include "ir/passes/passes.hpp"
#include "ir/printer.hpp"
#include "ir/verifier.hpp"

namespace qkv {
namespace {

int count(const ir::Graph& g, ir::Op op) {
  int n = 0;
  for (const auto& node : g.nodes()) n += node.op == op;
  return n;
}

TEST(FuseAttention, CausalSdpaBecomesOneNode) {
  auto q = input<"q">(dim<"B">, dim<"N">, dim<16>);
  auto k = input<"k">(dim<"B">, dim<"M">, dim<16>);
  auto v = input<"v">(dim<"B">, dim<"M">, dim<8>);
  ir::Graph g = ir::eliminate_dead_code(ir::fuse_attention(lower(scaled_dot_product_attention(q, k, v, causal_bottom_right))));
  ir::verify(g);
  EXPECT_EQ(count(g, ir::Op::attention), 1);
  EXPECT_EQ(count(g, ir::Op::softmax), 0);
  EXPECT_EQ(count(g, ir::Op::matmul), 0);
  std::string text = ir::print(g);
  EXPECT_NE(text.find("{value=0.25, causal=true, align=bottom_right}"), std::string::npos) << text;
}

TEST(FuseAttention, MaskAndCausalInEitherOrder) {
  auto q = input<"q">(dim<"N">, dim<4>);
  auto mask = input<"mask", DType::boolean>(dim<"N">, dim<"N">);
  for (const ir::Graph& g : {lower(scaled_dot_product_attention(q, q, q, mask, causal)),
                             lower(scaled_dot_product_attention(q, q, q, causal, mask))}) {
    ir::Graph f = ir::eliminate_dead_code(ir::fuse_attention(g));
    EXPECT_EQ(count(f, ir::Op::masked_attention), 1) << ir::print(f);
    EXPECT_EQ(count(f, ir::Op::causal_mask), 0);
  }
}

TEST(FuseAttention, ReturnedWeightsAreNotFusedAway) {
  auto q = input<"q">(dim<"N">, dim<4>);
  auto w = attention_weights(q, q);
  ir::Graph g = ir::fuse_attention(lower(named<"out">(matmul(w, q)), named<"weights">(w)));
  EXPECT_EQ(count(g, ir::Op::attention), 0);
  EXPECT_EQ(count(g, ir::Op::softmax), 1);
}

TEST(FuseAttention, DecompositionRestoresThePrimitives) {
  auto q = input<"q">(dim<"N">, dim<4>);
  ir::Graph g = lower(scaled_dot_product_attention(q, q, q, causal));
  ir::Graph back = ir::eliminate_dead_code(ir::decompose_composites(ir::fuse_attention(g), [](const ir::Node&) { return false; }));
  EXPECT_EQ(count(back, ir::Op::attention), 0);
  EXPECT_EQ(count(back, ir::Op::softmax), 0);
  EXPECT_EQ(count(back, ir::Op::reduce_max), 1);
  EXPECT_EQ(count(back, ir::Op::causal_mask), 1);
}

}  // namespace
}  // namespace qkv

namespace qkv {
namespace {


TEST(Autodiff, BackwardKeepsAttentionFused) {
  auto q = input<"q">(dim<"B">, dim<"N">, dim<16>);
  auto k = input<"k">(dim<"B">, dim<"M">, dim<16>);
  auto v = input<"v">(dim<"B">, dim<"M">, dim<16>);
  ir::Graph forward = lower(named<"out">(scaled_dot_product_attention(q, k, v, causal)));
  ir::Graph g = ir::build_backward(forward, {"", {"q", "k", "v"}, {"out"}});
  ir::verify(g);
  // The forward fused, its rows' log-sum-exp, and one fused gradient per operand: no N x M
  // value anywhere in the graph.
  EXPECT_EQ(count(g, ir::Op::attention), 1) << ir::print(g);
  EXPECT_EQ(count(g, ir::Op::attention_lse), 1) << ir::print(g);
  EXPECT_EQ(count(g, ir::Op::attention_grad), 3) << ir::print(g);
  EXPECT_EQ(count(g, ir::Op::softmax), 0) << ir::print(g);
  EXPECT_EQ(count(g, ir::Op::matmul), 0) << ir::print(g);
  EXPECT_EQ(g.type_string(g.output("d_k")), "f32[B,M,16]");
  // A backend that keeps attention gets the forward's row statistic right after it, where one
  // kernel can compute both.
  ir::Graph kept = ir::lower_for_backend(g, [](const ir::Node&) { return true; });
  ir::ValueId at = -1;
  for (std::size_t i = 0; i < kept.size(); ++i)
    if (kept.nodes()[i].op == ir::Op::attention) at = static_cast<ir::ValueId>(i);
  ASSERT_GE(at, 0);
  EXPECT_EQ(kept.node(at + 1).op, ir::Op::attention_lse) << ir::print(kept);
  // A backend that runs the decompositions shares the scores among them: the forward's two
  // products and the backward's four (dv, dy vT shared by dq and dk, dq, dk), as unfused
  // autodiff had.
  ir::Graph unfused = ir::lower_for_backend(g, [](const ir::Node&) { return false; });
  EXPECT_EQ(count(unfused, ir::Op::matmul), 6) << ir::print(unfused);
}

}  // namespace
}  // namespace qkv
