// Inputs held on the backend between runs, and the graph updates that write back into them.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

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

/// Resets the process's peak resident memory (VmHWM) to what it holds now (Linux's clear_refs).
void reset_peak_resident() { std::ofstream("/proc/self/clear_refs") << "5"; }

/// The process's peak resident memory so far (VmHWM), in MB.
double peak_resident_mb() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0;
}

// A model's held state (weights, a key/value cache) is bound in place when a new shape is
// planned: a chunked prefill plans three times, and each plan once copied every held tensor.
TEST_P(State, ANewPlanCopiesNoHeldTensor) {
  // The reference reads its inputs as a map of copies; vulkan holds the state in the plan's arena
  // and uploads it into each new one (and lavapipe binds at most 128 MiB at once).
  if (GetParam() != "cpu") GTEST_SKIP() << "the cpu backend holds its state in place";
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  ir::Graph g;
  const ir::Dim n = g.symbol("N");
  const ir::ValueId held = g.add_input("held", DType::f32, {g.symbol("M")});
  const ir::ValueId x = g.add_input("x", DType::f32, {n});
  ir::Attrs all;
  all.keepdim = false;
  g.set_output("out", g.add(ir::Op::add, {x, g.add(ir::Op::reduce_sum, {held}, all)}));
  auto exe = b->compile(g);
  const std::int64_t mb = 256, floats = mb << 18;
  backend::TensorMap state;
  state.emplace("held", Tensor(DType::f32, {floats}));  // owned (not a view), zeros written; moved, never copied
  exe->set_state(std::move(state));
  reset_peak_resident();                     // an earlier test's peak in this process would hide a copy
  const double before = peak_resident_mb();  // the held tensor's pages written
  EXPECT_EQ(exe->run({{"x", Tensor::from<float>({1}, {1})}}).at("out").at(0), 1.0);
  for (std::int64_t size : {2, 3, 4}) EXPECT_EQ(exe->run({{"x", Tensor(DType::f32, {size})}}).at("out").at(0), 0.0);
  EXPECT_LT(peak_resident_mb() - before, mb / 4) << "replanning for new shapes copied the held tensor";
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
