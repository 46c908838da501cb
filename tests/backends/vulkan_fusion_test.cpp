// Kernel fusion on the device: fused kernels give the reference's numbers (broadcast operands,
// inlined constants, chains split by the buffer limit, forward and backward), the kernels of a
// known graph are counted, and random graphs still match with fusion off.
#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>

#include "backends/vulkan/vulkan_backend.hpp"
#include "dsl/dsl.hpp"
#include "ir/passes/passes.hpp"
#include "ir/printer.hpp"
#include "sweeps/random_graph.hpp"
#include "tests/support/backend_fixture.hpp"
#include "tests/support/gradcheck.hpp"

namespace qkv {
namespace {

std::unique_ptr<backend::Backend> vulkan_fusing(bool fuse) {
  auto options = backend::vulkan_options_from_env();
  options.fusion = fuse;
  return backend::make_vulkan_backend(options);
}

/// Kernels the backend would launch for g, from its kernel names (an inlined node has none).
int kernels(const backend::Backend& b, const ir::Graph& lowered) {
  int count = 0;
  for (std::size_t i = 0; i < lowered.size(); ++i) count += b.kernel_name(lowered, static_cast<ir::ValueId>(i)).starts_with("glsl ");
  return count;
}

/// A pre-norm block's elementwise tail: layer norm by hand, GELU (tanh form) and a residual,
/// forward and backward: long chains with broadcast gains, biases and constants.
TEST(VulkanFusion, FusedChainsMatchTheReferenceForwardAndBackward) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  auto x = input<"x">(dim<"B">, dim<"N">, dim<24>);
  auto gain = input<"gain">(dim<24>);
  auto bias = input<"bias">(dim<24>);
  auto centred = x - mean<2>(x);
  auto normed = centred / sqrt(mean<2>(centred * centred) + 1e-5) * gain + bias;
  auto gelu = normed * 0.5 * (tanh((normed + normed * normed * normed * 0.044715) * 0.7978845608) + 1.0);
  const ir::Graph forward = lower(named<"loss">(sum_all((gelu + x) * (gelu + x))));
  const ir::Graph g = ir::build_backward(forward, {"loss", {"x", "gain", "bias"}, {}});
  const auto in = backend::random_inputs(g, {{"B", 3}, {"N", 37}}, 11);
  testing::expect_equivalent(g, in, *vulkan);
  auto fused = vulkan->compile(g), unfused = vulkan_fusing(false)->compile(g);
  EXPECT_LT(kernels(*vulkan, fused->graph()), kernels(*vulkan_fusing(false), unfused->graph()) * 2 / 3)
      << "fusion should remove at least a third of this graph's kernels";
  const auto a = fused->run(in), b = unfused->run(in);
  EXPECT_NEAR(a.at("loss").at(0), b.at("loss").at(0), 1e-3 * std::abs(b.at("loss").at(0)));
}

/// x * w + b -> tanh -> * 2 is one kernel: the matmul stores through its epilogue.
TEST(VulkanFusion, CountsTheKernelsOfAKnownGraph) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  auto x = input<"x">(dim<"N">, dim<16>);
  auto w = input<"w">(dim<16>, dim<8>);
  auto b = input<"b">(dim<8>);
  const ir::Graph g = lower(named<"y">(tanh(matmul(x, w) + b) * 2.0));
  auto exe = vulkan->compile(g);
  EXPECT_EQ(kernels(*vulkan, exe->graph()), 1);  // the matmul with add-tanh-mul (the constant inlined) in its store
  EXPECT_EQ(kernels(*vulkan_fusing(false), exe->graph()), 5);
  testing::expect_equivalent(g, backend::random_inputs(g, {{"N", 70}}, 2), *vulkan);
}

