// Errors that name the op, the operands and the bad attribute (slice, concat, cast, dropout and
// causal masks), and derived dims from concat: printed, parsed, bound, and where their gradients stop.
#include <gtest/gtest.h>

#include "backends/backend.hpp"
#include "ir/bind.hpp"
#include "ir/error.hpp"
#include "ir/graph.hpp"
#include "ir/passes/passes.hpp"
#include "ir/printer.hpp"

namespace qkv::ir {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ShapeError& e) {
    return e.what();
  }
  return "no error";
}

Attrs range(int axis, std::int64_t begin, std::int64_t end) {
  Attrs a;
  a.axis = axis;
  a.begin = begin;
  a.end = end;
  return a;
}

TEST(ShapeErrors, BadOperandsAndAttributesAreNamed) {
  Graph g;
  auto x = g.add_input("x", DType::f32, {3, 10});
  auto n = g.add_input("n", DType::f32, {g.symbol("N"), 4});
  auto ids = g.add_input("ids", DType::i32, {3});
  auto seed = g.add_input("seed", DType::i32, {});
  EXPECT_EQ(error_of([&] { g.add(Op::slice, {x}, range(1, 4, 12)); }),
            "slice: range or attribute out of bounds (4, 12 at axis 1); operands f32[3,10]");
  EXPECT_EQ(error_of([&] { g.add(Op::slice, {n}, range(0, 0, 2)); }),
            "slice: range or attribute out of bounds (0, 2 at axis 0); operands f32[N,4]");
  EXPECT_EQ(error_of([&] { g.add(Op::concat, {x, n}, range(0, 0, 0)); }),
            "concat: dims differ outside the joined axis (10 vs 4 at axis 1); operands f32[3,10], f32[N,4]");
  EXPECT_EQ(error_of([&] { g.add(Op::cast, {x}); }), "cast: cast takes an i32 or bool tensor to f32 (operand 0 is f32[3,10]); operands f32[3,10]");
  Attrs p;
  p.value = 1.0;
  EXPECT_EQ(error_of([&] { g.add(Op::dropout_mask, {x, seed}, p); }),
            "dropout_mask: the dropout probability p must lie in [0, 1); operands f32[3,10], i32[]");
  EXPECT_EQ(error_of([&] { g.add(Op::dropout_mask, {x, ids}); }), "dropout_mask: rank too large (1); operands f32[3,10], i32[3]");
  Attrs window;
  window.window = -1;
  EXPECT_NE(error_of([&] { g.add(Op::causal_mask, {x}, window); }).find("causal_mask: range or attribute out of bounds"), std::string::npos);
}

TEST(DerivedDims, ConcatOfNamedDimsMakesADerivedDimThatPrintsParsesAndBinds) {
  Graph g;
  const Dim p = g.symbol("P"), t = g.symbol("T");
  auto past = g.add_input("past", DType::f32, {2, p, 4});
  auto now = g.add_input("now", DType::f32, {2, t, 4});
  auto one = g.add_input("one", DType::f32, {2, 1, 4});
  Attrs axis1;
  axis1.axis = 1;
  auto both = g.add(Op::concat, {g.add(Op::concat, {past, now}, axis1), one}, axis1);
  g.set_output("out", both);
  EXPECT_EQ(g.type_string(both), "f32[2,P+T+1,4]");
  const std::string text = print(g);
  Graph back = parse_graph(text);
  EXPECT_EQ(print(back), text);
  std::map<std::string, Tensor, std::less<>> in{{"past", Tensor(DType::f32, {2, 3, 4})},
                                                  {"now", Tensor(DType::f32, {2, 2, 4})},
                                                  {"one", Tensor(DType::f32, {2, 1, 4})}};
  EXPECT_EQ(bind_shapes(back, in)[static_cast<std::size_t>(back.output("out"))], (Shape{2, 6, 4}));
  // A constant shaped by the derived dim binds from its parts.
  Graph c = back;
  c.set_output("zeros", c.constant(0.0, Shape{2, g.node(both).shape[1], 4}));
  auto out = backend::create("reference")->compile(c)->run(in);
  EXPECT_EQ(out.at("zeros").shape(), (std::vector<std::int64_t>{2, 6, 4}));
}

TEST(DerivedDims, ConcatAlongANamedDimHasNoGradientAndSaysWhy) {
  Graph g;
  auto past = g.add_input("past", DType::f32, {g.symbol("P"), 4});
  auto now = g.add_input("now", DType::f32, {1, 4});
  g.set_output("out", g.add(Op::concat, {past, now}));
  try {
    build_backward(g, {"", {"now"}, {"out"}});
    FAIL() << "no error";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("concat: no gradient along the named dim P (slices need static bounds)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace qkv::ir
