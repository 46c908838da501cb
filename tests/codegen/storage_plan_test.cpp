// The Vulkan kernels' storage plan (codegen::plan_storage) and the record every backend reads
// (ir::StoragePlan): each kind of storage, reached by the graph that makes it, and the plan's own
// checks refusing a sabotaged plan. Run on a device: tests/backends/vulkan_fusion_test.cpp.
#include <gtest/gtest.h>

#include "codegen/storage_plan.hpp"
#include "ir/error.hpp"

namespace qkv::codegen {
namespace {

using ir::Graph;
using ir::Op;
using ir::StorageKind;
using ir::ValueId;

/// One graph with a value of every kind of storage the Vulkan kernels plan.
struct EveryKind {
  Graph g;
  ValueId heads_in, q, attention, placed, half_in, half_view, narrowed_source, narrowed, softmax, exact_round, weight, slice, a, b, concat, cache,
      update;
  EveryKind() {
    ir::Attrs heads;
    heads.perm = {0, 2, 1, 3};
    // Heads: [1, 8, 2, 4] projections read as [1, 2, 8, 4] by the flash kernel, and its output
    // written back as [1, 8, 2, 4].
    heads_in = g.add_input("x", DType::f32, {1, 8, 2, 4});
    q = g.add(Op::permute, {heads_in}, heads);
    ir::Attrs scale;
    scale.scale = 0.5;
    attention = g.add(Op::attention, {q, q, q}, scale);
    placed = g.add(Op::permute, {attention}, heads);
    g.set_output("heads", placed);
    // 16-bit storage: an f16 input widened where exp reads it, exp's value rounded into its cast.
    half_in = g.add_input("h", DType::f16, {4, 16});
    half_view = g.cast(half_in, DType::f32);
    narrowed_source = g.add(Op::exp, {half_view});
    narrowed = g.cast(narrowed_source, DType::f16);
    g.set_output("narrowed", narrowed);
    // A softmax whose kernel stores its values rounded: its round is a view.
    ir::Attrs last;
    last.axis = 1;
    softmax = g.add(Op::softmax, {half_view}, last);
    exact_round = g.add(Op::round_f16, {softmax});
    g.set_output("rounded", exact_round);
    // Rows 32..63 of a weight, 4096 bytes in.
    weight = g.add_input("w", DType::f32, {96, 32});
    ir::Attrs rows;
    rows.axis = 0;
    rows.begin = 32;
    rows.end = 64;
    slice = g.add(Op::slice, {weight}, rows);
    g.set_output("slice", slice);
    // Two kernels' results written into their concat.
    a = g.add(Op::tanh, {weight});
    b = g.add(Op::sin, {weight});
    concat = g.add(Op::concat, {a, b}, ir::Attrs{});
    g.set_output("concat", concat);
    // A cache updated in place with its new rows.
    cache = g.add_input("cache", DType::f32, {1, 16, 4});
    const ValueId fresh = g.add_input("fresh", DType::f32, {1, 2, 4});
    ir::Attrs at;
    at.axis = 1;
    update = g.add(Op::cache_write, {cache, fresh, g.add_input("at", DType::i32, {})}, at);
    g.set_update("cache", update);
  }
};

TEST(StoragePlan, EveryKindIsPlannedWhereItsGraphMakesIt) {
  const EveryKind e;
  const ir::StoragePlan plan = plan_storage(e.g, 64);
  auto expect = [&](ValueId v, StorageKind kind, ValueId of, std::int64_t offset = 0) {
    SCOPED_TRACE("%" + std::to_string(v) + " " + std::string(ir::storage_kind_name(kind)));
    EXPECT_EQ(plan[v].kind, kind);
    EXPECT_EQ(plan[v].of, of);
    EXPECT_EQ(plan[v].offset, offset);
  };
  expect(e.heads_in, StorageKind::input, -1);
  expect(e.q, StorageKind::head_view, e.heads_in);
  expect(e.attention, StorageKind::kernel, -1);
  EXPECT_EQ(plan[e.attention].into.into, e.placed);
  expect(e.placed, StorageKind::placed, e.attention);
  expect(e.half_view, StorageKind::half_view, e.half_in);
  EXPECT_EQ(plan.held(e.half_view), DType::f16);
  expect(e.narrowed_source, StorageKind::kernel, -1);
  EXPECT_EQ(plan[e.narrowed_source].into.into, e.narrowed);
  EXPECT_EQ(plan.held(e.narrowed_source), DType::f16) << "its kernel writes the cast's 16-bit storage";
  expect(e.narrowed, StorageKind::narrowed, e.narrowed_source);
  EXPECT_EQ(plan[e.softmax].rounded, DType::f16);
  expect(e.exact_round, StorageKind::exact_round, e.softmax);
  EXPECT_TRUE(plan[e.exact_round].f16_numbers);
  EXPECT_FALSE(plan[e.exact_round].bf16_numbers);
  expect(e.slice, StorageKind::slice, e.weight, 32 * 32 * 4);
  expect(e.concat, StorageKind::concat, e.a);
  EXPECT_EQ(plan[e.a].into.into, e.concat);
  EXPECT_EQ(plan[e.a].into.at, 0);
  EXPECT_EQ(plan[e.b].into.at, 96 * 32 * 4);
  expect(e.update, StorageKind::in_place, e.cache);
  EXPECT_TRUE(plan.has_kernel(e.update));

  // What plan_memory reads: the views' offsets into their operands, the values written into later ones.
  const std::vector<std::int64_t> views = plan.memory_views();
  EXPECT_EQ(views[static_cast<std::size_t>(e.slice)], 32 * 32 * 4);
  EXPECT_EQ(views[static_cast<std::size_t>(e.q)], 0);
  EXPECT_EQ(views[static_cast<std::size_t>(e.update)], 0);
  EXPECT_EQ(views[static_cast<std::size_t>(e.attention)], -1);
  EXPECT_EQ(plan.memory_placements()[static_cast<std::size_t>(e.b)].into, e.concat);

  // Every value without a kernel says why, in the words explain and dump print.
  EXPECT_EQ(ir::no_kernel_reason(e.g, plan, e.slice), "view of %" + std::to_string(e.weight) + " at byte 4096");
  EXPECT_EQ(ir::no_kernel_reason(e.g, plan, e.placed), "written in place by %" + std::to_string(e.attention) + "'s kernel through its strides");
  EXPECT_EQ(ir::no_kernel_reason(e.g, plan, e.exact_round),
            "view of %" + std::to_string(e.softmax) + ", whose kernel stores its values rounded to f16");
  EXPECT_EQ(ir::no_kernel_reason(e.g, plan, e.attention), "");
  const std::string text = ir::print_storage(e.g, plan);
  EXPECT_NE(text.find("%" + std::to_string(e.narrowed_source) + " = exp : f32[4,16]  held f16  kernel, written into %" + std::to_string(e.narrowed)),
            std::string::npos)
      << text;
}

/// Without an alignment no slice or concat lies in place; the rest of the plan is the same.
TEST(StoragePlan, WithoutAnAlignmentSlicesAndConcatsAreCopied) {
  const EveryKind e;
  const ir::StoragePlan plan = plan_storage(e.g, 0);
  EXPECT_EQ(plan[e.slice].kind, StorageKind::kernel);
  EXPECT_EQ(plan[e.concat].kind, StorageKind::kernel);
  EXPECT_EQ(plan[e.a].into.into, -1);
  EXPECT_EQ(plan[e.q].kind, StorageKind::head_view);
  EXPECT_EQ(plan[e.narrowed].kind, StorageKind::narrowed);
}

/// The plan's checks refuse a plan whose parts disagree: each sabotage names the value.
TEST(StoragePlan, ASabotagedPlanIsRefused) {
  const EveryKind e;
  const ir::StoragePlan good = plan_storage(e.g, 64);
  EXPECT_NO_THROW(ir::verify_storage(e.g, good));
  auto refused = [&](const char* what, auto&& sabotage, const std::string& message) {
    SCOPED_TRACE(what);
    ir::StoragePlan bad = good;
    sabotage(bad);
    try {
      ir::verify_storage(e.g, bad);
      ADD_FAILURE() << "accepted";
    } catch (const IrError& err) {
      EXPECT_NE(std::string(err.what()).find(message), std::string::npos) << err.what();
    }
  };
  const std::string placed = "%" + std::to_string(e.placed);
  refused(
      "a placed value nobody writes", [&](ir::StoragePlan& p) { p.values[static_cast<std::size_t>(e.attention)].into = {}; },
      placed + " permute (placed): %" + std::to_string(e.attention) + " does not write into it");
  refused(
      "a view of another value", [&](ir::StoragePlan& p) { p.values[static_cast<std::size_t>(e.q)].of = e.weight; },
      "reads or is written by its first operand");
  refused(
      "written into an earlier value",
      [&](ir::StoragePlan& p) {
        p.values[static_cast<std::size_t>(e.b)].into = {e.a, 0};
      },
      "not a later value");
  refused(
      "written into a value with its own storage",
      [&](ir::StoragePlan& p) {
        p.values[static_cast<std::size_t>(e.narrowed_source)].into = {e.softmax, 0};
      },
      "which has storage of its own");
  refused(
      "an input with a kernel", [&](ir::StoragePlan& p) { p.values[static_cast<std::size_t>(e.weight)].kind = StorageKind::kernel; },
      "inputs, and only inputs");
  refused(
      "a view with an offset", [&](ir::StoragePlan& p) { p.values[static_cast<std::size_t>(e.q)].offset = 64; }, "offset 64");
}

}  // namespace
}  // namespace qkv::codegen
