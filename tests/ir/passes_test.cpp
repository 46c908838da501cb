// Passes: CSE, DCE, decomposition, the verifier, memory planning and shape binding.
#include <gtest/gtest.h>

#include <algorithm>

#include "ir/bind.hpp"
#include "ir/error.hpp"
#include "ir/passes/memory_plan.hpp"
#include "ir/passes/passes.hpp"
#include "ir/printer.hpp"
#include "ir/region.hpp"
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

/// x of shape [rows, 2] padded with zeros to [6, 2] at row `at`.
ValueId padded(Graph& g, ValueId x, std::int64_t at) {
  const std::int64_t rows = g.node(x).shape[0];
  Attrs join;
  join.axis = 0;
  ValueId r = x;
  if (at > 0) r = g.add(Op::concat, {g.add(Op::broadcast_to, {g.constant(0.0)}, shape_attrs({at, 2})), r}, join);
  if (at + rows < 6) r = g.add(Op::concat, {r, g.add(Op::broadcast_to, {g.constant(0.0)}, shape_attrs({6 - at - rows, 2}))}, join);
  return r;
}

int count(const Graph& g, Op op) {
  return static_cast<int>(std::count_if(g.nodes().begin(), g.nodes().end(), [&](const Node& n) { return n.op == op; }));
}

/// What autodiff makes of a tensor read through three slices (a packed QKV weight):
/// concat(a, 0) + concat(0, b, 0) + concat(0, c) becomes concat(a, b, c); a piece two operands
/// both have is added; pieces that do not line up (a value over part of another's) stay.
TEST(FoldPaddedSums, SlicesGradientsBecomeOneConcatenation) {
  Graph g;
  auto a = g.add_input("a", DType::f32, {2, 2});
  auto b = g.add_input("b", DType::f32, {2, 2});
  auto c = g.add_input("c", DType::f32, {2, 2});
  auto sum = g.add(Op::add, {g.add(Op::add, {padded(g, a, 0), padded(g, b, 2)}), padded(g, c, 4)});
  g.set_output("d", sum);
  Graph r = eliminate_dead_code(fold_padded_sums(g));
  verify(r);
  EXPECT_EQ(count(r, Op::add), 0) << print(r);
  EXPECT_EQ(count(r, Op::broadcast_to), 0) << print(r);
  EXPECT_EQ(count(r, Op::concat), 2) << print(r);
  const Node& out = r.node(r.output("d"));
  ASSERT_EQ(out.op, Op::concat);
  EXPECT_EQ(r.node(out.inputs[1]).name, "c");
  const Node& first = r.node(out.inputs[0]);
  ASSERT_EQ(first.op, Op::concat);
  EXPECT_EQ(r.node(first.inputs[0]).name, "a");
  EXPECT_EQ(r.node(first.inputs[1]).name, "b");

  // The same piece on both sides is added; zeros neither side fills stay zeros.
  Graph h;
  auto x = h.add_input("x", DType::f32, {2, 2});
  auto y = h.add_input("y", DType::f32, {2, 2});
  h.set_output("d", h.add(Op::add, {padded(h, x, 2), padded(h, y, 2)}));
  Graph folded = eliminate_dead_code(fold_padded_sums(h));
  EXPECT_EQ(count(folded, Op::add), 1) << print(folded);
  EXPECT_TRUE(print(folded).find("add(%0, %1)") != std::string::npos) << print(folded);

  // x over rows 1..3 and y over rows 2..4 overlap without lining up: kept as it is.
  Graph k;
  auto p = k.add_input("p", DType::f32, {2, 2});
  auto q = k.add_input("q", DType::f32, {2, 2});
  k.set_output("d", k.add(Op::add, {padded(k, p, 1), padded(k, q, 2)}));
  EXPECT_EQ(print(eliminate_dead_code(fold_padded_sums(k))), print(eliminate_dead_code(k)));
}

