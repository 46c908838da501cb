// Modifiers written as expressions (score_mod, mask_mod and their indices) and the interval
// arithmetic over regions that block sparsity reads.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string_view>
#include <type_traits>

#include "backends/scalar_ops.hpp"
#include "dsl/dsl.hpp"
#include "ir/passes/passes.hpp"
#include "ir/printer.hpp"
#include "ir/region.hpp"
#include "ir/verifier.hpp"

namespace qkv {
namespace {

/// The region of the one flex_attention node `g` fuses to, as an expression.
std::string fused_modifier(const ir::Graph& g) {
  ir::Graph f = ir::eliminate_dead_code(ir::fuse_attention(g));
  ir::verify(f);
  for (const auto& n : f.nodes()) {
    EXPECT_NE(n.op, ir::Op::softmax) << ir::print(f);
    if (n.op == ir::Op::flex_attention) return ir::region_expression(*n.region);
  }
  ADD_FAILURE() << "no flex_attention in\n" << ir::print(f);
  return {};
}

/// The region itself.
ir::Graph fused_region(const ir::Graph& g) {
  ir::Graph f = ir::eliminate_dead_code(ir::fuse_attention(g));
  for (const auto& n : f.nodes())
    if (n.op == ir::Op::flex_attention) return *n.region;
  ADD_FAILURE() << "no flex_attention in\n" << ir::print(f);
  return ir::make_region({});
}

const auto q = input<"q">(dim<"B">, dim<4>, dim<"N">, dim<16>);
const auto k = input<"k">(dim<"B">, dim<4>, dim<"M">, dim<16>);
const auto slope = input<"slope">(dim<4>);
const auto q_doc = input<"q_doc", DType::i32>(dim<"B">, dim<"N">);
const auto kv_doc = input<"kv_doc", DType::i32>(dim<"B">, dim<"M">);

const auto alibi_softcap =
    score_mod([](auto score, auto, auto h, auto q_idx, auto kv_idx) { return softcap(score, 30) + slope[h] * (kv_idx - q_idx); });
const auto same_document = mask_mod([](auto b, auto, auto q_idx, auto kv_idx) { return at(q_doc, b, q_idx) == at(kv_doc, b, kv_idx); });
const auto causal_as_mask = mask_mod([](auto, auto, auto q_idx, auto kv_idx) { return q_idx >= kv_idx; });

/// FlexAttention's examples written with score_mod and mask_mod fuse into regions over the
/// query and key indices and the tensors they subscript, as the library's own options do.
TEST(ScoreMod, ModifiersWrittenAsExpressionsFuseAsRegions) {
  EXPECT_EQ(fused_modifier(lower(scaled_dot_product_attention(q, k, k, alibi_softcap))), "tanh(score / 30) * 30 + t0 * (kv_idx - q_idx)");
  EXPECT_EQ(fused_modifier(lower(scaled_dot_product_attention(q, k, k, same_document))), "where(t0 == t1, score, -inf)");
  // The same region as the library's document_mask.
  auto docs = input<"docs", DType::i32>(dim<"B">, dim<"N">);
  EXPECT_EQ(fused_modifier(lower(scaled_dot_product_attention(
                q, q, q, mask_mod([=](auto b, auto, auto q_idx, auto kv_idx) { return at(docs, b, q_idx) == at(docs, b, kv_idx); })))),
            fused_modifier(lower(scaled_dot_product_attention(q, q, q, document_mask(docs, docs)))));
  // Comparisons and logic as operators; a >= b is a > b or a == b (NaN is neither).
  EXPECT_EQ(fused_modifier(lower(scaled_dot_product_attention(q, k, k, causal_as_mask))),
            "where(max(cast(q_idx > kv_idx), cast(q_idx == kv_idx)) > 0.5, score, -inf)");
  // A score_mod and a mask_mod together: the score first, the mask outermost, in either order.
  const std::string both = "where(t0 == t1, tanh(score / 30) * 30 + t2 * (kv_idx - q_idx), -inf)";
  EXPECT_EQ(fused_modifier(lower(scaled_dot_product_attention(q, k, k, same_document, alibi_softcap))), both);
  EXPECT_EQ(fused_modifier(lower(scaled_dot_product_attention(q, k, k, alibi_softcap, same_document))), both);
  // b and h index the batch and head axes: tensors of their size, read per (batch, head).
  EXPECT_EQ(
      fused_modifier(lower(scaled_dot_product_attention(q, k, k, score_mod([](auto s, auto b, auto h, auto, auto) { return s + h * 0.5 + b; })))),
      "score + t0 + t1");
}

/// Subscripts lay a tensor out along the scores' axes (nothing is gathered); i32 ids are read as
/// f32. Scores [B, N, M] have a batch index and no head index.
TEST(ScoreMod, IndicesAndSubscriptsFollowTheScoresAxes) {
  auto check = [](auto b, auto h, auto q_idx, auto kv_idx) {
    using H = decltype(h);
    static_assert(decltype(slope[h])::shape == ir::Shape{4, 1, 1});
    static_assert(decltype(at(q_doc, b, q_idx))::shape == ir::Shape{ir::symbol_id("B"), 1, ir::symbol_id("N"), 1});
    static_assert(decltype(at(q_doc, b, q_idx))::dtype == DType::f32);
    static_assert(decltype(at(kv_doc, b, kv_idx))::shape == ir::Shape{ir::symbol_id("B"), 1, 1, ir::symbol_id("M")});
    static_assert(decltype(kv_idx - q_idx)::shape.rank == 4 && decltype(kv_idx - q_idx)::shape.back(0) == ir::symbol_id("M"));
    static_assert(!std::is_same_v<H, NoScoreIndex>);
    return q_idx == q_idx;
  };
  (void)lower(scaled_dot_product_attention(q, k, k, mask_mod(check)));
  auto x = input<"x">(dim<"B">, dim<"N">, dim<16>);
  auto ids = input<"ids", DType::i32>(dim<"B">, dim<"N">);
  const ir::Graph g =
      lower(scaled_dot_product_attention(x, x, x, mask_mod([=](auto b, auto h, auto q_idx, auto kv_idx) {
                                           static_assert(std::is_same_v<decltype(h), NoScoreIndex>, "scores [B, N, M] have no head axis");
                                           static_assert(decltype(at(ids, b, q_idx))::shape == ir::Shape{ir::symbol_id("B"), ir::symbol_id("N"), 1});
                                           return at(ids, b, q_idx) == at(ids, b, kv_idx);
                                         })));
  EXPECT_EQ(fused_modifier(g), "where(t0 == t1, score, -inf)");
}

// ---- interval arithmetic ----

ir::ValueRange between(double lo, double hi) { return ir::ValueRange::between(lo, hi); }

/// Region inputs for a tile: any score, queries [i0, i1], keys [j0, j1], then the tensors'.
std::vector<ir::ValueRange> tile(double i0, double i1, double j0, double j1, std::vector<ir::ValueRange> tensors = {}) {
  std::vector<ir::ValueRange> in = {ir::ValueRange::unknown(), between(i0, i1), between(j0, j1)};
  in.insert(in.end(), tensors.begin(), tensors.end());
  return in;
}

TEST(BoundRegion, MasksFromPositionsAndIdsAreProvedPerTile) {
  const ir::Graph doc = fused_region(lower(scaled_dot_product_attention(q, k, k, same_document)));
  EXPECT_TRUE(ir::region_masks(doc));
  // Queries all in document 0, keys all in 1: every score masked.
  EXPECT_TRUE(ir::bound_region(doc, tile(0, 127, 0, 255, {between(0, 0), between(1, 1)})).is(-HUGE_VAL));
  // Overlapping documents: some kept.
  EXPECT_FALSE(ir::bound_region(doc, tile(0, 127, 0, 255, {between(0, 1), between(1, 2)})).is(-HUGE_VAL));
  // NaN ids, or ids not read (unknown): nothing proved.
  EXPECT_FALSE(ir::bound_region(doc, tile(0, 127, 0, 255, {ir::ValueRange::unknown(), between(1, 1)})).is(-HUGE_VAL));

  const ir::Graph causal_mod = fused_region(lower(scaled_dot_product_attention(q, k, k, causal_as_mask)));
  EXPECT_TRUE(ir::bound_region(causal_mod, tile(0, 127, 256, 511)).is(-HUGE_VAL));   // above the diagonal
  EXPECT_FALSE(ir::bound_region(causal_mod, tile(0, 127, 127, 383)).is(-HUGE_VAL));  // touches it
  EXPECT_FALSE(ir::bound_region(causal_mod, tile(256, 383, 0, 255)).is(-HUGE_VAL));  // below: kept

  // A mask that depends on the score itself is never proved: the scores are unknown.
  auto x = input<"x">(dim<"N">, dim<8>);
  const ir::Graph by_score = fused_region(
      lower(scaled_dot_product_attention(x, x, x, score_mod([](auto s, auto, auto, auto, auto) { return where(s > 0.0, s, kNegInf); }))));
  EXPECT_TRUE(ir::region_masks(by_score));
  EXPECT_FALSE(ir::bound_region(by_score, tile(0, 0, 0, 0)).is(-HUGE_VAL));
  // Soft-capping alone never masks: not worth bounding.
  EXPECT_FALSE(ir::region_masks(fused_region(lower(scaled_dot_product_attention(q, k, k, softcap_scores(30.0))))));
}

TEST(BoundRegion, OpsOverRangesWithInfinitiesAndNaN) {
  auto one_op = [](ir::Op op, int arity) {
    ir::Graph r = ir::make_region(std::vector<DType>{DType::f32, DType::f32});
    std::vector<ir::ValueId> ins = {ir::kRegionFixedInputs, ir::kRegionFixedInputs + 1};
    ins.resize(static_cast<std::size_t>(arity));
    r.set_output("mod", r.add(op, ins));
    return r;
  };
  auto bound = [&](ir::Op op, ir::ValueRange a, ir::ValueRange b = ir::ValueRange::unknown()) {
    const int arity = ir::op_info(op).arity;
    return ir::bound_region(one_op(op, arity), tile(0, 0, 0, 0, {a, b}));
  };
  EXPECT_EQ(bound(ir::Op::add, between(1, 2), between(-HUGE_VAL, 0)), between(-HUGE_VAL, 2));
  EXPECT_TRUE(bound(ir::Op::add, between(-HUGE_VAL, 0), between(0, HUGE_VAL)).nan);  // -inf + inf
  EXPECT_EQ(bound(ir::Op::sub, between(1, 2), between(1, 2)), between(-1, 1));
  EXPECT_EQ(bound(ir::Op::mul, between(-2, 3), between(4, 5)), between(-10, 15));
  EXPECT_TRUE(bound(ir::Op::mul, between(0, 1), between(1, HUGE_VAL)).nan);  // 0 * inf
  EXPECT_EQ(bound(ir::Op::div, between(1, 2), between(4, 8)), between(0.125, 0.5));
  EXPECT_EQ(bound(ir::Op::div, between(1, 2), between(-1, 1)), ir::ValueRange::unknown());  // through 0
  EXPECT_TRUE(bound(ir::Op::log, between(-1, 1)).nan);
  EXPECT_EQ(bound(ir::Op::exp, between(-HUGE_VAL, 0)), between(0, 1));
  EXPECT_EQ(bound(ir::Op::greater, between(3, 4), between(1, 2)), between(1, 1));
  EXPECT_EQ(bound(ir::Op::greater, between(1, 2), between(3, 4)), between(0, 0));
  EXPECT_EQ(bound(ir::Op::greater, ir::ValueRange{3, 4, true}, between(1, 2)), between(0, 1));  // NaN > x is false
  EXPECT_EQ(bound(ir::Op::equal, between(2, 2), between(2, 2)), between(1, 1));
  EXPECT_EQ(bound(ir::Op::equal, ir::ValueRange{5, 6, true}, between(1, 2)), between(0, 0));  // NaN == x is false
}

/// Soundness: every value the region computes from inputs inside their ranges lies inside the
/// bound, for the library's modifiers on random tiles and inputs.
/// r's output `output` at one point of its inputs, in double.
double evaluate(const ir::Graph& r, const std::vector<double>& in, std::string_view output = "mod") {
  std::vector<double> v;
  for (const ir::Node& n : r.nodes()) {
    auto at_in = [&](std::size_t i) { return v[static_cast<std::size_t>(n.inputs[i])]; };
    switch (ir::op_info(n.op).category) {
      case ir::OpCategory::source: v.push_back(n.op == ir::Op::input ? in[v.size()] : n.attrs.value); break;
      case ir::OpCategory::unary: v.push_back(backend::apply_unary(n.op, at_in(0))); break;
      case ir::OpCategory::select: v.push_back(at_in(0) != 0 ? at_in(1) : at_in(2)); break;
      case ir::OpCategory::binary:
      case ir::OpCategory::compare: v.push_back(backend::apply_binary(n.op, at_in(0), at_in(1))); break;
      case ir::OpCategory::reduce:
      case ir::OpCategory::contract:
      case ir::OpCategory::layout:
      case ir::OpCategory::mask:
      case ir::OpCategory::composite: ADD_FAILURE() << "a modifier region holds only elementwise ops"; return 0.0;
    }
  }
  return v[static_cast<std::size_t>(r.output(output))];
}

/// Masking regions from the library's options and FlexAttention's examples.
std::vector<ir::Graph> masking_regions() {
  auto x = input<"x">(dim<"B">, dim<4>, dim<"N">, dim<16>);
  return {
      fused_region(lower(scaled_dot_product_attention(q, k, k, same_document, alibi_softcap))),
      fused_region(lower(scaled_dot_product_attention(q, k, k, causal_as_mask, softcap_scores(5.0)))),
      fused_region(lower(scaled_dot_product_attention(
          x, x, x, mask_mod([](auto, auto, auto q_idx, auto kv_idx) { return (q_idx - kv_idx < 64.0 && kv_idx <= q_idx) || kv_idx < 4.0; })))),
  };
}

/// Random integer ranges within [-50, 50] for `inputs` region inputs (positions, ids, scores).
std::vector<ir::ValueRange> random_ranges(std::mt19937& rng, std::size_t inputs) {
  std::uniform_real_distribution<double> u(-50, 50);
  std::vector<ir::ValueRange> ranges(inputs);
  for (std::size_t i = 0; i < inputs; ++i) {
    const double a = std::round(u(rng)), b = std::round(u(rng));
    ranges[i] = between(std::min(a, b), std::max(a, b));
  }
  return ranges;
}

/// A random integer point inside `ranges`.
std::vector<double> random_point(std::mt19937& rng, const std::vector<ir::ValueRange>& ranges) {
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<double> in(ranges.size());
  for (std::size_t i = 0; i < ranges.size(); ++i) in[i] = std::round(ranges[i].lo + (ranges[i].hi - ranges[i].lo) * u(rng));
  return in;
}

TEST(BoundRegion, EveryComputedValueLiesInTheBound) {
  const std::vector<ir::Graph> regions = masking_regions();
  std::mt19937 rng(7);
  for (const ir::Graph& r : regions) {
    const std::size_t inputs = static_cast<std::size_t>(ir::kRegionFixedInputs) + ir::region_tensors(r);
    for (int trial = 0; trial < 200; ++trial) {
      const std::vector<ir::ValueRange> ranges = random_ranges(rng, inputs);
      const ir::ValueRange bound = ir::bound_region(r, ranges);
      for (int sample = 0; sample < 20; ++sample) {
        const std::vector<double> in = random_point(rng, ranges);
        const double value = evaluate(r, in);
        if (std::isnan(value)) EXPECT_TRUE(bound.nan) << ir::region_expression(r);
        else
          EXPECT_TRUE(bound.lo <= value && value <= bound.hi)
              << ir::region_expression(r) << ": " << value << " outside [" << bound.lo << ", " << bound.hi << "]";
      }
    }
  }
}

/// A region without its masks (what a tile they keep whole runs, FlexAttention's full blocks):
/// no where on a masking condition is left, nor what only the conditions read, and wherever
/// interval arithmetic proves the conditions keep over a tile, it equals the region at every
/// point of the tile, the derivative's too.
TEST(UnmaskedRegion, EqualsTheRegionWhereTheMasksProvablyKeep) {
  const ir::Graph doc = fused_region(lower(scaled_dot_product_attention(q, k, k, same_document)));
  ASSERT_EQ(ir::masking_conditions(doc).size(), 1u);
  EXPECT_TRUE(ir::masking_conditions(doc)[0].second);  // keeps where the ids are equal
  const ir::Graph plain = ir::unmasked_region(doc);
  EXPECT_EQ(ir::region_expression(plain), "score");
  EXPECT_EQ(ir::region_tensors(plain), ir::region_tensors(doc));  // inputs in their places
  for (const ir::Node& n : plain.nodes()) EXPECT_NE(n.op, ir::Op::equal);
  // A region that does not mask has nothing to drop.
  EXPECT_TRUE(ir::masking_conditions(fused_region(lower(scaled_dot_product_attention(q, k, k, alibi_softcap)))).empty());

  const std::vector<ir::Graph> regions = masking_regions();
  std::mt19937 rng(11);
  int proved = 0;
  for (const ir::Graph& region : regions) {
    for (const ir::Graph& r : {region, ir::differentiate_region(region, ir::kRegionScore, true)}) {
      const auto conds = ir::masking_conditions(r);
      ASSERT_FALSE(conds.empty()) << ir::region_expression(r);
      const ir::Graph unmasked = ir::unmasked_region(r);
      EXPECT_LT(unmasked.size(), r.size()) << ir::region_expression(r);
      EXPECT_FALSE(ir::region_masks(unmasked)) << ir::region_expression(unmasked);
      const std::size_t inputs = static_cast<std::size_t>(ir::kRegionFixedInputs) + ir::region_tensors(r);
      for (int trial = 0; trial < 300; ++trial) {
        const std::vector<ir::ValueRange> ranges = random_ranges(rng, inputs);
        if (!ir::conditions_keep(ir::bound_region_nodes(r, ranges), conds)) continue;
        ++proved;
        for (int sample = 0; sample < 20; ++sample) {
          const std::vector<double> in = random_point(rng, ranges);
          for (const auto& [name, v] : r.outputs())
            EXPECT_EQ(evaluate(unmasked, in, name), evaluate(r, in, name)) << ir::region_expression(r) << " output " << name;
        }
      }
    }
  }
  EXPECT_GT(proved, 100);  // the tiles kept whole are common, not a corner case
}

}  // namespace
}  // namespace qkv
