// The attention fusion pass on graphs the DSL writes.
#include <gtest/gtest.h>

#include <algorithm>

#include "dsl/dsl.hpp"
#include "ir/error.hpp"
#include "ir/passes/passes.hpp"
#include "ir/printer.hpp"
#include "ir/region.hpp"
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
  EXPECT_NE(text.find("{scale=0.25, causal=true, align=bottom_right}"), std::string::npos) << text;
}

TEST(FuseAttention, FusesOnlyWhatTheBackendKeeps) {
  // A backend that keeps no attention (the reference) gets the graph as written: nothing is
  // fused to be decomposed again. One that keeps some gets just those fused.
  auto q = input<"q">(dim<"B">, dim<"N">, dim<16>);
  auto k = input<"k">(dim<"B">, dim<"N">, dim<16>);
  auto mask = input<"mask", DType::boolean>(dim<"N">, dim<"N">);
  ir::Graph g = lower(named<"plain">(scaled_dot_product_attention(q, q, q, causal)),
                      named<"masked">(scaled_dot_product_attention(k, k, k, mask, sliding_window<4>)));
  EXPECT_EQ(ir::print(ir::fuse_attention(g, [](const ir::Node&) { return false; })), ir::print(g));
  ir::Graph some = ir::eliminate_dead_code(ir::fuse_attention(g, [](const ir::Node& n) { return n.op != ir::Op::masked_attention; }));
  EXPECT_EQ(count(some, ir::Op::attention), 1) << ir::print(some);
  EXPECT_EQ(count(some, ir::Op::masked_attention), 0);
  EXPECT_EQ(count(some, ir::Op::softmax), 1);  // the masked one's, as written
  // The predicate sees the fused node whole, shape included (vulkan's depends on the head dim).
  std::vector<ir::Shape> seen;
  ir::fuse_attention(g, [&](const ir::Node& n) {
    seen.push_back(n.shape);
    return true;
  });
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].back(), 16);
  // The pipeline asks the backend: lowered for one keeping no composite, the graph is the
  // pipeline's other passes over the graph as written, not over a decomposed attention.
  auto primitives = [](const ir::Node& n) { return ir::op_info(n.op).category != ir::OpCategory::composite; };
  const ir::Graph as_written =
      ir::eliminate_dead_code(ir::fold_padded_sums(ir::eliminate_common_subexpressions(ir::decompose_composites(g, primitives))));
  EXPECT_EQ(ir::print(ir::lower_for_backend(g, primitives)), ir::print(as_written));
  std::vector<ir::Op> asked;
  ir::lower_for_backend(g, [&](const ir::Node& n) {
    asked.push_back(n.op);
    return primitives(n);
  });
  // Fusion asks about each candidate first; declined, none exists for decomposition to ask about.
  ASSERT_GE(asked.size(), 2u);
  EXPECT_EQ(asked[0], ir::Op::attention);
  EXPECT_EQ(asked[1], ir::Op::masked_attention);
  EXPECT_EQ(std::count_if(asked.begin(), asked.end(), [](ir::Op op) { return ir::is_fused_attention(op); }), 2);
}

TEST(FuseAttention, MaskAndCausalInEitherOrder) {
  auto q = input<"q">(dim<"N">, dim<4>);
  auto mask = input<"mask", DType::boolean>(dim<"N">, dim<"N">);
  for (const ir::Graph& g :
       {lower(scaled_dot_product_attention(q, q, q, mask, causal)), lower(scaled_dot_product_attention(q, q, q, causal, mask))}) {
    ir::Graph f = ir::eliminate_dead_code(ir::fuse_attention(g));
    EXPECT_EQ(count(f, ir::Op::masked_attention), 1) << ir::print(f);
    EXPECT_EQ(count(f, ir::Op::causal_mask), 0);
  }
}

/// The one flex_attention node of `g` (fused and without dead code), or a failure.
std::string fused_modifier(const ir::Graph& g) {
  ir::Graph f = ir::eliminate_dead_code(ir::fuse_attention(g));
  ir::verify(f);
  EXPECT_EQ(count(f, ir::Op::softmax), 0) << ir::print(f);
  for (const auto& n : f.nodes())
    if (n.op == ir::Op::flex_attention) return ir::region_expression(*n.region);
  ADD_FAILURE() << "no flex_attention in\n" << ir::print(f);
  return {};
}