/// broadcast_to is computed where it is read: a per-row value broadcast to its rows (what
/// autodiff makes of a mean's gradient) and scaled is one kernel; a broadcast that is a result,
/// or read by a matmul, has its own.
TEST(VulkanFusion, BroadcastsAreComputedWhereTheyAreRead) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  ir::Graph g;
  const ir::Dim n = g.symbol("N");
  const auto x = g.add_input("x", qkv::DType::f32, {n, 8});
  const auto per_row = g.add_input("per_row", qkv::DType::f32, {n, 1});
  const auto wide = g.add(ir::Op::broadcast_to, {g.add(ir::Op::neg, {per_row})}, ir::shape_attrs({n, 8}));  // [N, 8]
  g.set_output("y", g.add(ir::Op::mul, {g.add(ir::Op::exp, {wide}), x}));
  EXPECT_EQ(kernels(*vulkan, vulkan->compile(g)->graph()), 1);
  testing::expect_equivalent(g, backend::random_inputs(g, {{"N", 37}}, 3), *vulkan);
  g.set_output("wide", wide);
  g.set_output("z", g.add(ir::Op::matmul, {wide, g.add_input("w", qkv::DType::f32, {8, 4})}));
  EXPECT_EQ(kernels(*vulkan, vulkan->compile(g)->graph()), 3);
  testing::expect_equivalent(g, backend::random_inputs(g, {{"N", 37}}, 4), *vulkan);
}

ir::ValueId reduce(ir::Graph& g, ir::Op op, ir::ValueId x, int axis, bool keepdim) {
  ir::Attrs a;
  a.axis = axis;
  a.keepdim = keepdim;
  return g.add(op, {x}, a);
}

/// A reduction of a reduction over an adjacent axis is one kernel over both axes (autodiff's
/// bias gradients: a sum over B, then over N), kept or dropped dims alike; axes that are not
/// adjacent stay two kernels. Odd sizes, the reference's numbers.
TEST(VulkanFusion, ReductionsOverAdjacentAxesAreOneKernel) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  using ir::Op;
  ir::Graph g;
  const ir::Dim b = g.symbol("B"), n = g.symbol("N");
  const auto x = g.add_input("x", qkv::DType::f32, {b, n, 3, 5});
  g.set_output("bias", reduce(g, Op::reduce_sum, reduce(g, Op::reduce_sum, g.add(Op::exp, {x}), 0, false), 0, false));  // over B, N
  g.set_output("rows", reduce(g, Op::reduce_max, reduce(g, Op::reduce_max, x, 3, true), 2, true));                      // over the last two
  g.set_output("all", reduce(g, Op::reduce_sum, reduce(g, Op::reduce_sum, reduce(g, Op::reduce_sum, x, 1, false), 1, false), 0, false));
  g.set_output("apart", reduce(g, Op::reduce_sum, reduce(g, Op::reduce_sum, x, 1, false), 2, false));  // N, then the 5
  EXPECT_EQ(kernels(*vulkan, vulkan->compile(g)->graph()), 5);
  for (auto [bs, ns] : {std::pair{1, 1}, {3, 7}, {2, 65}})
    testing::expect_equivalent(g, backend::random_inputs(g, {{"B", bs}, {"N", ns}}, 6), *vulkan);
}

