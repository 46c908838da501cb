// Errors that name the op, the operands and the bad attribute (slice, concat, cast, dropout and
// causal masks), and derived dims (sums from concat, products and quotients from heads): printed,
// parsed, bound, fixed to sizes, and where their gradients stop.
#include <gtest/gtest.h>

#include "backends/backend.hpp"
#include "ir/bind.hpp"
#include "ir/error.hpp"
#include "ir/graph.hpp"
#include "ir/passes/passes.hpp"
#include "ir/printer.hpp"
#include "ir/region.hpp"

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
  EXPECT_EQ(error_of([&] { g.add(Op::slice, {n}, range(0, -1, 2)); }),
            "slice: range or attribute out of bounds (-1, 2 at axis 0); operands f32[N,4]");
  EXPECT_EQ(error_of([&] {
              g.add(Op::concat, {x, n}, range(0, 0, 0));
            }),
            "concat: dims differ outside the joined axis (10 vs 4 at axis 1); operands f32[3,10], f32[N,4]");
  Attrs to_i32;
  to_i32.dtype = DType::i32;
  EXPECT_EQ(error_of([&] { g.add(Op::cast, {x}, to_i32); }),
            "cast: cast takes an f32, f16, bf16, i32 or bool tensor to f32, f16 or bf16 (operand 0 is f32[3,10]); operands f32[3,10]");
  Attrs p;
  p.dropout = 1.0;
  EXPECT_EQ(error_of([&] {
              g.add(Op::dropout_mask, {x, seed}, p);
            }),
            "dropout_mask: the dropout probability p must lie in [0, 1); operands f32[3,10], i32[]");
  EXPECT_EQ(error_of([&] { g.add(Op::dropout_mask, {x, ids}); }), "dropout_mask: rank too large (1); operands f32[3,10], i32[3]");
  Attrs window;
  window.window = -1;
  EXPECT_NE(error_of([&] { g.add(Op::causal_mask, {x}, window); }).find("causal_mask: range or attribute out of bounds"), std::string::npos);
}