TEST(FuseAttention, EveryLibraryModifierIsFusedAsARegion) {
  auto q = input<"q">(dim<"B">, dim<4>, dim<"N">, dim<16>);
  auto k = input<"k">(dim<"B">, dim<4>, dim<"M">, dim<16>);
  auto bias = input<"bias">(dim<"N">, dim<"M">);
  auto mask = input<"mask", DType::boolean>(dim<"N">, dim<"M">);
  EXPECT_EQ(fused_modifier(lower(scaled_dot_product_attention(q, k, k, softcap_scores(30)))), "tanh(score / 30) * 30");
  EXPECT_EQ(fused_modifier(lower(scaled_dot_product_attention(q, k, k, bias))), "score + t0");
  // Soft-capping comes first whatever the order written; a boolean mask after it joins the region.
  EXPECT_EQ(fused_modifier(lower(scaled_dot_product_attention(q, k, k, mask, softcap_scores(5)))), "where(t0, tanh(score / 5) * 5, -inf)");
  // ALiBi's [H, 1, M] bias is a tensor the region reads; causality stays the node's attribute.
  ir::Graph alibi = ir::eliminate_dead_code(ir::fuse_attention(lower(scaled_dot_product_attention(q, k, k, causal_bottom_right, alibi_bias<4>(k)))));
  EXPECT_EQ(count(alibi, ir::Op::flex_attention), 1) << ir::print(alibi);
  EXPECT_NE(ir::print(alibi).find("causal=true, align=bottom_right"), std::string::npos) << ir::print(alibi);
  EXPECT_EQ(fused_modifier(lower(scaled_dot_product_attention(q, k, k, causal_bottom_right, alibi_bias<4>(k)))), "score + t0");
  // Temperature and scale only change the scale: plain attention.
  ir::Graph warm = ir::fuse_attention(lower(scaled_dot_product_attention(q, k, k, temperature(2.0))));
  EXPECT_EQ(count(warm, ir::Op::attention), 1) << ir::print(warm);
}

/// A keep-mask computed elementwise over N x M (document masking from ids) joins the modifier:
/// it is recomputed per tile from the two id vectors, never kept N x M; causality stays the
/// node's attribute. A mask that is an input stays masked_attention's operand.
TEST(FuseAttention, ADocumentMaskFromIdsIsRecomputedPerTile) {
  auto q = input<"q">(dim<"B">, dim<4>, dim<"N">, dim<16>);
  auto docs = input<"docs", DType::i32>(dim<"B">, dim<"N">);
  const ir::Graph g = lower(scaled_dot_product_attention(q, q, q, document_mask(docs, docs), causal));
  EXPECT_EQ(fused_modifier(g), "where(t0 == t1, score, -inf)");
  ir::Graph f = ir::eliminate_dead_code(ir::fuse_attention(g));
  for (const auto& n : f.nodes()) {
    if (n.op != ir::Op::flex_attention) continue;
    EXPECT_TRUE(n.attrs.causal);
    ASSERT_EQ(n.inputs.size(), 5u);
    EXPECT_EQ(f.type_string(DType::f32, f.node(n.inputs[3]).shape), "f32[B,1,N,1]");
    EXPECT_EQ(f.type_string(DType::f32, f.node(n.inputs[4]).shape), "f32[B,1,1,N]");
  }
  EXPECT_EQ(count(f, ir::Op::equal), 0) << "the N x N comparison is left to the modifier\n" << ir::print(f);
}

