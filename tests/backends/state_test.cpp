// Inputs held on the backend between runs, and the graph updates that write back into them.
#include <gtest/gtest.h>

#include "ir/printer.hpp"
#include "tests/support/backend_fixture.hpp"

namespace qkv {
namespace {

/// out = w * x (rows of x), then w := w + sum of x's rows.
ir::Graph accumulator() {
  ir::Graph g;
  ir::Dim n = g.symbol("N");
  auto w = g.add_input("w", DType::f32, {3});
  auto x = g.add_input("x", DType::f32, {n, 3});
  g.set_output("out", g.add(ir::Op::mul, {w, x}));
  ir::Attrs rows;
  rows.keepdim = false;
  g.set_update("w", g.add(ir::Op::add, {w, g.add(ir::Op::reduce_sum, {x}, rows)}));
  return g;
}

class State : public ::testing::TestWithParam<std::string> {};

TEST_P(State, UpdatesPersistAcrossRunsAndReplans) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  auto exe = b->compile(accumulator());
  exe->set_state({{"w", Tensor::from<float>({3}, {1, 2, 3})}});
  auto ones = [](std::int64_t n) { return Tensor::from<float>({n, 3}, std::vector<float>(static_cast<std::size_t>(n * 3), 1.0f)); };
  auto r = exe->run({{"x", ones(2)}});
  EXPECT_EQ(r.at("out").at(0), 1.0);  // the old w
  r = exe->run({{"x", ones(2)}});
  EXPECT_EQ(r.at("out").at(0), 3.0);  // w + 2 after one run
  r = exe->run({{"x", ones(4)}});     // other shapes: a new plan must keep the held w
  EXPECT_EQ(r.at("out").at(0), 5.0);
  auto s = exe->state();
  EXPECT_EQ(s.at("w").at(0), 9.0);
  EXPECT_EQ(s.at("w").at(2), 11.0);
  exe->set_state({{"w", Tensor::from<float>({3}, {0, 0, 0})}});
  EXPECT_EQ(exe->run({{"x", ones(1)}}).at("out").at(0), 0.0);
  EXPECT_EQ(exe->state().at("w").at(1), 1.0);
}

TEST_P(State, MisuseIsAClearError) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  auto exe = b->compile(accumulator());
  auto x = Tensor::from<float>({1, 3}, {1, 1, 1});
  try {
    exe->run({{"x", x}, {"w", Tensor(DType::f32, {3})}});
    FAIL() << "an updated input that is not held";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("input 'w' is updated by the graph"), std::string::npos) << e.what();
  }
  exe->set_state({{"w", Tensor(DType::f32, {3})}});
  EXPECT_THROW(exe->run({{"x", x}, {"w", Tensor(DType::f32, {3})}}), ShapeError);  // given both ways
  EXPECT_THROW(exe->set_state({{"nope", Tensor(DType::f32, {3})}}), ShapeError);
  EXPECT_THROW(exe->set_state({{"w", Tensor(DType::f64, {3})}}), ShapeError);
}

INSTANTIATE_TEST_SUITE_P(All, State, ::testing::Values("reference", "cpu", "vulkan"), ::qkv::testing::BackendParamName());

TEST(StateIr, UpdatesPrintParseAndVerify) {
  ir::Graph g = accumulator();
  std::string text = ir::print(g);
  EXPECT_NE(text.find("  update w=%"), std::string::npos) << text;
  EXPECT_EQ(ir::print(ir::parse_graph(text)), text);
  EXPECT_THROW(g.set_update("w", g.output("out")), IrError);     // w is already updated
  EXPECT_THROW(g.set_update("nope", g.output("out")), IrError);  // no such input
  ir::Graph h;
  auto a = h.add_input("a", DType::f32, {3});
  auto b = h.add_input("b", DType::f32, {4});
  EXPECT_THROW(h.set_update("a", b), ShapeError);  // types differ
  (void)a;
}

}  // namespace
}  // namespace qkv