// Query heads that share k and v become rows of one batch entry: q [B, Hkv, G, N, D] as
// [B, Hkv, G N, D], k and v without their axis of 1, the output reshaped back; a sink per head
// broadcast to one per row; only nodes `keep` accepts, and not where the row matters.
TEST(GroupQueryHeads, FoldsSharedHeadsIntoRows) {
  auto grouped = [](bool sink, bool causal_top_left) {
    Graph g;
    const ValueId q = g.add_input("q", DType::f32, {2, 4, 3, 1, 8}), k = g.add_input("k", DType::f32, {2, 4, 1, 20, 8});
    Attrs a;
    a.scale = 0.5;
    a.causal = causal_top_left;
    std::vector<ValueId> operands = {q, k, k};
    if (sink) {
      operands.push_back(g.add_input("sinks", DType::f32, {4, 3, 1, 1}));
      a.sink = true;
    }
    Graph region = make_region({});
    region.set_output("mod", kRegionScore);
    g.set_output("out", g.add(Op::flex_attention, operands, a, std::make_shared<const Graph>(std::move(region))));
    return g;
  };
  const Graph r = group_query_heads(grouped(true, false));
  verify(r);
  const Node& out = r.node(r.output("out"));
  ASSERT_EQ(out.op, Op::reshape) << print(r);
  EXPECT_EQ(out.shape, (Shape{2, 4, 3, 1, 8}));
  const Node& attention = r.node(out.inputs[0]);
  ASSERT_EQ(attention.op, Op::flex_attention) << print(r);
  EXPECT_EQ(r.node(attention.inputs[0]).shape, (Shape{2, 4, 3, 8}));
  EXPECT_EQ(r.node(attention.inputs[1]).shape, (Shape{2, 4, 20, 8}));
  EXPECT_EQ(r.node(attention.inputs[3]).shape, (Shape{2, 4, 3, 1})) << "a sink per row";
  EXPECT_EQ(print(group_query_heads(grouped(true, false), [](const Node&) { return false; })), print(grouped(true, false))) << "not kept";
  EXPECT_EQ(print(group_query_heads(grouped(false, true))), print(grouped(false, true))) << "causal top-left keeps key 0 only";
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
  auto plan = plan_memory(
      g, bytes, [](const Node&) { return false; }, 64);
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
  auto plan = plan_memory(
      g, std::vector<std::int64_t>(g.size(), 96), [](const Node&) { return false; }, 16);
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
  auto s = g.add(Op::slice, {r}, rows);  // a view at byte 128
  auto t = g.add(Op::neg, {z});          // must not take e's storage: s still reads it
  auto u = g.add(Op::add, {s, t});
  g.set_output("y", u);
  std::vector<std::int64_t> bytes = {256, 64, 256, 256, 64, 64, 64};
  std::vector<std::int64_t> views = {-1, -1, -1, 0, 128, -1, -1};
  auto plan = plan_memory(
      g, bytes, [](const Node&) { return false; }, 16, nullptr, &views);
  EXPECT_EQ(plan.storage_of[static_cast<std::size_t>(s)], e);
  EXPECT_EQ(plan.view_offset[static_cast<std::size_t>(s)], 128);
  EXPECT_EQ(plan.view_offset[static_cast<std::size_t>(r)], 0);
  EXPECT_EQ(plan.offset[static_cast<std::size_t>(s)], -1);
  const auto at = [&](ValueId v) { return plan.offset[static_cast<std::size_t>(v)]; };
  EXPECT_TRUE(at(t) + 64 <= at(e) || at(e) + 256 <= at(t)) << "t overwrote the storage s reads";
  // Without views only the reshape aliases.
  auto plain = plan_memory(
      g, bytes, [](const Node&) { return false; }, 16);
  EXPECT_EQ(plain.storage_of[static_cast<std::size_t>(s)], s);
  EXPECT_GE(plain.offset[static_cast<std::size_t>(s)], 0);
}

/// A value written into a later value's storage (a flash kernel's output into the permute that
/// reads it) shares that storage, which lives from the first value written into it: nothing
/// computed in between may take those bytes.
TEST(MemoryPlan, PlacedValuesLiveInTheLaterStorageFromTheirOwnNode) {
  Graph g;
  auto x = g.add_input("x", DType::f32, {64});
  auto a = g.add(Op::exp, {x});  // written into p's storage
  auto t = g.add(Op::neg, {x});  // computed while a is live: must not overlap it
  auto u = g.add(Op::add, {a, t});
  Attrs same;
  same.perm = {0};
  auto p = g.add(Op::permute, {a}, same);
  g.set_output("y", g.add(Op::add, {u, p}));
  std::vector<std::int64_t> bytes(g.size(), 256);
  std::vector<Placement> placed(g.size());
  placed[static_cast<std::size_t>(a)] = {p, 0};
  auto plan = plan_memory(
      g, bytes, [](const Node&) { return false; }, 16, nullptr, nullptr, &placed);
  EXPECT_EQ(plan.storage_of[static_cast<std::size_t>(a)], p);
  EXPECT_EQ(plan.offset[static_cast<std::size_t>(a)], -1);
  const auto at = [&](ValueId v) { return plan.offset[static_cast<std::size_t>(v)]; };
  ASSERT_GE(at(p), 0);
  EXPECT_TRUE(at(t) + 256 <= at(p) || at(p) + 256 <= at(t)) << "t overwrote a, which p's storage holds";
  EXPECT_TRUE(at(u) + 256 <= at(p) || at(p) + 256 <= at(u)) << "u overwrote a";
}