/// Dropout on the weights (attn_dropout: weights * dropout_mask(weights, seed)) joins the fused
/// node: flex attention with the probability as its attribute and the seed as its last operand,
/// after the modifier's tensors; with no modifier the region is the identity. p = 0 (evaluation)
/// is plain attention. When v adds batch dims the weights' element index (which keys the bits)
/// is not the output's, and nothing is fused. The backward keeps it fused: the lse without
/// dropout, the three gradients with it.
TEST(FuseAttention, DropoutOnTheWeightsJoinsTheKernel) {
  auto q = input<"q">(dim<"B">, dim<4>, dim<"N">, dim<16>);
  auto mask = input<"mask", DType::boolean>(dim<"N">, dim<"N">);
  auto seed = input<"seed", DType::i32>();
  auto flex_of = [](const ir::Graph& f) -> const ir::Node* {
    for (const auto& n : f.nodes())
      if (n.op == ir::Op::flex_attention) return &n;
    return nullptr;
  };
  {
    ir::Graph f =
        ir::eliminate_dead_code(ir::fuse_attention(lower(named<"out">(scaled_dot_product_attention(q, q, q, causal, attn_dropout(0.1, seed))))));
    ir::verify(f);
    const ir::Node* n = flex_of(f);
    ASSERT_NE(n, nullptr) << ir::print(f);
    EXPECT_EQ(ir::region_expression(*n->region), "score");
    EXPECT_EQ(n->attrs.dropout, 0.1);
    EXPECT_TRUE(n->attrs.causal);
    ASSERT_EQ(n->inputs.size(), 4u);
    EXPECT_EQ(f.node(n->inputs[3]).name, "seed");
    EXPECT_EQ(count(f, ir::Op::dropout_mask), 0);
    EXPECT_EQ(count(f, ir::Op::softmax), 0);
    const std::string text = ir::print(f);
    EXPECT_NE(text.find("causal=true, align=top_left, dropout=0.1"), std::string::npos) << text;
    EXPECT_EQ(ir::print(ir::parse_graph(text)), text);

    ir::Graph back =
        ir::build_backward(lower(named<"out">(scaled_dot_product_attention(q, q, q, causal, attn_dropout(0.1, seed)))), {"", {"q"}, {"out"}});
    int grads = 0, lse = 0;
    for (const auto& node : back.nodes()) {
      if (node.op == ir::Op::flex_attention_grad) {
        ++grads;
        EXPECT_EQ(node.attrs.dropout, 0.1);
        EXPECT_EQ(back.node(node.inputs.back()).name, "seed");
      }
      if (node.op == ir::Op::flex_attention_lse) {
        ++lse;
        EXPECT_EQ(node.attrs.dropout, 0.0);
        EXPECT_EQ(node.inputs.size(), 2u) << "the lse takes no seed";
      }
    }
    EXPECT_GE(grads, 1) << ir::print(back);
    EXPECT_EQ(lse, 1) << ir::print(back);
    EXPECT_EQ(count(back, ir::Op::softmax), 0) << ir::print(back);
    EXPECT_EQ(count(back, ir::Op::dropout_mask), 0) << ir::print(back);
    EXPECT_EQ(ir::print(ir::parse_graph(ir::print(back))), ir::print(back));
  }
  {
    ir::Graph f =
        ir::eliminate_dead_code(ir::fuse_attention(lower(scaled_dot_product_attention(q, q, q, mask, softcap_scores(5), attn_dropout(0.25, seed)))));
    const ir::Node* n = flex_of(f);
    ASSERT_NE(n, nullptr) << ir::print(f);
    EXPECT_EQ(ir::region_expression(*n->region), "where(t0, tanh(score / 5) * 5, -inf)");
    ASSERT_EQ(n->inputs.size(), 5u);  // q, k, v, the mask, the seed
    EXPECT_EQ(f.node(n->inputs[3]).name, "mask");
    EXPECT_EQ(f.node(n->inputs[4]).name, "seed");
  }
  {
    ir::Graph f = ir::eliminate_dead_code(ir::fuse_attention(lower(scaled_dot_product_attention(q, q, q, mask, attn_dropout(0.25, seed)))));
    const ir::Node* n = flex_of(f);
    ASSERT_NE(n, nullptr) << ir::print(f);
    EXPECT_EQ(ir::region_expression(*n->region), "where(t0, score, -inf)");
  }
  ir::Graph eval = ir::eliminate_dead_code(ir::fuse_attention(lower(scaled_dot_product_attention(q, q, q, causal, attn_dropout(0.0, seed)))));
  EXPECT_EQ(count(eval, ir::Op::attention), 1) << ir::print(eval);
  EXPECT_EQ(count(eval, ir::Op::dropout_mask), 0) << ir::print(eval);
  // v [2, B, 4, N, 16] adds a batch dim the weights [B, 4, N, N] lack.
  auto v = input<"v">(dim<2>, dim<"B">, dim<4>, dim<"N">, dim<16>);
  ir::Graph wide = ir::fuse_attention(lower(scaled_dot_product_attention(q, q, v, attn_dropout(0.25, seed))));
  EXPECT_EQ(count(wide, ir::Op::flex_attention), 0) << ir::print(wide);
  EXPECT_EQ(count(wide, ir::Op::softmax), 1) << ir::print(wide);
}

TEST(FuseAttention, PositionsFromIotaBecomeTheQueryAndKeyIndices) {
  // A relative-position bias slope * (j - i) written over an N x M grid: the grid is recomputed
  // per score from the indices, not kept as a tensor.
  auto q = input<"q">(dim<"N">, dim<8>);
  auto slope = input<"slope">(dim<1>);
  auto grid = matmul<false, true>(q, q);  // any [N, N] value: iota reads only its shape
  auto rel = (iota<-1>(grid) - iota<-2>(grid)) * slope;
  ir::Graph g = ir::eliminate_dead_code(ir::fuse_attention(lower(scaled_dot_product_attention(q, q, q, rel))));
  int flex = 0;
  for (const auto& n : g.nodes())
    if (n.op == ir::Op::flex_attention) {
      ++flex;
      EXPECT_EQ(ir::region_expression(*n.region), "score + (kv_idx - q_idx) * t0");
      EXPECT_EQ(n.inputs.size(), 4u);  // q, k, v and the slope
    }
  EXPECT_EQ(flex, 1) << ir::print(g);
}