// Sink logits must be one float per row: sink_softmax's and flex attention's, named by operand.
TEST(ShapeErrors, SinksThatAreNotOneFloatPerRowAreNamed) {
  Graph g;
  auto x = g.add_input("x", DType::f32, {2, 5, 7});
  auto wide = g.add_input("wide", DType::f32, {2, 5, 2});
  auto ids = g.add_input("ids", DType::i32, {2, 5, 1});
  auto k = g.add_input("k", DType::f32, {2, 7, 4});
  Graph identity = make_region({});
  identity.set_output("mod", kRegionScore);
  const auto region = std::make_shared<const Graph>(std::move(identity));
  Attrs sunk;
  sunk.scale = 0.5;
  sunk.sink = true;
  const std::string sink_softmax = error_of([&] { g.add(Op::sink_softmax, {x, wide}); });
  EXPECT_EQ(sink_softmax,
            "sink_softmax: operand does not broadcast to the target shape (2 vs 1; operand 1 is f32[2,5,2]); operands f32[2,5,7], f32[2,5,2]");
  const std::string flex = error_of([&] { g.add(Op::flex_attention, {k, k, k, wide}, sunk, region); });
  EXPECT_NE(flex.find("flex_attention: operand does not broadcast to the target shape (2 vs 1; operand 3 is f32[2,5,2])"), std::string::npos) << flex;
  EXPECT_NE(error_of([&] {
              g.add(Op::flex_attention, {k, k, k, ids}, sunk, region);
            }).find("operand is not a float tensor (operand 3 is i32[2,5,1])"),
            std::string::npos);
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
  std::map<std::string, Tensor, std::less<>> in{
      {"past", Tensor(DType::f32, {2, 3, 4})}, {"now", Tensor(DType::f32, {2, 2, 4})}, {"one", Tensor(DType::f32, {2, 1, 4})}};
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

std::map<std::string, Tensor, std::less<>> tensors(std::initializer_list<std::pair<const char*, std::vector<std::int64_t>>> shapes) {
  std::map<std::string, Tensor, std::less<>> r;
  for (const auto& [name, shape] : shapes) r.emplace(name, Tensor(DType::f32, shape));
  return r;
}

// Heads: a packed weight [3*E, E] and x [B, E] split into [B, 4, E/4]; the dims print, parse back
// to the same symbols, and bind from E, with the quotient checked and an input's derived dim
// checked against its parts.
TEST(DerivedDims, ProductsAndQuotientsPrintParseAndBindFromTheirParts) {
  const Graph g = parse_graph(
      "graph {\n"
      "  %0 = input \"w\" : f32[3*E,E]\n"
      "  %1 = input \"x\" : f32[B,E]\n"
      "  %2 = matmul(%1, %0) {transpose_a=false, transpose_b=true} : f32[B,3*E]\n"
      "  %3 = reshape(%1) {shape=[B,4,E/4]} : f32[B,4,E/4]\n"
      "  %4 = reshape(%3) {shape=[B,(E/4)*4]} : f32[B,E/4*4]\n"
      "  return y=%2, heads=%3, joined=%4\n"
      "}\n");
  EXPECT_EQ(g.type_string(g.output("heads")), "f32[B,4,E/4]");
  EXPECT_EQ(g.type_string(g.output("joined")), "f32[B,E/4*4]");  // a left-hand quotient needs no parentheses
  EXPECT_EQ(g.node(g.output("joined")).shape[1], product_dims(quotient_dims(symbol_id("E"), 4), 4));
  EXPECT_EQ(print(parse_graph(print(g))), print(g));
  const auto shapes = bind_shapes(g, tensors({{"w", {24, 8}}, {"x", {2, 8}}}));
  EXPECT_EQ(shapes[static_cast<std::size_t>(g.output("heads"))], (Shape{2, 4, 2}));
  EXPECT_EQ(shapes[static_cast<std::size_t>(g.output("joined"))], (Shape{2, 8}));
  EXPECT_EQ(bound_dim(g, shapes, g.node(g.output("heads")).shape[2]), 2);
  EXPECT_EQ(dim_size(g, g.node(0).shape[0], {{"E", 8}}), 24);
  EXPECT_EQ(error_of([&] { bind_shapes(g, tensors({{"w", {18, 6}}, {"x", {2, 6}}})); }), "reshape: dim E/4: E = 6 is not divisible by 4");
  EXPECT_EQ(error_of([&] {
              bind_shapes(g, tensors({{"w", {25, 8}}, {"x", {2, 8}}}));
            }),
            "input 'w': dim 3*E is 25, but E = 8 (from the other inputs) make it 24");
  EXPECT_EQ(error_of([&] { dim_size(g, g.node(0).shape[0], {}); }), "no size given for dim E");
  // Sizes bound from (empty) tensors whose product passes 63 bits: an error, not an overflow.
  const Graph big = parse_graph(
      "graph {\n  %0 = input \"a\" : f32[0,E]\n  %1 = input \"b\" : f32[0,F]\n"
      "  %2 = reshape(%0) {shape=[0,E*F]} : f32[0,E*F]\n  return out=%2\n}\n");
  const std::int64_t huge = std::int64_t{1} << 40;
  std::map<std::string, Tensor, std::less<>> empty;
  empty.emplace("a", Tensor(DType::f32, {0, huge}));
  empty.emplace("b", Tensor(DType::f32, {0, huge}));
  EXPECT_EQ(error_of([&] { bind_shapes(big, empty); }), "reshape: a dim's size 1099511627776 * 1099511627776 exceeds 63 bits");
  // A quotient of sizes must be whole, and a dim's parts are bounded, in the text too.
  EXPECT_THROW(parse_graph("graph {\n  %0 = input \"a\" : f32[7/2]\n  return out=%0\n}\n"), IrError);
  EXPECT_THROW(parse_graph("graph {\n  %0 = input \"a\" : f32[(E]\n  return out=%0\n}\n"), IrError);
  std::string deep = "E";
  for (int i = 0; i < 100; ++i) deep = "(" + deep + ")";
  EXPECT_THROW(parse_graph("graph {\n  %0 = input \"a\" : f32[" + deep + "]\n  return out=%0\n}\n"), IrError);
}

// A slice of a named dim is checked when the dim is bound.
TEST(DerivedDims, ASliceOfANamedDimIsCheckedWhenBound) {
  Graph g;
  auto n = g.add_input("n", DType::f32, {g.symbol("N"), 4});
  g.set_output("s", g.add(Op::slice, {n}, range(0, 1, 3)));
  EXPECT_EQ(bind_shapes(g, tensors({{"n", {5, 4}}}))[1], (Shape{2, 4}));
  EXPECT_EQ(error_of([&] {
              bind_shapes(g, tensors({{"n", {2, 4}}}));
            }),
            "%1 slice: range or attribute out of bounds (1, 3 at axis 0); operands f32[2,4]");
}

// specialize_dims fixes named dims to sizes: the shapes, the dims derived from them and the
// default scales that read them, as a graph built for those sizes would have them.
TEST(DerivedDims, SpecializingANamedDimRecomputesWhatDependsOnIt) {
  Graph g;
  const Dim b = g.symbol("B"), e = g.symbol("E"), h = g.symbol("H");
  auto x = g.add_input("x", DType::f32, {b, e});
  const Dim dh = g.derive_dim(DimOp::quotient, e, h);
  auto heads = g.add(Op::reshape, {x}, shape_attrs(Shape{b, h, dh}));
  g.set_output("scaled", g.add(Op::mul, {heads, g.constant(1.0, {}, dh)}));
  const Graph s = specialize_dims(g, {{"H", 4}});
  EXPECT_EQ(s.type_string(s.output("scaled")), "f32[B,4,E/4]");
  for (const auto& [id, name] : s.symbols()) EXPECT_NE(name, "H");
  const Graph both = specialize_dims(g, {{"H", 4}, {"E", 64}});
  EXPECT_EQ(both.type_string(both.output("scaled")), "f32[B,4,16]");
  for (const Node& n : both.nodes())
    if (n.op == Op::constant) {
      EXPECT_EQ(n.attrs.rsqrt_of, 0);  // folded: 1/sqrt(16)
      EXPECT_EQ(n.attrs.value, 0.25);
    }
  EXPECT_EQ(error_of([&] { specialize_dims(g, {{"H", 3}, {"E", 64}}); }), "dim E/H: 64 is not divisible by 3");
  EXPECT_EQ(error_of([&] { specialize_dims(g, {{"Q", 3}}); }), "the graph has no named dim 'Q' to fix");
  EXPECT_EQ(error_of([&] { specialize_dims(g, {{"H", 0}}); }), "dim H must be at least 1, got 0");
  Graph packed;
  packed.set_output("w", packed.add_input("w", DType::f32, {packed.derive_dim(DimOp::product, 3, packed.symbol("E"))}));
  EXPECT_EQ(error_of([&] { specialize_dims(packed, {{"E", std::int64_t{4} << 60}}); }), "dim 3*E exceeds 63 bits with these sizes");
}

}  // namespace
}  // namespace qkv::ir
