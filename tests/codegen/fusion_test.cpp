// Kernel fusion (codegen::plan_kernels): which nodes share a kernel, what each kernel reads, and
// the fused shader's source; the numbers on a device are tests/backends/vulkan_fusion_test.cpp's.
#include <gtest/gtest.h>

#include <algorithm>

#include "codegen/fusion.hpp"
#include "codegen/spirv.hpp"
#include "codegen/storage_plan.hpp"
#include "ir/bind.hpp"

namespace qkv::codegen {
namespace {

using ir::Graph;
using ir::Op;
using ir::ValueId;

/// tanh((x + b) * 0.5) - x over x [B, N, 16] and b [16].
struct Chain {
  Graph g;
  ValueId x, b, sum, half, scaled, squashed, out;
  Chain() {
    const ir::Dim bd = g.symbol("B"), n = g.symbol("N");
    x = g.add_input("x", DType::f32, {bd, n, 16});
    b = g.add_input("b", DType::f32, {16});
    sum = g.add(Op::add, {x, b});
    half = g.constant(0.5);
    scaled = g.add(Op::mul, {sum, half});
    squashed = g.add(Op::tanh, {scaled});
    out = g.add(Op::sub, {squashed, x});
    g.set_output("out", out);
  }
};

TEST(Fusion, AnElementwiseChainIsOneKernelReadingItsInputsOnce) {
  Chain c;
  const auto plan = plan_kernels(c.g, plan_storage(c.g));
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].root, c.out);
  EXPECT_EQ(plan[0].inlined, (std::vector<ValueId>{c.sum, c.half, c.scaled, c.squashed}));
  EXPECT_EQ(plan[0].operands, (std::vector<ValueId>{c.x, c.b}));
  const KernelSource k = fused_source(c.g, plan_storage(c.g), plan[0]);
  EXPECT_EQ(k.name, "fused_add_mul_tanh_sub_r3");
  EXPECT_EQ(k.buffers, 3);
  EXPECT_NE(k.glsl.find("float qkv_tanh(float x)"), std::string::npos) << k.glsl;  // the accurate tanh, as unfused
  // The constant a push constant of its own, declared after the elements, dims and strides
  // (1 + 3 + 2 x 3 words), as the launch packs it.
  EXPECT_NE(k.glsl.find("  float c0;"), std::string::npos) << k.glsl;
  EXPECT_NE(k.glsl.find("pc.c0"), std::string::npos) << k.glsl;
  EXPECT_NE(k.glsl.find("// computes %2 add, %3 constant, %4 mul, %5 tanh, %6 sub"), std::string::npos) << k.glsl;
  EXPECT_NO_THROW(compile_spirv(k.name, k.glsl));
  // Launch: elements, dims, x's strides, b's (broadcast: 0 along B and N), the constant's bits.
  const auto shapes = ir::bind_shapes(c.g, {{"x", Tensor(DType::f32, {2, 3, 16})}, {"b", Tensor(DType::f32, {16})}});
  const KernelLaunch l = fused_launch(c.g, plan_storage(c.g), plan[0], shapes);
  EXPECT_EQ(l.push, (std::vector<std::uint32_t>{96, 2, 3, 16, 48, 16, 1, 0, 0, 1, 0x3f000000u}));
}

/// A result keeps its kernel; an elementwise node two kernels read is recomputed in both.
TEST(Fusion, ResultsKeepTheirKernelsAndSharedNodesAreRecomputed) {
  Graph g;
  const ir::Dim n = g.symbol("N");
  const ValueId x = g.add_input("x", DType::f32, {n, 8});
  const ValueId e = g.add(Op::exp, {x});  // read by two kernels
  const ValueId a = g.add(Op::add, {e, x});
  const ValueId m = g.add(Op::mul, {e, x});
  const ValueId r = g.add(Op::neg, {a});  // a result, also read by s
  const ValueId s = g.add(Op::sqrt, {r});
  const ValueId t = g.add(Op::reduce_sum, {m}, [] {
    ir::Attrs at;
    at.axis = 1;
    return at;
  }());
  g.set_output("r", r);
  g.set_output("s", s);
  g.set_output("t", t);
  const auto plan = plan_kernels(g, plan_storage(g));
  std::vector<ValueId> roots;
  for (const auto& k : plan) roots.push_back(k.root);
  EXPECT_EQ(roots, (std::vector<ValueId>{r, s, t}));
  EXPECT_EQ(plan[0].inlined, (std::vector<ValueId>{e, a}));
  EXPECT_EQ(plan[1].inlined, (std::vector<ValueId>{}));  // r is stored: a result
  EXPECT_EQ(plan[2].inlined, (std::vector<ValueId>{e, m}));
}