/// Row kernels: a layer norm written by hand (mean, variance of x - mean, then the normalised
/// elements) and a softmax written by hand (max, sum of exp(x - max), then the quotients), over
/// the last axis and over an inner one, are one kernel each, which computes its rows'
/// reductions before their elements; each way of taking rows (an invocation, a subgroup, a
/// workgroup per row), rows of 1 to 3000 elements, with a NaN and a row of -inf: the
/// reference's numbers.
TEST(VulkanFusion, RowReductionsAndTheirElementsAreOneKernel) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  using ir::Op;
  ir::Graph g;
  const ir::Dim b = g.symbol("B"), m = g.symbol("M");
  const auto x = g.add_input("x", qkv::DType::f32, {b, 3, m});
  const auto gain = g.add_input("gain", qkv::DType::f32, {m});
  auto norm = [&](int axis) {
    const auto count = reduce(g, Op::reduce_sum, g.add(Op::broadcast_to, {g.constant(1.0)}, ir::shape_attrs(g.node(x).shape)), axis, true);
    const auto centred = g.add(Op::sub, {x, g.add(Op::div, {reduce(g, Op::reduce_sum, x, axis, true), count})});
    const auto var = g.add(Op::div, {reduce(g, Op::reduce_sum, g.add(Op::mul, {centred, centred}), axis, true), count});
    return g.add(Op::div, {centred, g.add(Op::sqrt, {g.add(Op::add, {var, g.constant(1e-5)})})});
  };
  auto softmax = [&](int axis) {
    const auto e = g.add(Op::exp, {g.add(Op::sub, {x, reduce(g, Op::reduce_max, x, axis, true)})});
    return g.add(Op::div, {e, reduce(g, Op::reduce_sum, e, axis, true)});
  };
  g.set_output("norm", g.add(Op::mul, {norm(2), gain}));
  g.set_output("soft", softmax(2));
  g.set_output("inner", softmax(1));
  using Tuning = backend::VulkanOptions::Tuning;
  for (auto [subgroups, tuning] : {std::pair{true, Tuning::cpu}, {true, Tuning::gpu}, {false, Tuning::gpu}}) {
    auto options = backend::vulkan_options_from_env();
    options.subgroup_reductions = subgroups;
    options.tuning = tuning;
    auto device = backend::make_vulkan_backend(options);
    SCOPED_TRACE(std::string(subgroups ? "subgroups" : "an invocation per row") + (tuning == Tuning::gpu ? ", gpu tuning" : ""));
    auto exe = device->compile(g);
    int rows = 0;
    for (std::size_t v = 0; v < exe->graph().size(); ++v)
      rows += device->kernel_name(exe->graph(), static_cast<ir::ValueId>(v)).starts_with("glsl fused_");
    EXPECT_EQ(rows, 3) << "a kernel per output";
    for (auto [bs, ms] : {std::pair{1, 1}, {2, 3}, {3, 33}, {2, 300}, {1, 3000}}) {
      auto in = backend::random_inputs(g, {{"B", bs}, {"M", ms}}, 12);
      testing::expect_equivalent(g, in, *device);
      in.at("x").data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
      for (std::int64_t j = 0; j < ms; ++j) in.at("x").data<float>()[static_cast<std::size_t>(ms + j)] = -std::numeric_limits<float>::infinity();
      testing::expect_equivalent(g, in, *device);
    }
  }
}

/// A weight gradient, the sum over the batch of X^T dY, is one matmul whose depth runs over the
/// batch and the rows together, with one batch dim or two (two sums merged), in each matmul
/// kernel; where an operand broadcasts over the batch, or the product is not A^T B, the sum is
/// its own kernel.
TEST(VulkanFusion, BatchSummedMatmulsAreOneMatmul) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  using ir::Op;
  ir::Graph g;
  const ir::Dim b = g.symbol("B"), n = g.symbol("N");
  ir::Attrs at;
  at.transpose_a = true;
  const auto x = g.add_input("x", qkv::DType::f32, {b, n, 5});
  const auto dy = g.add_input("dy", qkv::DType::f32, {b, n, 7});
  g.set_output("dw", reduce(g, Op::reduce_sum, g.add(Op::matmul, {x, dy}, at), 0, false));
  const auto x4 = g.add_input("x4", qkv::DType::f32, {2, b, n, 3});
  const auto dy4 = g.add_input("dy4", qkv::DType::f32, {2, b, n, 4});
  g.set_output("dw4", reduce(g, Op::reduce_sum, reduce(g, Op::reduce_sum, g.add(Op::matmul, {x4, dy4}, at), 0, false), 0, true));
  const auto shared = g.add_input("shared", qkv::DType::f32, {1, n, 7});
  g.set_output("broadcast", reduce(g, Op::reduce_sum, g.add(Op::matmul, {x, shared}, at), 0, false));
  g.set_output("plain", reduce(g, Op::reduce_sum, g.add(Op::matmul, {dy, g.add_input("w", qkv::DType::f32, {7, 2})}), 0, false));
  using Tuning = backend::VulkanOptions::Tuning;
  for (auto tuning : {Tuning::cpu, Tuning::gpu}) {
    auto options = backend::vulkan_options_from_env();
    options.tuning = tuning;
    auto device = backend::make_vulkan_backend(options);
    SCOPED_TRACE(tuning == Tuning::gpu ? "gpu tuning" : "cpu tuning");
    EXPECT_EQ(kernels(*device, device->compile(g)->graph()), 6);
    for (auto [bs, ns] : {std::pair{1, 1}, {3, 7}, {2, 65}})
      testing::expect_equivalent(g, backend::random_inputs(g, {{"B", bs}, {"N", ns}}, 8), *device);
  }
}

