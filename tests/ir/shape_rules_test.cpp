// The registry's shape rules: evaluated at compile time and at run time, with readable errors.
#include <gtest/gtest.h>

#include "ir/error.hpp"
#include "ir/graph.hpp"

namespace qkv::ir {
namespace {

constexpr std::array<Operand, 2> kMatmulOk{{{Shape{2, 5, 7}}, {Shape{7, 3}}}};
static_assert(infer_shape(Op::matmul, kMatmulOk, {}).shape == Shape{2, 5, 3});
constexpr std::array<Operand, 2> kMatmulBad{{{Shape{5, 64}}, {Shape{8, 3}}}};
static_assert(infer_shape(Op::matmul, kMatmulBad, {}).error == ShapeErr::inner_dims_differ);
constexpr std::array<Operand, 2> kBroadcast{{{Shape{3, 1, 5}}, {Shape{4, 1}}}};
static_assert(infer_shape(Op::add, kBroadcast, {}).shape == Shape{3, 4, 5});
constexpr Dim kN = symbol_id("N");
constexpr std::array<Operand, 2> kSymbolic{{{Shape{kN, 64}}, {Shape{kN, 64}}}};
static_assert(infer_shape(Op::matmul, kSymbolic,
                          [] {
                            Attrs a;
                            a.transpose_b = true;
                            return a;
                          }())
                  .shape == Shape{kN, kN});

TEST(ShapeRules, MatmulInnerDimsMessage) {
  Graph g;
  auto a = g.add_input("a", DType::f32, {5, 64});
  auto b = g.add_input("b", DType::f32, {8, 3});
  try {
    g.add(Op::matmul, {a, b});
    FAIL() << "no error";
  } catch (const ShapeError& e) {
    EXPECT_STREQ(e.what(), "matmul: inner dimensions differ (64 vs 8); operands f32[5,64], f32[8,3]");
  }
}

TEST(ShapeRules, BroadcastMismatch) {
  Graph g;
  auto a = g.add_input("a", DType::f32, {3, 4});
  auto b = g.add_input("b", DType::f32, {5});
  EXPECT_THROW(g.add(Op::add, {a, b}), ShapeError);
}

TEST(ShapeRules, WhereNeedsBoolCondition) {
  Graph g;
  auto a = g.add_input("a", DType::f32, {3});
  EXPECT_THROW(g.add(Op::where, {a, a, a}), ShapeError);
}

TEST(ShapeRules, ReduceAxisNormalisedAndChecked) {
  Graph g;
  auto a = g.add_input("a", DType::f32, {3, 4});
  Attrs at;
  at.axis = -1;
  auto r = g.add(Op::reduce_sum, {a}, at);
  EXPECT_EQ(g.node(r).attrs.axis, 1);
  EXPECT_EQ(g.node(r).shape, (Shape{3, 1}));
  at.axis = 2;
  EXPECT_THROW(g.add(Op::reduce_sum, {a}, at), ShapeError);
}

TEST(ShapeRules, PermuteRejectsNonPermutation) {
  Graph g;
  auto a = g.add_input("a", DType::f32, {3, 4});
  Attrs at;
  at.perm = {0, 0};
  EXPECT_THROW(g.add(Op::permute, {a}, at), ShapeError);
}

TEST(ShapeRules, ReshapeCountsElements) {
  Graph g;
  auto a = g.add_input("a", DType::f32, {3, 4});
  Attrs at;
  at.shape = {5, 2};
  EXPECT_THROW(g.add(Op::reshape, {a}, at), ShapeError);
}

TEST(ShapeRules, CausalMaskShape) {
  Graph g;
  auto a = g.add_input("a", DType::f32, {2, 3, 6});
  auto m = g.add(Op::causal_mask, {a});
  EXPECT_EQ(g.node(m).shape, (Shape{3, 6}));
  EXPECT_EQ(g.node(m).dtype, DType::boolean);
}

TEST(Graph, SharesEqualNodes) {
  Graph g;
  auto a = g.add_input("a", DType::f32, {3});
  auto x = g.add(Op::exp, {a});
  auto y = g.add(Op::exp, {a});
  EXPECT_EQ(x, y);
  EXPECT_EQ(g.add_input("a", DType::f32, {3}), a);
  EXPECT_THROW(g.add_input("a", DType::f32, {4}), ShapeError);
  EXPECT_THROW(g.add(Op::exp, {a, a}), IrError);
}

TEST(Graph, OutputNamesAreUnique) {
  Graph g;
  auto a = g.add_input("a", DType::f32, {3});
  g.set_output("y", a);
  EXPECT_THROW(g.set_output("y", a), IrError);
  EXPECT_THROW(g.set_output("z", 7), IrError);
}

}  // namespace
}  // namespace qkv::ir
