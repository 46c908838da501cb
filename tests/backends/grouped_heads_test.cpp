// Grouped-query attention as rows (ir::group_query_heads): query heads that share a key/value
// head become rows of one batch entry where no score depends on the query's row, with the
// reference's numbers on every backend; left as they are where one does.
#include <gtest/gtest.h>

#include <cmath>

#include "dsl/dsl.hpp"
#include "ir/passes/passes.hpp"
#include "ir/printer.hpp"
#include "tests/support/backend_fixture.hpp"

namespace qkv {
namespace {

using namespace dsl;

/// The q and k shapes of the lowered graph's one forward attention node (empty: none).
std::pair<ir::Shape, ir::Shape> attention_shapes(const ir::Graph& g) {
  const ir::Graph lowered = ir::lower_for_backend(g, [](const ir::Node&) { return true; });
  for (const ir::Node& n : lowered.nodes())
    if (n.op == ir::Op::attention || n.op == ir::Op::flex_attention) return {lowered.node(n.inputs[0]).shape, lowered.node(n.inputs[1]).shape};
  return {};
}

/// Attention of q [2, 4, 3, n, 16] against k, v [2, 4, 1, 50, 16] (or [4, 1, 50, 16]: shared by
/// the batch too): three query heads per key/value head.
ir::Graph grouped(std::int64_t n, ir::Attrs a, bool batched_kv = true) {
  ir::Graph g;
  const ir::Shape ks = batched_kv ? ir::Shape{2, 4, 1, 50, 16} : ir::Shape{4, 1, 50, 16};
  const ir::Shape vs = batched_kv ? ir::Shape{2, 4, 1, 50, 8} : ir::Shape{4, 1, 50, 8};
  const ir::ValueId q = g.add_input("q", DType::f32, {2, 4, 3, n, 16}), k = g.add_input("k", DType::f32, ks), v = g.add_input("v", DType::f32, vs);
  a.scale = 0.25;
  g.set_output("out", g.add(ir::Op::attention, {q, k, v}, a));
  return g;
}

TEST(GroupedHeads, DecodingReadsEachKeyValueHeadOnceForItsQueryHeads) {
  ir::Attrs plain, decode;
  decode.causal = true;
  decode.align = ir::CausalAlign::bottom_right;
  const std::vector<std::pair<std::string, ir::Graph>> graphs = {
      {"one query, causal", grouped(1, decode)}, {"five queries", grouped(5, plain)}, {"k and v shared by the batch", grouped(2, plain, false)}};
  for (const auto& [name, g] : graphs) {
    SCOPED_TRACE(name);
    const auto [qs, ks] = attention_shapes(g);
    EXPECT_EQ(qs, (ir::Shape{2, 4, g.node(0).shape[3] * 3, 16}));
    EXPECT_EQ(ks.rank, g.node(1).shape.rank - 1) << "k without the group axis";
    for (const char* b : {"cpu", "vulkan"}) {
      SCOPED_TRACE(b);
      testing::expect_equivalent(g, backend::random_inputs(g, {}, 4), b);
    }
  }
  // In bf16: the heads reshaped where they lie, still read in 16 bits.
  const ir::Graph half = ir::to_dtype(grouped(1, decode), DType::bf16);
  EXPECT_EQ(attention_shapes(half).first.rank, 4);
  for (const char* b : {"cpu", "vulkan"}) testing::expect_equivalent(half, backend::random_inputs(half, {}, 6), b);
  // gpt-oss's decode step: eight query heads over two key/value heads, a sink per query head.
  auto q = input<"q">(dim<"B">, dim<1>, dim<64>);
  auto k = input<"k">(dim<"B">, dim<"M">, dim<16>);
  auto s = input<"sinks">(dim<8>);
  const ir::Graph g = lower(named<"out">(grouped_query_attention<8, 2>(q, k, k, causal_bottom_right, sinks(s))));
  EXPECT_EQ(attention_shapes(g).first.back(1), 4) << "four query heads as rows";
  for (const char* b : {"cpu", "vulkan"}) {
    SCOPED_TRACE(b);
    testing::expect_equivalent(g, backend::random_inputs(g, {{"B", 3}, {"M", 700}}, 5), b);
  }
}

// Where a score depends on the query's row, or the graph trains, the heads stay heads.
TEST(GroupedHeads, StayHeadsWhereAScoreDependsOnTheRow) {
  ir::Attrs causal, window, top_left;
  causal.causal = window.causal = top_left.causal = true;
  causal.align = window.align = ir::CausalAlign::bottom_right;
  window.window = 8;
  const std::vector<std::pair<std::string, ir::Graph>> graphs = {{"two queries, causal", grouped(2, causal)},
                                                                 {"one query, a sliding window", grouped(1, window)},
                                                                 {"one query, causal top-left (key 0 only)", grouped(1, top_left)}};
  for (const auto& [name, g] : graphs) EXPECT_EQ(attention_shapes(g).first.rank, 5) << name;
  auto q = input<"q">(dim<2>, dim<4>, dim<3>, dim<1>, dim<16>);
  auto k = input<"k">(dim<2>, dim<4>, dim<1>, dim<50>, dim<16>);
  auto seed = input<"seed", DType::i32>();
  const ir::Graph alibi = lower(named<"out">(scaled_dot_product_attention(
      q, k, k, score_mod([](auto score, auto, auto, auto q_idx, auto kv_idx) { return score - 0.1 * (q_idx - kv_idx); }))));
  EXPECT_EQ(attention_shapes(alibi).first.rank, 5) << "a modifier reading q_idx";
  const ir::Graph dropped = lower(named<"out">(scaled_dot_product_attention(q, k, k, attn_dropout(0.1, seed))));
  EXPECT_EQ(attention_shapes(dropped).first.rank, 5) << "dropout";
  const ir::Graph plain = lower(named<"out">(scaled_dot_product_attention(q, k, k)));
  EXPECT_EQ(attention_shapes(plain).first.rank, 4);
  const ir::Graph trains = ir::build_backward(plain, {"", {"q", "k"}, {"out"}});
  EXPECT_EQ(attention_shapes(trains).first.rank, 5) << "a training graph";
}

}  // namespace
}  // namespace qkv
