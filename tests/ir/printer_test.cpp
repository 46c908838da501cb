// The IR's text form: golden output, round trips over every op case, parse errors, DOT.
#include <gtest/gtest.h>

#include <cmath>

#include "ir/error.hpp"
#include "ir/op_cases.hpp"
#include "ir/printer.hpp"

namespace qkv::ir {
namespace {

Graph small_graph() {
  Graph g;
  Dim n = g.symbol("N");
  auto x = g.add_input("x", DType::f32, {n, 4});
  Attrs sm;
  sm.axis = 1;
  auto y = g.add(Op::softmax, {x}, sm);
  auto z = g.add(Op::mul, {y, g.constant(0.5)});
  g.set_output("z", z);
  return g;
}

TEST(Printer, Golden) {
  EXPECT_EQ(print(small_graph()),
            "graph {\n"
            "  %0 = input \"x\" : f32[N,4]\n"
            "  %1 = softmax(%0) {axis=1} : f32[N,4]\n"
            "  %2 = constant {shape=[], value=0.5} : f32[]\n"
            "  %3 = mul(%1, %2) : f32[N,4]\n"
            "  return z=%3\n"
            "}\n");
}

TEST(Printer, RoundTripsEveryOpCase) {
  for (Op op : all_ops())
    for (const auto& c : op_cases(op)) {
      Graph g = case_graph(op, c);
      std::string text = print(g);
      EXPECT_EQ(print(parse_graph(text)), text) << op_name(op) << " " << c.label;
    }
}

TEST(Printer, RoundTripsSpecialValues) {
  Graph g;
  auto x = g.add_input("x", DType::boolean, {2});
  auto a = g.constant(-HUGE_VAL, {2});
  auto b = g.constant(0.1, {2});
  g.set_output("y", g.add(Op::where, {x, a, b}));
  EXPECT_EQ(print(parse_graph(print(g))), print(g));
}

TEST(Parser, ReportsLine) {
  try {
    parse_graph("graph {\n  %0 = input \"x\" : f32[2]\n  %1 = frobnicate(%0) : f32[2]\n  return y=%1\n}\n");
    FAIL();
  } catch (const IrError& e) {
    EXPECT_NE(std::string(e.what()).find("line 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("unknown op 'frobnicate'"), std::string::npos) << e.what();
  }
}

TEST(Parser, RejectsWrongTypes) {
  EXPECT_THROW(parse_graph("graph {\n  %0 = input \"x\" : f32[2]\n  %1 = exp(%0) : f32[3]\n  return y=%1\n}\n"), IrError);
  EXPECT_THROW(parse_graph("graph {\n  %0 = input \"x\" : f32[2]\n  %1 = exp(%5) : f32[2]\n}\n"), IrError);
  EXPECT_THROW(parse_graph("graph {\n  %0 = input \"x\" : f32[2]\n"), IrError);
}

TEST(Dot, DrawsNodesEdgesAndOutputs) {
  std::string dot = to_dot(small_graph());
  EXPECT_NE(dot.find("digraph qkv"), std::string::npos);
  EXPECT_NE(dot.find("n0 -> n1;"), std::string::npos);
  EXPECT_NE(dot.find("\"out_z\""), std::string::npos);
}

}  // namespace
}  // namespace qkv::ir