/// A node that some reader cannot compute (a matmul's operand, a view's) is stored, and the
/// kernels that could have recomputed it read it instead.
TEST(Fusion, ANodeAReaderCannotComputeIsStored) {
  Graph g;
  const ir::Dim n = g.symbol("N");
  const ValueId x = g.add_input("x", DType::f32, {n, 8});
  const ValueId w = g.add_input("w", DType::f32, {8, 8});
  const ValueId h = g.add(Op::tanh, {x});
  const ValueId y = g.add(Op::sqrt, {h});       // could recompute h
  const ValueId z = g.add(Op::matmul, {h, w});  // cannot: loads h from memory
  g.set_output("y", y);
  g.set_output("z", z);
  const auto plan = plan_kernels(g, plan_storage(g));
  ASSERT_EQ(plan.size(), 3u);
  EXPECT_EQ(plan[0].root, h);
  EXPECT_EQ(plan[1].root, y);
  EXPECT_FALSE(plan[1].fused());
  EXPECT_EQ(plan[2].root, z);
}

/// A layer norm written by hand is one row kernel: it computes each row's mean, then its
/// variance (x - mean recomputed per element, never stored), then the row's normalised
/// elements. When the variance is also a result it is stored, and so are the sums it reads
/// (a row kernel's reductions feed only its own elements): four kernels.
TEST(Fusion, ALayerNormIsOneRowKernel) {
  Graph g;
  const ir::Dim n = g.symbol("N");
  const ValueId x = g.add_input("x", DType::f32, {n, 8});
  ir::Attrs axis;
  axis.axis = 1;
  axis.keepdim = true;
  const ValueId inv = g.constant(0.125);
  const ValueId mean_sum = g.add(Op::reduce_sum, {x}, axis);
  const ValueId mean = g.add(Op::mul, {mean_sum, inv});
  const ValueId d = g.add(Op::sub, {x, mean});
  const ValueId var_sum = g.add(Op::reduce_sum, {g.add(Op::mul, {d, d})}, axis);
  const ValueId var = g.add(Op::mul, {var_sum, inv});
  const ValueId y = g.add(Op::div, {d, g.add(Op::sqrt, {g.add(Op::add, {var, g.constant(1e-5)})})});
  g.set_output("y", y);
  const auto plan = plan_kernels(g, plan_storage(g));
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].root, y);
  for (ValueId inside : {mean_sum, d, var_sum})
    EXPECT_NE(std::find(plan[0].inlined.begin(), plan[0].inlined.end(), inside), plan[0].inlined.end()) << "%" << inside;
  const KernelSource src = fused_source(g, plan_storage(g), plan[0]);
  EXPECT_NE(src.glsl.find("float r" + std::to_string(mean_sum) + ";"), std::string::npos) << src.glsl;
  EXPECT_NO_THROW(compile_spirv(src.name, src.glsl));

  g.set_output("var", var);
  const auto two = plan_kernels(g, plan_storage(g));
  ASSERT_EQ(two.size(), 4u);
  EXPECT_EQ(two[0].root, mean_sum);
  EXPECT_EQ(two[1].root, var_sum);
  EXPECT_EQ(two[2].root, var);
  EXPECT_EQ(two[3].root, y);
  for (const auto& k : two) EXPECT_NO_THROW(compile_spirv(fused_source(g, plan_storage(g), k).name, fused_source(g, plan_storage(g), k).glsl));
}

