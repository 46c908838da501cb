// The IR's text form: golden output, round trips over every op case, parse errors, DOT.
#include <gtest/gtest.h>

#include <cmath>

#include "ir/error.hpp"
#include "ir/printer.hpp"
#include "sweeps/op_cases.hpp"

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

TEST(Printer, HalfPrecisionDtypesAndCastsRoundTrip) {
  Graph g;
  const ValueId x = g.add_input("x", DType::f16, {g.symbol("N"), 4});
  Attrs to;
  to.dtype = DType::bf16;
  const ValueId y = g.add(Op::cast, {g.add(Op::mul, {x, g.constant(0.5)})}, to);
  g.set_output("y", y);
  const std::string text = print(g);
  EXPECT_NE(text.find("%0 = input \"x\" : f16[N,4]"), std::string::npos) << text;
  EXPECT_NE(text.find("%2 = mul(%0, %1) : f16[N,4]"), std::string::npos) << text;
  EXPECT_NE(text.find("%3 = cast(%2) : bf16[N,4]"), std::string::npos) << text;
  const Graph back = parse_graph(text);
  EXPECT_EQ(print(back), text);
  EXPECT_EQ(back.node(back.output("y")).attrs.dtype, DType::bf16);
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

namespace qkv::ir {
namespace {

void expect_parse_error(const std::string& text, const std::string& needle) {
  try {
    parse_graph(text);
    ADD_FAILURE() << "parsed:\n" << text.substr(0, 300);
  } catch (const IrError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

std::string one_input(const std::string& type, const std::string& rest = "  return out=%0\n") {
  return "graph {\n  %0 = input \"a\" : " + type + "\n" + rest + "}\n";
}

TEST(Parser, IntegersOutOfRangeAreErrorsNotTruncations) {
  // Each of these read as a smaller number before (%0, axis 1, perm [1,0]).
  expect_parse_error(one_input("f32[2]", "  return out=%4294967296\n"), "line 3: %4294967296 is not defined before use");
  expect_parse_error(one_input("f32[2,3]", "  %1 = softmax(%0) {axis=4294967297} : f32[2,3]\n  return out=%1\n"),
                     "line 3: axis 4294967297 is outside [-8, 8]");
  expect_parse_error(one_input("f32[2,3]", "  %1 = permute(%0) {perm=[257,256]} : f32[3,2]\n  return out=%1\n"), "perm entry 257 is not an axis");
  expect_parse_error("graph {\n  %4294967296 = input \"a\" : f32[2]\n  return out=%0\n}\n", "values must be numbered in order");
}

TEST(Parser, DimsAndElementCountsAreBounded) {
  expect_parse_error(one_input("f32[9223372036854775807+9223372036854775807]"), "larger than 1099511627776");
  expect_parse_error(one_input("f32[1099511627776,1099511627776,1099511627776]"), "more elements than 64 bits count");
  // A long dim sum is refused after 64 parts instead of recursing and naming every partial sum
  // (a 100 KB one took 2.4 GB and overflowed the stack).
  std::string sum = "N";
  for (int i = 0; i < 30000; ++i) sum += "+N";
  expect_parse_error(one_input("f32[" + sum + "]"), "has more than 64 parts");
  // Up to the bound, derived dims parse and print back.
  const Graph g = parse_graph(one_input("f32[N+M+1]"));
  EXPECT_EQ(g.type_string(0), "f32[N+M+1]");
}

TEST(Parser, EveryErrorNamesItsLine) {
  expect_parse_error(one_input("f32[2]", "  %1 = exp(%0) : f32[3]\n  return out=%1\n"), "line 3: %1 is written f32[3] but exp gives f32[2]");
  expect_parse_error(one_input("f32[2]", "  return out=%0, out=%0\n"), "line 3: output 'out' is named twice");
  expect_parse_error(one_input("f32[2]", "  %1 = exp(%0) : f32[2]\n  update a=%1, a=%1\n  return out=%1\n"), "line 4:");
  expect_parse_error(one_input("f32[2]", "  %1 = reduce_sum(%0) {axis=0, keepdim=false} : f32[]\n  update a=%1\n  return out=%1\n"),
                     "line 4: update of input 'a'");
  expect_parse_error("graph {\n  %0 = input \"a\" : f32[2]\n  %1 = input \"a\" : f32[2]\n  return out=%0\n}\n", "line 3: input name 'a' used twice");
  expect_parse_error("graph {\n  %0 = input \"a\" : f32[2]\n}\n", "no 'return' line");
  // Attention's backward ops check their operands' ranks before reading any dim.
  expect_parse_error(one_input("f32[2]", "  %1 = attention_lse(%0, %0) {scale=1, causal=false, align=top_left} : f32[2,1]\n  return out=%1\n"),
                     "line 3:");
  expect_parse_error(one_input("f32[]",
                               "  %1 = attention_grad(%0, %0, %0, %0, %0, %0) {scale=1, causal=false, align=top_left, wrt=1} : f32[]\n"
                               "  return out=%1\n"),
                     "line 3:");
  // One meaning per attribute: a scale written as attention's value (as before scale was its own)
  // is refused where it is written, with the attribute to use.
  expect_parse_error(
      one_input("f32[2,3]", "  %1 = attention(%0, %0, %0) {value=0.5, causal=false, align=top_left} : f32[2,3]\n  return out=%1\n"),
      "line 3: attention: has no attribute 'value' (it reads scale, rsqrt_of, causal, align, window); an attention op's scale is its 'scale'");
  expect_parse_error(one_input("f32[2,3]", "  %1 = exp(%0) {axis=1} : f32[2,3]\n  return out=%1\n"),
                     "line 3: exp: has no attribute 'axis' (it reads none)");
}

TEST(Parser, AGraphWithoutOutputsRoundTrips) {
  Graph g;
  const ValueId w = g.add_input("w", DType::f32, {2});
  g.set_update("w", g.add(Op::neg, {w}));
  const std::string text = print(g);
  EXPECT_NE(text.find("  return\n"), std::string::npos) << text;
  EXPECT_EQ(print(parse_graph(text)), text);
}

TEST(Parser, ScaleOfANamedDimRoundTrips) {
  const std::string text =
      "graph {\n  %0 = input \"q\" : f32[N,D]\n  %1 = constant {shape=[], value=1, rsqrt_of=D} : f32[]\n  %2 = mul(%0, %1) : f32[N,D]\n"
      "  return out=%2\n}\n";
  EXPECT_EQ(print(parse_graph(text)), text);
}

}  // namespace
}  // namespace qkv::ir