/// Multi-head attention's head permutes: q, k and v read as [B, H, N, D] heads straight from
/// their [B, N, H, D] projections through strides, and the output written as [B, N, H, D]
/// through strides, so the permutes have no kernel (head dim 5: rows not a multiple of vec4s);
/// a permute also read by another kernel, or an attention output that is a result, keeps its
/// kernel; the backward reads and writes heads in place too. The reference's numbers throughout.
TEST(VulkanFusion, HeadsAreReadAndWrittenInPlace) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  using ir::Op;
  ir::Graph g;
  const ir::Dim b = g.symbol("B"), n = g.symbol("N");
  ir::Attrs heads;
  heads.perm = {0, 2, 1, 3};
  auto split = [&](const char* name) {
    const auto x = g.add_input(name, qkv::DType::f32, {b, n, 15});
    return g.add(Op::permute, {g.add(Op::reshape, {x}, ir::shape_attrs({b, n, 3, 5}))}, heads);
  };
  const auto q = split("q"), k = split("k"), v = split("v");
  ir::Attrs causal;
  causal.scale = 0.4;
  causal.causal = true;
  const auto o = g.add(Op::attention, {q, k, v}, causal);
  g.set_output("y", g.add(Op::reshape, {g.add(Op::permute, {o}, heads)}, ir::shape_attrs({b, n, 15})));
  EXPECT_EQ(kernels(*vulkan, vulkan->compile(g)->graph()), 1) << "the flash kernel alone";
  for (auto [bs, ns] : {std::pair{1, 1}, {2, 7}, {3, 33}})
    testing::expect_equivalent(g, backend::random_inputs(g, {{"B", bs}, {"N", ns}}, 21), *vulkan);

  // Training: the same graph's backward reads q, k, v and writes dq, dk, dv in place.
  const ir::Graph forward = testing::with_weighted_sum_loss(g);
  const ir::Graph backward = ir::build_backward(forward, {"loss", {"q", "k", "v"}, {}});
  auto trained = vulkan->compile(backward);
  int permutes = 0;
  for (std::size_t i = 0; i < trained->graph().size(); ++i)
    permutes +=
        trained->graph().nodes()[i].op == Op::permute && vulkan->kernel_name(trained->graph(), static_cast<ir::ValueId>(i)).starts_with("glsl ");
  EXPECT_LE(permutes, 2) << "only the output's and dy's (also read by the delta's kernel)";
  testing::expect_equivalent(backward, backend::random_inputs(backward, {{"B", 2}, {"N", 9}}, 22), *vulkan);

  // Another reader of q's heads, and the attention output as a result: those permutes copy.
  g.set_output("q_heads", g.add(Op::exp, {q}));
  g.set_output("o", o);
  EXPECT_EQ(kernels(*vulkan, vulkan->compile(g)->graph()), 4);
  testing::expect_equivalent(g, backend::random_inputs(g, {{"B", 2}, {"N", 7}}, 23), *vulkan);
}