/// exp(b) of shape [8] broadcast into [N, 8] is recomputed per element in add's kernel: the
/// kernel reads b, not a stored exp(b).
TEST(Fusion, AValueOfASmallerShapeIsRecomputedPerElement) {
  Graph g;
  const ir::Dim n = g.symbol("N");
  const ValueId x = g.add_input("x", DType::f32, {n, 8});
  const ValueId b = g.add_input("b", DType::f32, {8});
  const ValueId eb = g.add(Op::exp, {b});
  const ValueId y = g.add(Op::add, {x, eb});
  g.set_output("y", y);
  const auto plan = plan_kernels(g, plan_storage(g));
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].root, y);
  EXPECT_EQ(plan[0].inlined, (std::vector<ValueId>{eb}));
  EXPECT_EQ(plan[0].operands, (std::vector<ValueId>{b, x}));  // in the order the chain reads them
  const KernelSource k = fused_source(g, plan_storage(g), plan[0]);
  EXPECT_NO_THROW(compile_spirv(k.name, k.glsl));
}

/// A matmul is the core of its epilogue's kernel: (x @ w) * 0.5 + bias, tanh, + residual is one
/// kernel reading x, w (the matmul's A and B first), bias and the residual; its push words are
/// the matmul's, then each epilogue operand's broadcast strides, then the constants.
TEST(Fusion, AMatmulAbsorbsItsEpilogue) {
  Graph g;
  const ir::Dim n = g.symbol("N");
  const ValueId x = g.add_input("x", DType::f32, {2, n, 16});
  const ValueId w = g.add_input("w", DType::f32, {16, 8});
  const ValueId bias = g.add_input("bias", DType::f32, {8});
  const ValueId res = g.add_input("res", DType::f32, {2, n, 8});
  const ValueId mm = g.add(Op::matmul, {x, w});
  const ValueId half = g.constant(0.5);
  const ValueId scaled = g.add(Op::mul, {mm, half});
  const ValueId biased = g.add(Op::add, {scaled, bias});
  const ValueId act = g.add(Op::tanh, {biased});
  const ValueId y = g.add(Op::add, {act, res});
  g.set_output("y", y);
  const auto plan = plan_kernels(g, plan_storage(g));
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].root, y);
  EXPECT_EQ(plan[0].inlined, (std::vector<ValueId>{mm, half, scaled, biased, act}));
  EXPECT_EQ(plan[0].operands, (std::vector<ValueId>{x, w, bias, res}));
  EXPECT_TRUE(specialized(g, plan[0]));
  const KernelSource k = fused_source(g, plan_storage(g), plan[0]);
  EXPECT_NE(k.glsl.find("qkv_epilogue"), std::string::npos) << k.glsl;
  EXPECT_NO_THROW(compile_spirv(k.name, k.glsl));
  const auto shapes = ir::bind_shapes(g, {{"x", Tensor(DType::f32, {2, 5, 16})},
                                          {"w", Tensor(DType::f32, {16, 8})},
                                          {"bias", Tensor(DType::f32, {8})},
                                          {"res", Tensor(DType::f32, {2, 5, 8})}});
  const KernelLaunch l = fused_launch(g, plan_storage(g), plan[0], shapes);
  ASSERT_GE(l.push.size(), 5u);
  // bias: batch stride 0, row stride 0, column stride 1; res: 40, 8, 1; then 0.5.
  const std::vector<std::uint32_t> tail(l.push.end() - 7, l.push.end());
  EXPECT_EQ(tail, (std::vector<std::uint32_t>{0, 0, 1, 40, 8, 1, 0x3f000000u}));
}

