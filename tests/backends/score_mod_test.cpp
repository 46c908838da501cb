// The cpu's score modifier: its diagonal conditions (varlen's causality within each sequence, a
// window's far edge), at which the fused kernels cut each row instead of evaluating them per
// score. End to end, tests/backends/varlen_test.cpp runs them against the reference.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/score_mod.hpp"
#include "ir/region.hpp"

namespace qkv::backend::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity(), kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr std::int64_t kN = 12, kM = 10;

/// where(t0 > t1, where(t2 > t3, score, -inf), -inf), as varlen with a sliding window lowers:
/// t0 and t3 along the queries [N, 1], t1 and t2 along the keys [1, M].
ir::Graph window_region() {
  ir::Graph r = ir::make_region(std::vector<DType>(4, DType::f32));
  const ir::ValueId t0 = ir::kRegionFixedInputs, t1 = t0 + 1, t2 = t0 + 2, t3 = t0 + 3;
  const ir::ValueId masked = r.constant(-HUGE_VAL, {});
  const ir::ValueId inner = r.add(ir::Op::where, {r.add(ir::Op::greater, {t2, t3}), ir::kRegionScore, masked});
  r.set_output("mod", r.add(ir::Op::where, {r.add(ir::Op::greater, {t0, t1}), inner, masked}));
  return r;
}

struct Tensors {
  std::vector<float> q_pos, k_pos, k_far, q_near;  // t0 .. t3
  std::vector<ConstView> views() const {
    return {{q_pos.data(), {kN, 1}}, {k_pos.data(), {1, kM}}, {k_far.data(), {1, kM}}, {q_near.data(), {kN, 1}}};
  }
};

/// Positions with ties among the keys: query i keeps key j when k_pos[j] < q_pos[i] and
/// k_far[j] > q_near[i].
Tensors positions() {
  Tensors t;
  for (std::int64_t i = 0; i < kN; ++i) {
    t.q_pos.push_back(static_cast<float>(i / 2));  // ties with the keys' positions: strict, so not kept
    t.q_near.push_back(static_cast<float>(i / 2) - 3.0f);
  }
  for (std::int64_t j = 0; j < kM; ++j) {
    t.k_pos.push_back(static_cast<float>(j / 2));
    t.k_far.push_back(static_cast<float>(j / 2));
  }
  return t;
}

/// Whether query i keeps key j, from the conditions' meaning.
bool keeps(const Tensors& t, std::int64_t i, std::int64_t j) {
  return t.q_pos[static_cast<std::size_t>(i)] > t.k_pos[static_cast<std::size_t>(j)] &&
         t.k_far[static_cast<std::size_t>(j)] > t.q_near[static_cast<std::size_t>(i)];
}

/// diagonal_spans over the tile against `keeps` score by score.
void expect_spans_keep(const ScoreModifier& mod, const Tensors& t, std::int64_t i0, std::int64_t rows, std::int64_t j0, std::int64_t cols) {
  std::vector<std::int64_t> spans(static_cast<std::size_t>(2 * rows), -1);
  ASSERT_TRUE(mod.diagonal_spans(0, i0, rows, j0, cols, spans.data()));
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t lo = spans[static_cast<std::size_t>(2 * r)], hi = spans[static_cast<std::size_t>(2 * r + 1)];
    ASSERT_LE(0, lo);
    ASSERT_LE(lo, hi);
    ASSERT_LE(hi, cols);
    for (std::int64_t j = 0; j < cols; ++j) EXPECT_EQ(lo <= j && j < hi, keeps(t, i0 + r, j0 + j)) << "query " << i0 + r << " key " << j0 + j;
  }
}

TEST(ScoreModifierDiagonals, EachRowKeepsTheSpanItsConditionsKeep) {
  const Tensors t = positions();
  const ScoreModifier mod(window_region(), false, t.views(), {}, kN, kM);
  EXPECT_EQ(mod.diagonal_conditions(), 3u);  // both: a prefix (t0 > t1) and a suffix (t2 > t3)
  expect_spans_keep(mod, t, 0, kN, 0, kM);
  expect_spans_keep(mod, t, 3, 5, 2, 7);  // a tile inside
  expect_spans_keep(mod, t, 11, 1, 9, 1);
}

TEST(ScoreModifierDiagonals, ANaNQueryKeepsNothingAndUnorderedKeysAreNotCut) {
  Tensors t = positions();
  t.q_pos[4] = kNaN;
  t.q_near[6] = -kInf;
  const ScoreModifier mod(window_region(), false, t.views(), {}, kN, kM);
  expect_spans_keep(mod, t, 0, kN, 0, kM);
  std::vector<std::int64_t> spans(2 * kN);
  ASSERT_TRUE(mod.diagonal_spans(0, 4, 1, 0, kM, spans.data()));
  EXPECT_EQ(spans[0], spans[1]);   // greater with a NaN holds nowhere
  t.k_far[5] = t.k_far[4] - 1.0f;  // a key before the one before it: no span
  const ScoreModifier unordered(window_region(), false, t.views(), {}, kN, kM);
  EXPECT_FALSE(unordered.diagonal_spans(0, 0, kN, 0, kM, spans.data()));
  EXPECT_TRUE(unordered.diagonal_spans(0, 0, kN, 0, 5, spans.data()));  // a tile before it
  t.k_pos[7] = kNaN;
  const ScoreModifier with_nan(window_region(), false, t.views(), {}, kN, kM);
  EXPECT_FALSE(with_nan.diagonal_spans(0, 0, kN, 6, 3, spans.data()));
}