/// Placements chain (a concat's operand into a concat placed into another) and add their
/// offsets; the outer storage lives from the first value written into it.
TEST(MemoryPlan, PlacementsChainAndAddTheirOffsets) {
  Graph g;
  auto x = g.add_input("x", DType::f32, {4});
  auto a = g.add(Op::exp, {x});
  auto b = g.add(Op::neg, {x});
  auto t = g.add(Op::sqrt, {x});  // computed while a and b are live: must not take their bytes
  Attrs rows;
  auto ab = g.add(Op::concat, {a, b}, rows);
  auto c = g.add(Op::concat, {ab, g.add(Op::add, {t, t})}, rows);
  g.set_output("y", c);
  std::vector<std::int64_t> bytes(g.size(), 16);
  bytes[static_cast<std::size_t>(ab)] = 32;
  bytes[static_cast<std::size_t>(c)] = 48;
  std::vector<Placement> placed(g.size());
  placed[static_cast<std::size_t>(a)] = {ab, 0};
  placed[static_cast<std::size_t>(b)] = {ab, 16};
  placed[static_cast<std::size_t>(ab)] = {c, 0};
  placed[static_cast<std::size_t>(c - 1)] = {c, 32};
  auto plan = plan_memory(
      g, bytes, [](const Node&) { return false; }, 16, nullptr, nullptr, &placed);
  for (ValueId v : {a, b, ab, c - 1}) EXPECT_EQ(plan.storage_of[static_cast<std::size_t>(v)], c) << "%" << v;
  EXPECT_EQ(plan.view_offset[static_cast<std::size_t>(b)], 16);
  EXPECT_EQ(plan.view_offset[static_cast<std::size_t>(c - 1)], 32);
  const auto at = [&](ValueId v) { return plan.offset[static_cast<std::size_t>(v)]; };
  ASSERT_GE(at(c), 0);
  EXPECT_TRUE(at(t) + 16 <= at(c) || at(c) + 48 <= at(t)) << "t overwrote a or b";
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

/// softmax(q kT * 0.125) v over f32 inputs, and w updated by w * 0.5.
Graph attention_with_update() {
  Graph g;
  const Dim N = g.symbol("N");
  const ValueId q = g.add_input("q", DType::f32, {N, 8}), k = g.add_input("k", DType::f32, {N, 8}), v = g.add_input("v", DType::f32, {N, 8});
  Attrs t;
  t.transpose_b = true;
  Attrs axis;
  axis.axis = 1;
  const ValueId s = g.add(Op::mul, {g.add(Op::matmul, {q, k}, t), g.constant(0.125)});
  g.set_output("out", g.add(Op::matmul, {g.add(Op::softmax, {s}, axis), v}));
  const ValueId w = g.add_input("w", DType::f32, {4});
  g.set_update("w", g.add(Op::mul, {w, g.constant(0.5)}));
  return g;
}

TEST(ToDtype, ScalarConstantsStayF32AndAttentionKeepsItsScale) {
  const Graph g = to_dtype(attention_with_update(), DType::f16);
  for (const Node& n : g.nodes()) {
    if (n.op == Op::constant) {
      EXPECT_EQ(n.dtype, DType::f32) << "a scalar takes the tensors' dtype where it is used, as a Python scalar";
    }
    if (n.op == Op::input) {
      EXPECT_EQ(n.dtype, DType::f16) << n.name;
    }
    EXPECT_NE(n.op, Op::cast) << "nothing here is made in f32 but scalars";
  }
  EXPECT_EQ(g.node(g.output("out")).dtype, DType::f16);
  // Fused, the scale is the attention's attribute, not a modifier multiplying by a tensor.
  const Graph fused = fuse_attention(g, [](const Node&) { return true; });
  bool attention = false;
  for (const Node& n : fused.nodes())
    if (n.op == Op::attention) {
      attention = true;
      EXPECT_EQ(n.attrs.scale, 0.125);
    }
  EXPECT_TRUE(attention) << print(fused);
}

TEST(EmulateHalfPrecision, KeptInputsAreCastWhereTheyEnterAndUpdatesCastBack) {
  const Graph g = to_dtype(attention_with_update(), DType::bf16);
  const Graph widened = emulate_half_precision(g);
  for (ValueId v : widened.inputs()) EXPECT_EQ(widened.node(v).dtype, DType::f32) << widened.node(v).name;
  const Graph kept = emulate_half_precision(g, HalfInputs::kept);
  verify(kept);
  for (ValueId v : kept.inputs()) EXPECT_EQ(kept.node(v).dtype, DType::bf16) << kept.node(v).name;
  for (const Node& n : kept.nodes())
    if (n.op == Op::cast && kept.node(n.inputs[0]).op == Op::input) {
      EXPECT_EQ(n.dtype, DType::f32);
    }
  // w's update: w * 0.5 computed in f32 and cast to the held bf16 (the cast rounds it, so no
  // round_bf16 before it); the output likewise.
  for (const ValueId v : {kept.updates().at(0).second, kept.output("out")}) {
    const Node& stored = kept.node(v);
    EXPECT_EQ(stored.op, Op::cast);
    EXPECT_EQ(stored.dtype, DType::bf16);
    EXPECT_EQ(kept.node(stored.inputs[0]).dtype, DType::f32);
    EXPECT_NE(kept.node(stored.inputs[0]).op, Op::round_bf16);
  }
  EXPECT_EQ(kept.node(kept.node(kept.updates().at(0).second).inputs[0]).op, Op::mul);
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
  auto plan = plan_memory(
      g, std::vector<std::int64_t>(g.size(), 1024), [](const Node&) { return false; }, 64);
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