/// The lanes kernel (CPU devices) unrolls its tile over the subgroup's size: past 256 stores its
/// epilogue, which glslang inlines where it is called, is called once in a loop over the tile (at
/// subgroups of 16, 512 copies of a GELU's gradient overflowed the stack of the SPIR-V
/// optimizer), and every kernel compiles at every subgroup size.
TEST(Fusion, TheLanesKernelCallsItsEpilogueOnceAtEverySubgroupSize) {
  Graph g;
  const ir::Dim n = g.symbol("N");
  const ValueId x = g.add_input("x", DType::f32, {2, n, 64});
  const ValueId w = g.add_input("w", DType::f32, {64, 64});
  const ValueId mm = g.add(Op::matmul, {x, w});
  // GELU's gradient: 0.5 (1 + erf(t / sqrt 2)) + t exp(-t^2 / 2) / sqrt(2 pi), times dy.
  const ValueId cdf =
      g.add(Op::mul, {g.add(Op::add, {g.add(Op::erf, {g.add(Op::mul, {mm, g.constant(0.7071)})}), g.constant(1.0)}), g.constant(0.5)});
  const ValueId pdf =
      g.add(Op::mul, {g.add(Op::exp, {g.add(Op::neg, {g.add(Op::mul, {g.add(Op::mul, {mm, mm}), g.constant(0.5)})})}), g.constant(0.3989)});
  const ValueId y = g.add(Op::mul, {g.add(Op::add, {cdf, g.add(Op::mul, {mm, pdf})}), g.add_input("dy", DType::f32, {2, n, 64})});
  g.set_output("y", y);
  const auto plan = plan_kernels(g, plan_storage(g));
  ASSERT_EQ(plan.size(), 1u);
  for (std::uint32_t sg : {4u, 8u, 16u, 32u, 64u}) {
    SCOPED_TRACE(sg);
    Target t;
    t.cpu_device = true;
    t.subgroup_size = sg;
    const KernelSource k = fused_source(g, plan_storage(g), plan[0], t);
    // Past 32 lanes the tiled kernel (the unrolled tile overflowed the optimizer even so).
    EXPECT_NE(k.name.find(sg <= 32 ? "matmul_lanes" + std::to_string(sg) : std::string("fused_matmul_mul")), std::string::npos) << k.name;
    const std::string body = k.glsl.substr(k.glsl.find("void main()"));
    std::size_t calls = 0;
    for (std::size_t at = body.find("qkv_epilogue("); at != std::string::npos; at = body.find("qkv_epilogue(", at + 1)) ++calls;
    EXPECT_EQ(calls, sg <= 8 ? 32u * sg : 1u) << body;  // unrolled over 4 sg rows by 8 columns up to 256 stores
    EXPECT_NO_THROW(compile_spirv(k.name, k.glsl));
  }
}

/// A matmul whose result is read elsewhere, or whose consumer has another shape, keeps its
/// own store.
TEST(Fusion, AMatmulReadElsewhereIsStored) {
  Graph g;
  const ir::Dim n = g.symbol("N");
  const ValueId x = g.add_input("x", DType::f32, {n, 16});
  const ValueId w = g.add_input("w", DType::f32, {16, 8});
  const ValueId mm = g.add(Op::matmul, {x, w});
  const ValueId t = g.add(Op::tanh, {mm});
  g.set_output("mm", mm);
  g.set_output("t", t);
  const auto plan = plan_kernels(g, plan_storage(g));
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].root, mm);
  EXPECT_EQ(plan[1].root, t);
  EXPECT_FALSE(plan[1].fused());
}

/// A value the epilogue reads that is also the matmul's operand is stored: the matmul loads
/// its operands from memory (x + x @ w, a residual around a projection).
TEST(Fusion, AMatmulsOperandIsStoredEvenWhenItsEpilogueReadsIt) {
  Graph g;
  const ir::Dim n = g.symbol("N");
  const ValueId x = g.add_input("x", DType::f32, {n, 8});
  const ValueId w = g.add_input("w", DType::f32, {8, 8});
  const ValueId h = g.add(Op::tanh, {x});
  const ValueId y = g.add(Op::add, {g.add(Op::matmul, {h, w}), h});
  g.set_output("y", y);
  const auto plan = plan_kernels(g, plan_storage(g));
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].root, h);
  EXPECT_EQ(plan[1].root, y);
  EXPECT_EQ(plan[1].operands, (std::vector<ValueId>{h, w, h}));  // A, B, then the epilogue's own read of h
  EXPECT_NO_THROW(compile_spirv(fused_source(g, plan_storage(g), plan[1]).name, fused_source(g, plan_storage(g), plan[1]).glsl));
}