/// A concat whose operands are contiguous runs of it (the packed QKV weight's gradient, rows
/// of three products) has no kernel: its operands' kernels write into it, nested concats
/// included; an unaligned run, an input operand, one read by two concats, or runs that are not
/// contiguous (a concat along columns) keep the copy. The reference's numbers each way.
TEST(VulkanFusion, ConcatsAreWrittenInPlace) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  using ir::Op;
  ir::Graph g;
  const auto x = g.add_input("x", qkv::DType::f32, {8, 8});
  const auto w = g.add_input("w", qkv::DType::f32, {8, 8});
  ir::Attrs rows, columns;
  columns.axis = 1;
  const auto a = g.add(Op::exp, {x});
  const auto b = g.add(Op::matmul, {x, w});
  const auto c = g.add(Op::tanh, {w});
  g.set_output("packed", g.add(Op::concat, {g.add(Op::concat, {a, b}, rows), c}, rows));  // [24, 8]
  EXPECT_EQ(kernels(*vulkan, vulkan->compile(g)->graph()), 3) << "exp, matmul, tanh: no copies";
  testing::expect_equivalent(g, backend::random_inputs(g, {}, 31), *vulkan);

  ir::Graph h;
  const auto y = h.add_input("y", qkv::DType::f32, {3, 3});
  const auto e = h.add(Op::exp, {y});  // 9 floats: the second operand would start at byte 36
  const auto t = h.add(Op::tanh, {y});
  h.set_output("unaligned", h.add(Op::concat, {e, t}, rows));
  h.set_output("input", h.add(Op::concat, {h.add(Op::neg, {y}), y}, rows));
  const auto twice = h.add(Op::sqrt, {h.add(Op::mul, {y, y})});
  h.set_output("first", h.add(Op::concat, {twice, h.add(Op::sin, {y})}, rows));
  h.set_output("second", h.add(Op::concat, {h.add(Op::cos, {y}), twice}, rows));
  h.set_output("columns", h.add(Op::concat, {h.add(Op::exp, {t}), h.add(Op::neg, {t})}, columns));
  auto exe = vulkan->compile(h);
  int copies = 0;
  for (std::size_t i = 0; i < exe->graph().size(); ++i)
    copies += exe->graph().nodes()[i].op == Op::concat && vulkan->kernel_name(exe->graph(), static_cast<ir::ValueId>(i)).starts_with("glsl ");
  EXPECT_EQ(copies, 5);
  testing::expect_equivalent(h, backend::random_inputs(h, {}, 32), *vulkan);
}

/// Softmax and row sums read through fused chains, with a masked row (-inf everywhere gives
/// zeros) and a NaN (propagates), as the reference defines them.
TEST(VulkanFusion, FusedReductionsMatchTheReference) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  auto x = input<"x">(dim<"N">, dim<"M">);
  auto b = input<"b">(dim<"M">);
  const ir::Graph g = lower(named<"p">(softmax<1>(x * 0.25 + b)), named<"s">(sum<1>((x - b) * (x - b))), named<"m">(max<1>(exp(x) * b)));
  auto in = backend::random_inputs(g, {{"N", 9}, {"M", 70}}, 4);
  testing::expect_equivalent(g, in, *vulkan);
  EXPECT_EQ(kernels(*vulkan, vulkan->compile(g)->graph()), 3);
  for (std::int64_t j = 0; j < 70; ++j) in.at("x").data<float>()[j] = -std::numeric_limits<float>::infinity();
  in.at("x").data<float>()[70 + 3] = std::numeric_limits<float>::quiet_NaN();
  testing::expect_equivalent(g, in, *vulkan);
}

/// Reductions and softmax with a subgroup per row and a workgroup per row (GPU tuning, rows of
/// 2048 or more) and with an invocation per row (lavapipe's tuning, or subgroups off), over the
/// last axis and an inner one, on rows shorter and longer than a subgroup, with a NaN and a row
/// of -inf: the reference's numbers each way.
TEST(VulkanFusion, SubgroupWorkgroupAndPerInvocationReductionsMatchTheReference) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  auto x = input<"x">(dim<"B">, dim<"N">, dim<"M">);
  const ir::Graph g = lower(named<"p">(softmax<2>(x * 0.5)), named<"q">(softmax<1>(x)), named<"s">(sum<2>(exp(x))), named<"t">(sum<1>(x)),
                            named<"m">(max<2>(x)), named<"u">(max<1>(x * x)));
  using Tuning = backend::VulkanOptions::Tuning;
  for (auto [subgroups, tuning] : {std::pair{true, Tuning::cpu}, {true, Tuning::gpu}, {false, Tuning::gpu}}) {
    auto options = backend::vulkan_options_from_env();
    options.subgroup_reductions = subgroups;
    options.tuning = tuning;
    auto b = backend::make_vulkan_backend(options);
    SCOPED_TRACE(std::string(subgroups ? "subgroups" : "an invocation per row") + (tuning == Tuning::gpu ? ", gpu tuning" : ""));
    for (auto [n, m] : {std::pair{1, 1}, {7, 3}, {65, 33}, {3, 300}, {2, 3000}}) {
      auto in = backend::random_inputs(g, {{"B", 2}, {"N", n}, {"M", m}}, 5);
      testing::expect_equivalent(g, in, *b);
      in.at("x").data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
      for (std::int64_t j = 0; j < m; ++j)
        in.at("x").data<float>()[static_cast<std::size_t>(n * m + j) % (2 * n * m)] = -std::numeric_limits<float>::infinity();
      testing::expect_equivalent(g, in, *b);
    }
  }
}