/// A region over the four tensors whose result is where(cond(r), inner(r), -inf), each built
/// by the caller.
template <class Cond, class Inner> ir::Graph masked_region(Cond cond, Inner inner) {
  ir::Graph r = ir::make_region(std::vector<DType>(4, DType::f32));
  const ir::ValueId masked = r.constant(-HUGE_VAL, {});
  r.set_output("mod", r.add(ir::Op::where, {cond(r), inner(r), masked}));
  return r;
}

TEST(ScoreModifierDiagonals, OnlyATensorAlongEachAxisWhoseMaskIsTheResult) {
  const Tensors t = positions();
  const ir::ValueId t0 = ir::kRegionFixedInputs, t1 = t0 + 1, t3 = t0 + 3;
  auto score = [](ir::Graph&) { return ir::kRegionScore; };
  auto diagonal = [=](ir::Graph& r) { return r.add(ir::Op::greater, {t0, t1}); };
  auto cut = [&](const ir::Graph& r) { return ScoreModifier(r, false, t.views(), {}, kN, kM).diagonal_conditions(); };
  EXPECT_EQ(cut(masked_region(diagonal, score)), 1u);
  // The indices themselves (the kernels' causal attribute and a mask_mod's causality are not
  // tensors), two tensors along the queries, and a comparison that is not `greater`.
  EXPECT_EQ(cut(masked_region([](ir::Graph& r) { return r.add(ir::Op::greater, {ir::kRegionQIdx, ir::kRegionKvIdx}); }, score)), 0u);
  EXPECT_EQ(cut(masked_region([=](ir::Graph& r) { return r.add(ir::Op::greater, {t0, t3}); }, score)), 0u);
  EXPECT_EQ(cut(masked_region([=](ir::Graph& r) { return r.add(ir::Op::equal, {t0, t1}); }, score)), 0u);
  // A where on the diagonal whose other branch is not -inf lies between it and the result: where
  // it fails the result is 0, not -inf.
  ir::Graph zero = ir::make_region(std::vector<DType>(4, DType::f32));
  const ir::ValueId d = zero.add(ir::Op::greater, {t0, t1});
  const ir::ValueId inner = zero.add(ir::Op::where, {d, ir::kRegionScore, zero.constant(-HUGE_VAL, {})});
  zero.set_output("mod", zero.add(ir::Op::where, {d, inner, zero.constant(0.0, {})}));
  EXPECT_EQ(cut(zero), 0u);
  // A mask with a bias added after it (-inf + t3) is not the result either.
  ir::Graph biased = ir::make_region(std::vector<DType>(4, DType::f32));
  const ir::ValueId masked = biased.add(ir::Op::where, {biased.add(ir::Op::greater, {t0, t1}), ir::kRegionScore, biased.constant(-HUGE_VAL, {})});
  biased.set_output("mod", biased.add(ir::Op::add, {masked, t3}));
  EXPECT_EQ(cut(biased), 0u);
  std::vector<std::int64_t> spans(2 * kN);
  EXPECT_FALSE(ScoreModifier(biased, false, t.views(), {}, kN, kM).diagonal_spans(0, 0, kN, 0, kM, spans.data()));
  // With the derivative asked for too: still cut (the kernels write its masked scores'
  // derivative as 0).
  EXPECT_EQ(ScoreModifier(window_region(), true, t.views(), {}, kN, kM).diagonal_conditions(), 3u);
}

/// apply_row with the diagonals kept, then cut at the spans, is the region evaluated score by
/// score (what the fused kernels do with a tile a diagonal crosses).
TEST(ScoreModifierDiagonals, CutRowsEqualTheRegionEvaluated) {
  const Tensors t = positions();
  const ScoreModifier mod(window_region(), true, t.views(), {}, kN, kM);
  std::vector<std::int64_t> spans(2 * kN);
  ASSERT_TRUE(mod.diagonal_spans(0, 0, kN, 0, kM, spans.data()));
  for (std::int64_t i = 0; i < kN; ++i) {
    std::vector<float> want(kM), cut(kM), dwant(kM), dcut(kM);
    for (std::int64_t j = 0; j < kM; ++j) want[static_cast<std::size_t>(j)] = cut[static_cast<std::size_t>(j)] = 0.25f * static_cast<float>(j) - 1.0f;
    mod.apply_row(0, i, 0, kM, want.data(), dwant.data());
    mod.apply_row(0, i, 0, kM, cut.data(), dcut.data(), mod.diagonal_conditions());
    const std::int64_t lo = spans[static_cast<std::size_t>(2 * i)], hi = spans[static_cast<std::size_t>(2 * i + 1)];
    for (std::int64_t j = 0; j < kM; ++j) {
      const bool kept = lo <= j && j < hi;
      EXPECT_EQ(kept ? cut[static_cast<std::size_t>(j)] : -kInf, want[static_cast<std::size_t>(j)]) << i << " " << j;
      EXPECT_EQ(kept ? dcut[static_cast<std::size_t>(j)] : 0.0f, dwant[static_cast<std::size_t>(j)]) << i << " " << j;
    }
  }
}

}  // namespace
}  // namespace qkv::backend::cpu