/// With subgroup arithmetic a reduction gives each row a subgroup where rows are at least a
/// subgroup long: the fused and the unfused kernels compile, combine lanes with subgroupAdd /
/// subgroupMax, and launch a workgroup per 256 / subgroup-size rows (mode word 1); shorter rows
/// take an invocation each (mode 0).
TEST(Fusion, SubgroupReductionsCompileAndCoverEveryRow) {
  Graph g;
  const ir::Dim n = g.symbol("N");
  const ValueId x = g.add_input("x", DType::f32, {n, 8});
  ir::Attrs axis;
  axis.axis = 1;
  const ValueId e = g.add(Op::exp, {x});
  g.set_output("s", g.add(Op::reduce_sum, {e}, axis));
  g.set_output("m", g.add(Op::reduce_max, {x}, axis));
  g.set_output("p", g.add(Op::softmax, {e}, axis));
  g.set_output("e", e);
  Target t;
  t.cpu_device = false;
  t.subgroup_size = 8;
  t.subgroup_reductions = true;
  const auto shapes = ir::bind_shapes(g, {{"x", Tensor(DType::f32, {37, 8})}});
  for (const auto& k : plan_kernels(g, plan_storage(g))) {
    const ir::Node& root = g.node(k.root);
    if (root.op == Op::exp) continue;
    const KernelSource src = k.fused() ? fused_source(g, plan_storage(g), k, t) : kernel_source(g, plan_storage(g), k.root, t);
    SCOPED_TRACE(src.name);
    EXPECT_NE(src.glsl.find(root.op == Op::reduce_sum ? "subgroupAdd(" : "subgroupMax("), std::string::npos) << src.glsl;
    EXPECT_NO_THROW(compile_spirv(src.name, src.glsl));
    const KernelLaunch l = k.fused() ? fused_launch(g, plan_storage(g), k, shapes, t) : kernel_launch(g, plan_storage(g), k.root, shapes, t);
    EXPECT_EQ(l.groups[0] * l.groups[1], 2u) << "37 rows, 32 per workgroup of 256";
    EXPECT_EQ(l.push[3], 1u);
    Target wide = t;
    wide.subgroup_size = 16;  // rows of 8: an invocation each
    const KernelLaunch short_rows =
        k.fused() ? fused_launch(g, plan_storage(g), k, shapes, wide) : kernel_launch(g, plan_storage(g), k.root, shapes, wide);
    EXPECT_EQ(short_rows.push[3], 0u);
    EXPECT_EQ(short_rows.groups[0] * short_rows.groups[1], 1u);
    Target lavapipe = t;
    lavapipe.cpu_device = true;  // an invocation per row, without subgroup operations
    const KernelSource plain = k.fused() ? fused_source(g, plan_storage(g), k, lavapipe) : kernel_source(g, plan_storage(g), k.root, lavapipe);
    EXPECT_EQ(plain.glsl.find("GL_KHR_shader_subgroup"), std::string::npos);
    EXPECT_EQ(plain.glsl.find("subgroupAdd"), std::string::npos);
  }
}

/// A slice whose elements are contiguous in its operand is read in place at an aligned offset:
/// rows of a matrix (or of a [1, R, C] tensor), not columns, not where the offset is unaligned
/// or an inner dim is named.
TEST(Fusion, ContiguousAlignedSlicesAreViews) {
  Graph g;
  const ir::Dim n = g.symbol("N");
  const ValueId w = g.add_input("w", DType::f32, {96, 32});
  const ValueId c = g.add_input("c", DType::f32, {1, 6, 8});
  const ValueId x = g.add_input("x", DType::f32, {4, n});
  auto slice = [&](ValueId v, int axis, std::int64_t begin, std::int64_t end) {
    ir::Attrs a;
    a.axis = axis;
    a.begin = begin;
    a.end = end;
    return g.add(Op::slice, {v}, a);
  };
  const ValueId rows = slice(w, 0, 32, 64), cols = slice(w, 1, 0, 16), inner = slice(c, 1, 2, 4), odd = slice(c, 1, 1, 2), named = slice(x, 0, 2, 4);
  // The byte offset of each slice that is a view at this alignment, or nullopt.
  auto view_offset = [&](ValueId v, std::int64_t alignment) -> std::optional<std::int64_t> {
    const ir::ValueStorage s = plan_storage(g, alignment)[v];
    if (s.kind != ir::StorageKind::slice) return std::nullopt;
    EXPECT_EQ(s.of, g.node(v).inputs[0]);
    return s.offset;
  };
  EXPECT_EQ(view_offset(rows, 64), 32 * 32 * 4);
  EXPECT_EQ(view_offset(cols, 64), std::nullopt);
  EXPECT_EQ(view_offset(inner, 64), 2 * 8 * 4);
  EXPECT_EQ(view_offset(odd, 64), std::nullopt);  // 32 bytes in
  EXPECT_EQ(view_offset(odd, 16), 32);
  EXPECT_EQ(view_offset(named, 16), std::nullopt);
  EXPECT_EQ(view_offset(rows, 0), std::nullopt);
  for (ValueId v : {rows, cols, inner, odd, named}) g.set_output("s" + std::to_string(v), v);
  std::vector<ValueId> roots;
  for (const auto& k : plan_kernels(g, plan_storage(g, 64))) roots.push_back(k.root);
  EXPECT_EQ(roots, (std::vector<ValueId>{cols, odd, named}));
  EXPECT_EQ(plan_kernels(g, plan_storage(g)).size(), 5u) << "without an alignment every slice is copied";
}