/// Row slices of a packed projection weight and bias are read in place (no kernel, no copy),
/// of an input and of an intermediate that other kernels then overwrite; a column slice and an
/// unaligned one are copied; results and outputs that are views match the reference.
TEST(VulkanFusion, ContiguousSlicesAreReadInPlace) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  ir::Graph g;
  const ir::Dim n = g.symbol("N");
  const auto x = g.add_input("x", qkv::DType::f32, {n, 32});
  const auto w = g.add_input("w", qkv::DType::f32, {96, 32});
  const auto b = g.add_input("b", qkv::DType::f32, {96});
  auto slice = [&](ir::ValueId v, int axis, std::int64_t begin, std::int64_t end) {
    ir::Attrs a;
    a.axis = axis;
    a.begin = begin;
    a.end = end;
    return g.add(ir::Op::slice, {v}, a);
  };
  ir::Attrs tb;
  tb.transpose_b = true;
  ir::ValueId sum = -1;
  for (std::int64_t part = 0; part < 3; ++part) {
    const auto y =
        g.add(ir::Op::add, {g.add(ir::Op::matmul, {x, slice(w, 0, 32 * part, 32 * part + 32)}, tb), slice(b, 0, 32 * part, 32 * part + 32)});
    sum = sum < 0 ? y : g.add(ir::Op::add, {sum, y});
  }
  const auto rows = slice(g.add(ir::Op::exp, {w}), 0, 64, 96);  // a view of an intermediate, read after other kernels ran
  g.set_output("y", g.add(ir::Op::add, {g.add(ir::Op::matmul, {sum, rows}, tb), sum}));
  g.set_output("rows", rows);
  g.set_output("cols", slice(w, 1, 4, 8));
  g.set_output("odd", slice(b, 0, 1, 33));
  auto exe = vulkan->compile(g);
  int views = 0;
  for (std::size_t i = 0; i < exe->graph().size(); ++i)
    views += vulkan->kernel_name(exe->graph(), static_cast<ir::ValueId>(i)).starts_with("(view of %");
  EXPECT_EQ(views, 7) << "three weight rows, three bias rows and exp(w)'s last rows";
  const ir::ValueId lowered_rows = exe->graph().output("rows");
  EXPECT_EQ(exe->graph().node(exe->graph().node(lowered_rows).inputs[0]).op, ir::Op::exp);
  EXPECT_EQ(vulkan->kernel_name(exe->graph(), lowered_rows),
            "(view of %" + std::to_string(exe->graph().node(lowered_rows).inputs[0]) + " at byte " + std::to_string(64 * 32 * 4) + ")");
  for (std::int64_t rows_n : {1, 7, 40}) testing::expect_equivalent(g, backend::random_inputs(g, {{"N", rows_n}}, 3), *vulkan);
  testing::expect_equivalent(g, backend::random_inputs(g, {{"N", 5}}, 4), *vulkan_fusing(false));
}

/// Unfused kernels (one per node, as before fusion) against the reference on random graphs.
TEST(VulkanFusion, RandomGraphsMatchWithFusionOff) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  setenv("QKV_VULKAN_FUSION", "0", 1);
  for (std::uint64_t seed = 5000; seed < 5012; ++seed) {
    const auto result = backend::check_random_graph(backend::random_graph(seed), {"reference", "vulkan"}, true);
    EXPECT_TRUE(result.pass) << "seed " << seed << ": " << result.failure << "\n" << ir::print(result.failing_graph);
  }
  unsetenv("QKV_VULKAN_FUSION");
}

}  // namespace
}  // namespace qkv