TEST(FuseAttention, AModifierValueUsedElsewhereIsNotFused) {
  // The capped scores are also an output: the chain must stay materialised.
  auto q = input<"q">(dim<"N">, dim<4>);
  auto capped = softcap(matmul<false, true>(q, q) * 0.5, 3.0);
  ir::Graph g = ir::fuse_attention(lower(named<"out">(matmul(softmax<-1>(capped), q)), named<"capped">(capped)));
  EXPECT_EQ(count(g, ir::Op::flex_attention), 0) << ir::print(g);
  EXPECT_EQ(count(g, ir::Op::softmax), 1);
}

TEST(FuseAttention, FlexAttentionPrintsParsesAndRoundTrips) {
  auto q = input<"q">(dim<"B">, dim<4>, dim<"N">, dim<16>);
  auto mask = input<"mask", DType::boolean>(dim<"N">, dim<"N">);
  ir::Graph g = ir::fuse_attention(lower(scaled_dot_product_attention(q, q, q, mask, softcap_scores(5), causal)));
  const std::string text = ir::print(g);
  EXPECT_NE(text.find("flex_attention("), std::string::npos) << text;
  EXPECT_NE(text.find("    %0 = input \"score\" : f32[]"), std::string::npos) << text;
  EXPECT_EQ(ir::print(ir::parse_graph(text)), text);
  // Equal regions are shared like any node; a different one is not.
  ir::Graph twice;
  twice.copy_symbols(g);
  std::vector<ir::ValueId> map;
  for (const auto& n : g.nodes()) {
    std::vector<ir::ValueId> ins;
    for (ir::ValueId v : n.inputs) ins.push_back(map[static_cast<std::size_t>(v)]);
    map.push_back(twice.add_like(n, ins));
  }
  const ir::Node& flex = g.node(g.outputs()[0].second);
  ASSERT_EQ(flex.op, ir::Op::flex_attention);
  std::vector<ir::ValueId> ins;
  for (ir::ValueId v : flex.inputs) ins.push_back(map[static_cast<std::size_t>(v)]);
  auto copy = std::make_shared<const ir::Graph>(ir::parse_graph(ir::print(*flex.region)));
  EXPECT_EQ(twice.add(ir::Op::flex_attention, ins, flex.attrs, copy), map.back());
  ir::Graph other = ir::make_region(std::vector<DType>{DType::boolean});
  other.set_output("mod", other.add(ir::Op::neg, {ir::kRegionScore}));
  EXPECT_NE(twice.add(ir::Op::flex_attention, ins, flex.attrs, std::make_shared<const ir::Graph>(std::move(other))), map.back());
}

TEST(FuseAttention, ABackwardGraphWithManyRegionsRoundTrips) {
  // The forward, its lse and three gradients each carry the modifier.
  auto q = input<"q">(dim<"N">, dim<8>);
  ir::Graph forward = lower(named<"out">(scaled_dot_product_attention(q, q, q, softcap_scores(4.0), causal)));
  const std::string text = ir::print(ir::build_backward(forward, {"", {"q"}, {"out"}}));
  std::size_t regions = 0;
  for (std::size_t at = text.find("input \"score\""); at != std::string::npos; at = text.find("input \"score\"", at + 1)) ++regions;
  EXPECT_EQ(regions, 5u) << text;
  EXPECT_EQ(ir::print(ir::parse_graph(text)), text);
}

TEST(FuseAttention, BadRegionsAreRejectedByName) {
  auto q = input<"q">(dim<"N">, dim<4>);
  ir::Graph g = lower(named<"q">(q));
  const ir::ValueId x = g.inputs()[0];
  ir::Graph wrong = ir::make_region({});
  wrong.set_output("mod", wrong.add(ir::Op::greater, {ir::kRegionScore, ir::kRegionQIdx}));  // bool, not f32
  try {
    g.add(ir::Op::flex_attention, {x, x, x}, {}, std::make_shared<const ir::Graph>(std::move(wrong)));
    ADD_FAILURE() << "a boolean modifier was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("flex_attention: its modifier's result is not f32"), std::string::npos) << e.what();
  }
  EXPECT_THROW(g.add(ir::Op::flex_attention, {x, x, x}), Error);  // no region
  ir::Graph plain = ir::make_region({});
  plain.set_output("mod", ir::kRegionScore);
  EXPECT_THROW(g.add(ir::Op::attention, {x, x, x}, {}, std::make_shared<const ir::Graph>(plain)), Error);  // not a flex op
  // A region reading a tensor the node does not pass.
  EXPECT_THROW(g.add(ir::Op::flex_attention, {x, x, x, x}, {}, std::make_shared<const ir::Graph>(plain)), Error);
  EXPECT_THROW(ir::parse_graph("graph {\n  %0 = input \"q\" : f32[3,4]\n  %1 = flex_attention(%0, %0, %0) {scale=1, causal=false, align=top_left} : "
                               "f32[3,4]\n  return o=%1\n}\n"),
               Error);
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
