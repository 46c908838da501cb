// Passes: CSE, DCE, decomposition, the verifier, memory planning and shape binding.
#include <gtest/gtest.h>

#include "ir/bind.hpp"
#include "ir/error.hpp"
#include "ir/passes/memory_plan.hpp"
#include "ir/passes/passes.hpp"
#include "ir/printer.hpp"
#include "ir/verifier.hpp"

namespace qkv::ir {
namespace {

TEST(Cse, MergesDuplicatesFromUncheckedGraphs) {
  Graph g;
  auto x = g.add_input("x", DType::f32, {3});
  Node e;
  e.op = Op::exp;
  e.inputs = {x};
  e.shape = {3};
  auto a = g.append_unchecked(e);
  auto b = g.append_unchecked(e);
  g.set_output("y", g.add(Op::add, {a, b}));
  Graph r = eliminate_common_subexpressions(g);
  EXPECT_EQ(r.size(), 3u);
  verify(r);
}

TEST(Dce, DropsUnusedKeepsInputs) {
  Graph g;
  auto x = g.add_input("x", DType::f32, {3});
  auto unused = g.add_input("unused", DType::f32, {3});
  g.add(Op::exp, {x});
  g.set_output("y", g.add(Op::neg, {x}));
  (void)unused;
  Graph r = eliminate_dead_code(g);
  EXPECT_EQ(r.size(), 3u);
  EXPECT_EQ(r.inputs().size(), 2u);
}

TEST(Decompose, SoftmaxBecomesPrimitives) {
  Graph g;
  auto x = g.add_input("x", DType::f32, {2, 5});
  Attrs a;
  a.axis = 1;
  g.set_output("y", g.add(Op::softmax, {x}, a));
  Graph r = decompose_composites(g, [](const Node&) { return false; });
  for (const Node& n : r.nodes()) EXPECT_NE(n.op, Op::softmax);
  EXPECT_NE(print(r).find("reduce_max"), std::string::npos);
  Graph kept = decompose_composites(g, [](const Node&) { return true; });
  EXPECT_EQ(print(kept), print(g));
}

TEST(Verifier, CatchesWrongRecordedType) {
  Graph g;
  auto x = g.add_input("x", DType::f32, {3});
  Node e;
  e.op = Op::exp;
  e.inputs = {x};
  e.shape = {4};
  g.append_unchecked(e);
  EXPECT_THROW(verify(g), IrError);
}

TEST(MemoryPlan, ReusesDeadStorageWithoutOverlappingLiveValues) {
  Graph g;
  auto x = g.add_input("x", DType::f32, {1024});
  auto a = g.add(Op::exp, {x});
  auto b = g.add(Op::neg, {a});
  auto c = g.add(Op::sqrt, {b});
  auto d = g.add(Op::log, {c});
  g.set_output("y", d);
  std::vector<std::int64_t> bytes(g.size(), 4096);
  auto plan = plan_memory(g, bytes, [](const Node&) { return false; }, 64);
  EXPECT_LE(plan.total_bytes, 3 * 4096);  // at most two values live at once, plus the input
  for (std::size_t i = 1; i < g.size(); ++i) {
    auto in = static_cast<std::size_t>(g.nodes()[i].inputs[0]);
    EXPECT_NE(plan.offset[i], plan.offset[in]) << "a kernel's output overlaps its input";
  }
}

TEST(MemoryPlan, ReshapeAliases) {
  Graph g;
  auto x = g.add_input("x", DType::f32, {4, 6});
  auto e = g.add(Op::exp, {x});
  Attrs a;
  a.shape = {24};
  auto r = g.add(Op::reshape, {e}, a);
  g.set_output("y", r);
  auto plan = plan_memory(g, std::vector<std::int64_t>(g.size(), 96), [](const Node&) { return false; }, 16);
  EXPECT_EQ(plan.storage_of[static_cast<std::size_t>(r)], e);
  EXPECT_EQ(plan.offset[static_cast<std::size_t>(r)], -1);
}

/// Views the caller names alias their operand at an offset (a slice of a reshape adds up), and
/// keep the storage they read alive until their own last reader.
TEST(MemoryPlan, ViewsAliasAtTheirOffsetAndKeepTheirStorageAlive) {
  Graph g;
  auto x = g.add_input("x", DType::f32, {64});
  auto z = g.add_input("z", DType::f32, {1, 16});
  auto e = g.add(Op::exp, {x});
  Attrs a;
  a.shape = {4, 16};
  auto r = g.add(Op::reshape, {e}, a);
  Attrs rows;
  rows.axis = 0;
  rows.begin = 2;
  rows.end = 3;
  auto s = g.add(Op::slice, {r}, rows);   // a view at byte 128
  auto t = g.add(Op::neg, {z});           // must not take e's storage: s still reads it
  auto u = g.add(Op::add, {s, t});
  g.set_output("y", u);
  std::vector<std::int64_t> bytes = {256, 64, 256, 256, 64, 64, 64};
  std::vector<std::int64_t> views = {-1, -1, -1, 0, 128, -1, -1};
  auto plan = plan_memory(g, bytes, [](const Node&) { return false; }, 16, nullptr, &views);
  EXPECT_EQ(plan.storage_of[static_cast<std::size_t>(s)], e);
  EXPECT_EQ(plan.view_offset[static_cast<std::size_t>(s)], 128);
  EXPECT_EQ(plan.view_offset[static_cast<std::size_t>(r)], 0);
  EXPECT_EQ(plan.offset[static_cast<std::size_t>(s)], -1);
  const auto at = [&](ValueId v) { return plan.offset[static_cast<std::size_t>(v)]; };
  EXPECT_TRUE(at(t) + 64 <= at(e) || at(e) + 256 <= at(t)) << "t overwrote the storage s reads";
  // Without views only the reshape aliases.
  auto plain = plan_memory(g, bytes, [](const Node&) { return false; }, 16);
  EXPECT_EQ(plain.storage_of[static_cast<std::size_t>(s)], s);
  EXPECT_GE(plain.offset[static_cast<std::size_t>(s)], 0);
}

TEST(Bind, ResolvesSymbolsAndReportsConflicts) {
  Graph g;
  Dim n = g.symbol("N");
  auto q = g.add_input("q", DType::f32, {n, 8});
  auto k = g.add_input("k", DType::f32, {n, 8});
  Attrs t;
  t.transpose_b = true;
  g.set_output("s", g.add(Op::matmul, {q, k}, t));
  std::map<std::string, Tensor, std::less<>> in;
  in.emplace("q", Tensor(DType::f32, {5, 8}));
  in.emplace("k", Tensor(DType::f32, {5, 8}));
  auto shapes = bind_shapes(g, in);
  EXPECT_EQ(shapes.back(), (Shape{5, 5}));

  in.at("k") = Tensor(DType::f32, {6, 8});
  try {
    bind_shapes(g, in);
    FAIL();
  } catch (const ShapeError& e) {
    EXPECT_STREQ(e.what(), "input 'k': dim N is 6, but input 'q' set it to 5");
  }
  in.at("k") = Tensor(DType::f32, {5, 9});
  EXPECT_THROW(bind_shapes(g, in), ShapeError);
  in.at("k") = Tensor(DType::f64, {5, 8});
  EXPECT_THROW(bind_shapes(g, in), ShapeError);
  in.erase("k");
  EXPECT_THROW(bind_shapes(g, in), ShapeError);
  in.emplace("k", Tensor(DType::f32, {5, 8}));
  in.emplace("extra", Tensor(DType::f32, {1}));
  EXPECT_THROW(bind_shapes(g, in), ShapeError);
}

}  // namespace
}  // namespace qkv::ir

namespace qkv::ir {
namespace {

TEST(MemoryPlan, LateInputsDoNotShareStorageWithEarlierTemporaries) {
  Graph g;
  auto a = g.add_input("a", DType::f32, {256});
  auto t1 = g.add(Op::exp, {a});
  auto t2 = g.add(Op::neg, {t1});
  auto late = g.add_input("late", DType::f32, {256});
  g.set_output("y", g.add(Op::add, {t2, late}));
  auto plan = plan_memory(g, std::vector<std::int64_t>(g.size(), 1024), [](const Node&) { return false; }, 64);
  auto overlaps = [&](ValueId x, ValueId y) {
    auto ox = plan.offset[static_cast<std::size_t>(x)], oy = plan.offset[static_cast<std::size_t>(y)];
    return ox < oy + 1024 && oy < ox + 1024;
  };
  EXPECT_FALSE(overlaps(late, t1));
  EXPECT_FALSE(overlaps(late, t2));
  EXPECT_FALSE(overlaps(late, a));
}

}  // namespace
}  // namespace qkv::ir
