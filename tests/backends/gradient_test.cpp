// Gradients of every op in the registry: finite differences on the float64 reference, and the
// backward graph on every backend against the reference.
#include <gtest/gtest.h>

#include "ir/passes/passes.hpp"
#include "ir/printer.hpp"
#include "sweeps/op_cases.hpp"
#include "tests/support/backend_fixture.hpp"
#include "tests/support/gradcheck.hpp"

namespace qkv {
namespace {

using Param = testing::RegistryCase;

/// Every case of the differentiable ops (cases without a float input are skipped in the tests).
std::vector<Param> differentiable_cases() {
  return testing::registry_cases([](ir::Op op) {
    auto kind = ir::gradient_info(op).kind;
    return kind == ir::GradKind::rule || kind == ir::GradKind::decompose;
  });
}

std::vector<std::string> float_inputs(const ir::OpCase& c) {
  std::vector<std::string> r;
  for (std::size_t i = 0; i < c.inputs.size(); ++i)
    if (ir::fill_dtype(c.inputs[i].fill) == DType::f32) r.push_back("x" + std::to_string(i));
  return r;
}

/// The case's inputs plus the loss weights (and anything else the graph reads).
backend::TensorMap inputs_for(const ir::Graph& g, const ir::OpCase& c, std::uint64_t seed) {
  backend::TensorMap m = backend::random_inputs(g, {}, seed);
  for (auto& [name, t] : testing::case_inputs(c, seed)) m.at(name) = std::move(t);
  return m;
}

class Gradients : public ::testing::TestWithParam<Param> {};

TEST_P(Gradients, MatchFiniteDifferencesInDoublePrecision) {
  const Param& p = GetParam();
  auto wrt = float_inputs(p.c);
  if (wrt.empty()) GTEST_SKIP() << "no float input";
  ir::Graph g = testing::with_weighted_sum_loss(ir::case_graph(p.op, p.c));
  testing::expect_gradients_match_finite_differences(g, inputs_for(g, p.c, 99 + p.index), wrt);
}

// Forward mode (ir::build_jvp, derived from the rules above) along a random direction of every
// float input at once, against central differences along it.
TEST_P(Gradients, JvpMatchesCentralDifferencesInDoublePrecision) {
  const Param& p = GetParam();
  auto wrt = float_inputs(p.c);
  if (wrt.empty()) GTEST_SKIP() << "no float input";
  const ir::Graph g = ir::case_graph(p.op, p.c);
  testing::expect_jvp_matches_central_differences(g, inputs_for(g, p.c, 99 + p.index), wrt, 31 + p.index);
}

TEST_P(Gradients, BackwardGraphMatchesReferenceOnEveryBackend) {
  const Param& p = GetParam();
  auto wrt = float_inputs(p.c);
  if (wrt.empty()) GTEST_SKIP() << "no float input";
  ir::Graph g = testing::with_weighted_sum_loss(ir::case_graph(p.op, p.c));
  ir::Graph backward = ir::build_backward(g, {"loss", wrt, {}});
  auto in = inputs_for(g, p.c, 7 + p.index);
  for (const char* b : {"cpu", "vulkan"}) {
    SCOPED_TRACE(b);
    testing::expect_equivalent(backward, in, b);
  }
}

// The same backward with every float value in f16, then bf16 (gradients too: each op's gradient
// computes in f32 and rounds once), against the reference rounding at the same points: on cpu in
// both, on vulkan in one, alternating with the case's index as the forward sweep does (a second
// dtype there would add five minutes of lavapipe compiles to every CI run).
// Attention's tangent ops are not: their gradient is their decomposition's (generic kernels the
// other cases sweep in half precision already), a minute of CI for nothing new.
TEST_P(Gradients, BackwardGraphInF16AndBf16MatchesReferenceOnEveryBackend) {
  const Param& p = GetParam();
  auto wrt = float_inputs(p.c);
  if (wrt.empty()) GTEST_SKIP() << "no float input";
  if (ir::attention_roles(p.op).jvp()) GTEST_SKIP() << "an attention tangent op: differentiated through its decomposition";
  for (DType dtype : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const ir::Graph g = ir::to_dtype(testing::with_weighted_sum_loss(ir::case_graph(p.op, p.c)), dtype);
    const ir::Graph backward = ir::build_backward(g, {"loss", wrt, {}});
    EXPECT_EQ(backward.node(backward.output("d_" + wrt[0])).dtype, dtype);
    const auto in = testing::inputs_in_dtype(inputs_for(g, p.c, 7 + p.index), dtype);
    testing::expect_equivalent(backward, in, "cpu");
    if ((dtype == DType::f16) == (p.index % 2 == 0)) testing::expect_equivalent(backward, in, "vulkan");
  }
}

std::string case_name(const ::testing::TestParamInfo<Param>& p) { return testing::case_label(p.param); }

INSTANTIATE_TEST_SUITE_P(AllOps, Gradients, ::testing::ValuesIn(differentiable_cases()), case_name);

TEST(GradientCoverage, EveryOpChoosesHowItIsDifferentiated) {
  for (ir::Op op : ir::all_ops()) {
    auto info = ir::gradient_info(op);
    EXPECT_NE(info.kind, ir::GradKind::missing) << ir::op_name(op) << " has no gradient rule";
    if (info.kind == ir::GradKind::zero || info.kind == ir::GradKind::decompose) {
      EXPECT_FALSE(info.why.empty()) << ir::op_name(op) << " says no reason";
    }
    if (info.kind == ir::GradKind::decompose) {
      EXPECT_EQ(ir::op_info(op).category, ir::OpCategory::composite) << ir::op_name(op);
    }
  }
}

TEST(GradientCoverage, AnOpWithoutARuleIsReportedByName) {
  ir::Graph g = testing::with_weighted_sum_loss(ir::case_graph(ir::Op::exp, ir::op_cases(ir::Op::exp)[0]));
  auto without_exp = [](ir::Op op) { return op == ir::Op::exp ? ir::GradientInfo{ir::GradKind::missing, {}, nullptr} : ir::gradient_info(op); };
  try {
    ir::build_backward(g, {"loss", {"x0"}, {}}, without_exp);
    FAIL() << "no error";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("op 'exp'"), std::string::npos) << e.what();
  }
}

/// A packed tensor read through slices (a packed QKV weight): the backward graph's sum of
/// zero-padded slice gradients is folded into one concatenation when the slices are disjoint
/// (fold_padded_sums), kept where two overlap, and right against finite differences and on
/// every backend either way.
TEST(GradientOfSlices, PaddedSumsFoldAndMatchFiniteDifferences) {
  for (const std::int64_t v_begin : {6, 5}) {  // rows 5..6 read by both k and v in the second
    SCOPED_TRACE("v from row " + std::to_string(v_begin));
    ir::Graph g;
    const ir::ValueId w = g.add_input("w", DType::f32, {v_begin + 3, 3});
    const ir::ValueId x = g.add_input("x", DType::f32, {3, 3});
    auto rows = [&](std::int64_t begin, std::int64_t end) {
      ir::Attrs a;
      a.axis = 0;
      a.begin = begin;
      a.end = end;
      return g.add(ir::Op::slice, {w}, a);
    };
    const ir::ValueId q = g.add(ir::Op::matmul, {x, rows(0, 3)});
    const ir::ValueId k = g.add(ir::Op::tanh, {rows(3, 6)});
    const ir::ValueId v = g.add(ir::Op::mul, {rows(v_begin, v_begin + 3), rows(v_begin, v_begin + 3)});
    g.set_output("out", g.add(ir::Op::add, {g.add(ir::Op::add, {q, k}), v}));
    ir::Graph with_loss = testing::with_weighted_sum_loss(g);
    auto in = backend::random_inputs(with_loss, {}, 3);
    testing::expect_gradients_match_finite_differences(with_loss, in, {"w", "x"});
    ir::Graph backward = ir::build_backward(with_loss, {"loss", {"w", "x"}, {}});
    ir::Graph lowered = ir::lower_for_backend(backward, [](const ir::Node&) { return true; });
    const ir::Node& dw = lowered.node(lowered.output("d_w"));
    if (v_begin == 6) {
      EXPECT_EQ(dw.op, ir::Op::concat) << ir::print(lowered);
    }
    for (const char* b : {"cpu", "vulkan"}) {
      SCOPED_TRACE(b);
      testing::expect_equivalent(backward, in, b);
    }
  }
}

TEST(GradientSpec, BadRequestsAreClearErrors) {
  ir::Graph g = testing::with_weighted_sum_loss(ir::case_graph(ir::Op::where, ir::op_cases(ir::Op::where)[0]));
  EXPECT_THROW(ir::build_backward(g, {"loss", {"x0"}, {}}), ShapeError);    // a bool input
  EXPECT_THROW(ir::build_backward(g, {"loss", {"nope"}, {}}), ShapeError);  // no such input
  EXPECT_THROW(ir::build_backward(g, {"out", {"x1"}, {}}), ShapeError);     // not a scalar
  EXPECT_THROW(ir::build_backward(g, {"", {"x1"}, {}}), ShapeError);        // nothing to seed
}

}  // namespace
}  // namespace qkv
