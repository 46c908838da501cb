// Kernel fusion (codegen::plan_kernels): which nodes share a kernel, what each kernel reads, and
// the fused shader's source; the numbers on a device are tests/backends/vulkan_fusion_test.cpp's.
#include <gtest/gtest.h>

#include <algorithm>

#include "codegen/fusion.hpp"
#include "codegen/spirv.hpp"
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
  const auto plan = plan_kernels(c.g);
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0].root, c.out);
  EXPECT_EQ(plan[0].inlined, (std::vector<ValueId>{c.sum, c.half, c.scaled, c.squashed}));
  EXPECT_EQ(plan[0].operands, (std::vector<ValueId>{c.x, c.b}));
  const KernelSource k = fused_source(c.g, plan[0]);
  EXPECT_EQ(k.name, "fused_add_mul_tanh_sub_r3");
  EXPECT_EQ(k.buffers, 3);
  EXPECT_NE(k.glsl.find("float qkv_tanh(float x)"), std::string::npos) << k.glsl;  // the accurate tanh, as unfused
  EXPECT_NE(k.glsl.find("uintBitsToFloat(pc.p[10])"), std::string::npos) << k.glsl;  // the constant after 1 + 3 + 2 x 3 words
  EXPECT_NE(k.glsl.find("// computes %2 add, %3 constant, %4 mul, %5 tanh, %6 sub"), std::string::npos) << k.glsl;
  EXPECT_NO_THROW(compile_spirv(k.name, k.glsl));
  // Launch: elements, dims, x's strides, b's (broadcast: 0 along B and N), the constant's bits.
  const auto shapes = ir::bind_shapes(c.g, {{"x", Tensor(DType::f32, {2, 3, 16})}, {"b", Tensor(DType::f32, {16})}});
  const KernelLaunch l = fused_launch(c.g, plan[0], shapes);
  EXPECT_EQ(l.push, (std::vector<std::uint32_t>{96, 2, 3, 16, 48, 16, 1, 0, 0, 1, 0x3f000000u}));
}

TEST(Fusion, NodesReadElsewhereOrReturnedKeepTheirKernels) {
  Graph g;
  const ir::Dim n = g.symbol("N");
  const ValueId x = g.add_input("x", DType::f32, {n, 8});
  const ValueId e = g.add(Op::exp, {x});          // read by two kernels
  const ValueId a = g.add(Op::add, {e, x});
  const ValueId m = g.add(Op::mul, {e, x});
  const ValueId r = g.add(Op::neg, {a});          // a result, also read by s
  const ValueId s = g.add(Op::sqrt, {r});
  const ValueId t = g.add(Op::reduce_sum, {m}, [] { ir::Attrs at; at.axis = 1; return at; }());
  g.set_output("r", r);
  g.set_output("s", s);
  g.set_output("t", t);
  std::vector<ValueId> roots;
  for (const auto& k : plan_kernels(g)) roots.push_back(k.root);
  // a is computed in r's kernel and m in the reduction's; e is stored (two kernels read it), and
  // so is r (a result, also read by s).
  EXPECT_EQ(roots, (std::vector<ValueId>{e, r, s, t}));
  EXPECT_EQ(plan_kernels(g)[1].inlined, (std::vector<ValueId>{a}));
  EXPECT_EQ(plan_kernels(g)[3].inlined, (std::vector<ValueId>{m}));
}

TEST(Fusion, AValueOfAnotherShapeIsReadNotInlined) {
  Graph g;
  const ir::Dim n = g.symbol("N");
  const ValueId x = g.add_input("x", DType::f32, {n, 8});
  const ValueId b = g.add_input("b", DType::f32, {8});
  const ValueId eb = g.add(Op::exp, {b});  // [8], broadcast into [N, 8]
  const ValueId y = g.add(Op::add, {x, eb});
  g.set_output("y", y);
  const auto plan = plan_kernels(g);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[1].operands, (std::vector<ValueId>{x, eb}));
  EXPECT_FALSE(plan[1].fused());
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
  const auto plan = plan_kernels(g);
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_EQ(plan[0].root, sum);
  EXPECT_EQ(plan[0].inlined, (std::vector<ValueId>{d, sq}));
  EXPECT_EQ(plan[0].operands, (std::vector<ValueId>{x, b}));
  EXPECT_EQ(plan[1].root, p);
  const KernelSource k = fused_source(g, plan[0]);
  EXPECT_EQ(k.name, "fused_sub_mul_reduce_sum_r2");
  EXPECT_NE(k.glsl.find("acc += qkv_chain(base + k * inner);"), std::string::npos) << k.glsl;
  EXPECT_NO_THROW(compile_spirv(k.name, k.glsl));
  const KernelSource soft = fused_source(g, plan[1]);
  EXPECT_EQ(soft.name, "fused_mul_softmax_r2");
  EXPECT_NO_THROW(compile_spirv(soft.name, soft.glsl));
  // The reduction's three words, the input's dims (5, 8), x's and b's strides, no constants.
  const auto shapes = ir::bind_shapes(g, {{"x", Tensor(DType::f32, {5, 8})}, {"b", Tensor(DType::f32, {8})}});
  EXPECT_EQ(fused_launch(g, plan[0], shapes).push, (std::vector<std::uint32_t>{5, 8, 1, 5, 8, 8, 1, 0, 1}));
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
  const auto plan = plan_kernels(g, limits);
  EXPECT_EQ(plan.size(), 4u);  // 6 adds per kernel (6 new inputs and the sum before them), and the first
  for (const auto& k : plan) EXPECT_LE(static_cast<int>(k.operands.size()) + 1, 8);
  EXPECT_EQ(unfused_kernels(g).size(), 19u);
}

}  // namespace
}  // namespace qkv::codegen