/// A reduction reads its input through the chain that computes it: sum((x - b)^2) and
/// softmax(x * 0.5) are one kernel each.
TEST(Fusion, AReductionComputesTheChainItReads) {
  Graph g;
  const ir::Dim n = g.symbol("N");
  const ValueId x = g.add_input("x", DType::f32, {n, 8});
  const ValueId b = g.add_input("b", DType::f32, {8});
  const ValueId d = g.add(Op::sub, {x, b});
  const ValueId sq = g.add(Op::mul, {d, d});
  ir::Attrs axis;
  axis.axis = 1;
  const ValueId sum = g.add(Op::reduce_sum, {sq}, axis);
  const ValueId half = g.constant(0.5);
  const ValueId p = g.add(Op::softmax, {g.add(Op::mul, {x, half})}, axis);
  g.set_output("sum", sum);
  g.set_output("p", p);
  const auto plan = plan_kernels(g, plan_storage(g));
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].root, sum);
  EXPECT_EQ(plan[0].inlined, (std::vector<ValueId>{d, sq}));
  EXPECT_EQ(plan[0].operands, (std::vector<ValueId>{x, b}));
  EXPECT_EQ(plan[1].root, p);
  const KernelSource k = fused_source(g, plan_storage(g), plan[0]);
  EXPECT_EQ(k.name, "fused_sub_mul_reduce_sum_r2");
  EXPECT_NE(k.glsl.find("acc += qkv_chain(base + k * inner);"), std::string::npos) << k.glsl;
  EXPECT_NO_THROW(compile_spirv(k.name, k.glsl));
  const KernelSource soft = fused_source(g, plan_storage(g), plan[1]);
  EXPECT_EQ(soft.name, "fused_mul_softmax_r2");
  EXPECT_NO_THROW(compile_spirv(soft.name, soft.glsl));
  // The reduction's four words, the input's dims (5, 8), x's and b's strides, no constants.
  const auto shapes = ir::bind_shapes(g, {{"x", Tensor(DType::f32, {5, 8})}, {"b", Tensor(DType::f32, {8})}});
  EXPECT_EQ(fused_launch(g, plan_storage(g), plan[0], shapes).push, (std::vector<std::uint32_t>{5, 8, 1, 0, 5, 8, 8, 1, 0, 1}));
}

/// A sum of 20 inputs: each kernel binds at most the limit's buffers, so the chain splits.
TEST(Fusion, KernelsKeepTheDevicesBufferLimit) {
  Graph g;
  const ir::Dim n = g.symbol("N");
  ValueId acc = g.add_input("x0", DType::f32, {n});
  for (int i = 1; i < 20; ++i) acc = g.add(Op::add, {acc, g.add_input("x" + std::to_string(i), DType::f32, {n})});
  g.set_output("sum", acc);
  FusionLimits limits;
  limits.storage_buffers = 8;
  const auto plan = plan_kernels(g, plan_storage(g), limits);
  EXPECT_EQ(plan.size(), 4u);  // 6 adds per kernel (6 new inputs and the sum before them), and the first
  for (const auto& k : plan) EXPECT_LE(static_cast<int>(k.operands.size()) + 1, 8);
  EXPECT_EQ(unfused_kernels(g, plan_storage(g)).size(), 19u);
}

}  // namespace
}  // namespace qkv::codegen
