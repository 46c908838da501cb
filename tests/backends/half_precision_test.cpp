// Graphs with f16 and bf16 values on every backend: each op computes in f32 (the reference in
// double) and rounds its result once, as PyTorch; tensors in and out keep their dtypes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "backends/reference/reference_backend.hpp"
#include "backends/vulkan/context.hpp"
#include "backends/vulkan/vulkan_backend.hpp"
#include "dsl/dsl.hpp"
#include "ir/passes/passes.hpp"
#include "ir/printer.hpp"
#include "sweeps/op_cases.hpp"
#include "tests/support/backend_fixture.hpp"

namespace qkv {
namespace {

class HalfPrecision : public ::testing::TestWithParam<std::string> {};

/// y = tanh(x * 0.5) + x over x of `dtype`: a scalar constant takes x's dtype.
ir::Graph elementwise(DType dtype) {
  ir::Graph g;
  const ir::ValueId x = g.add_input("x", dtype, {g.symbol("N")});
  g.set_output("y", g.add(ir::Op::add, {g.add(ir::Op::tanh, {g.add(ir::Op::mul, {x, g.constant(0.5)})}), x}));
  return g;
}

TEST_P(HalfPrecision, ElementwiseOpsRoundEachResult) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  // 257 elements, and on cpu more than three chunks of its pooled conversions and roundings.
  for (auto [dtype, n] :
       {std::pair{DType::f16, 257}, std::pair{DType::bf16, 257}, std::pair{DType::f16, 3 * 65536 + 5}, std::pair{DType::bf16, 3 * 65536 + 5}}) {
    if (n > 257 && GetParam() != "cpu") continue;
    SCOPED_TRACE(std::string(dtype_name(dtype)) + " x " + std::to_string(n));
    const ir::Graph g = elementwise(dtype);
    EXPECT_EQ(g.node(g.output("y")).dtype, dtype);
    Tensor x = backend::random_inputs(g, {{"N", n}}, 3).at("x");
    ASSERT_EQ(x.dtype(), dtype);
    const Tensor y = b->compile(g)->run({{"x", x}}).at("y");
    ASSERT_EQ(y.dtype(), dtype);
    const double ulp = dtype == DType::f16 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7);
    int differ = 0;
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      // Each op's result rounded: x * 0.5 (exact), tanh of it, then the sum.
      const double t = round_to(dtype, std::tanh(round_to(dtype, x.at(i) * 0.5)));
      const double want = round_to(dtype, t + x.at(i));
      // f32 kernels round tanh's f32 value: at most a neighbour of the exact rounding.
      EXPECT_LE(std::fabs(y.at(i) - want), ulp * std::max(std::fabs(want), 1.0)) << i;
      differ += y.at(i) != want;
    }
    if (GetParam() == "reference") {
      EXPECT_EQ(differ, 0) << "the reference computes in double and rounds at the same points";
    }
    EXPECT_LE(differ, 3 * (n / 257 + 1));
  }
}

TEST_P(HalfPrecision, RoundingsInAnF32GraphComeOutF32) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  // round_f16 and round_bf16 are f32 ops: a backend that holds their values in 16 bits still
  // returns them as the graph declares them.
  for (ir::Op op : {ir::Op::round_f16, ir::Op::round_bf16}) {
    ir::Graph g;
    g.set_output("y", g.add(op, {g.add_input("x", DType::f32, {g.symbol("N")})}));
    const backend::TensorMap inputs = backend::random_inputs(g, {{"N", 5}}, 2);
    const Tensor y = b->compile(g)->run(inputs).at("y");
    ASSERT_EQ(y.dtype(), DType::f32) << ir::op_name(op);
    for (std::int64_t i = 0; i < y.numel(); ++i)
      EXPECT_EQ(y.at(i), round_to(op == ir::Op::round_f16 ? DType::f16 : DType::bf16, inputs.at("x").at(i))) << i;
  }
}

TEST_P(HalfPrecision, InputsOfAnotherDtypeAreRefusedByName) {
  QKV_GET_BACKEND_OR_SKIP(b, GetParam());
  auto exe = b->compile(elementwise(DType::f16));
  try {
    exe->run({{"x", Tensor(DType::f32, {4})}});
    ADD_FAILURE() << "an f32 tensor for an f16 input";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("input 'x': expected f16[N], got f32[4] (dtype differs)"), std::string::npos) << e.what();
  }
}

/// Attention over q, k, v of `dtype` (fused: the output rounded once), with a matmul after it
/// and casts to and from f32 around it.
ir::Graph attention(DType dtype) {
  ir::Graph g;
  const ir::Dim B = g.symbol("B"), N = g.symbol("N");
  const ir::ValueId q = g.add_input("q", dtype, {B, N, 16}), k = g.add_input("k", dtype, {B, N, 16});
  const ir::ValueId v32 = g.add_input("v", DType::f32, {B, N, 16}), w = g.add_input("w", dtype, {16, 8});
  ir::Attrs to;
  to.dtype = dtype;
  const ir::ValueId v = g.add(ir::Op::cast, {v32}, to);
  ir::Attrs a;
  a.scale = 0.25;
  a.causal = true;
  const ir::ValueId y = g.add(ir::Op::attention, {q, k, v}, a);
  g.set_output("y", y);
  to.dtype = DType::f32;
  g.set_output("out", g.add(ir::Op::cast, {g.add(ir::Op::matmul, {y, w})}, to));
  return g;
}

TEST_P(HalfPrecision, AttentionAndMatmulMatchTheReferenceWithinBudgets) {
  for (DType dtype : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const ir::Graph g = attention(dtype);
    testing::expect_equivalent(g, backend::random_inputs(g, {{"B", 2}, {"N", 33}}, 5), GetParam());
  }
}

/// softmax(q kT / sqrt(D)) v over q, k, v of `dtype` [B, H, N, D], as PyTorch's SDPA.
ir::Graph sdpa(DType dtype) {
  return ir::to_dtype(lower(named<"out">(scaled_dot_product_attention(input<"q">(dim<"B">, dim<"H">, dim<"N">, dim<"D">),
                                                                      input<"k">(dim<"B">, dim<"H">, dim<"N">, dim<"D">),
                                                                      input<"v">(dim<"B">, dim<"H">, dim<"N">, dim<"D">)))),
                      dtype);
}

TEST(HalfPrecisionCpu, ValuesAreHeldIn16BitsAndAttentionReadsThemThere) {
  QKV_GET_BACKEND_OR_SKIP(cpu, "cpu");
  const std::map<std::string, std::int64_t> dims{{"B", 2}, {"H", 3}, {"N", 300}, {"D", 32}};
  auto f32 = cpu->compile(sdpa(DType::f32));
  f32->run(backend::random_inputs(sdpa(DType::f32), dims, 4));
  for (DType dtype : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const ir::Graph g = sdpa(dtype);
    const backend::TensorMap inputs = backend::random_inputs(g, dims, 4);
    auto exe = cpu->compile(g);
    // q, k and v are read where the caller keeps them, in 16 bits: no widened copies.
    for (ir::ValueId v : exe->graph().inputs()) EXPECT_EQ(exe->graph().node(v).dtype, dtype);
    const Tensor out = exe->run(inputs).at("out");
    EXPECT_EQ(out.dtype(), dtype);
    // The output is written rounded by the attention's kernel into 16-bit storage: half the plan.
    EXPECT_LE(exe->planned_bytes(), f32->planned_bytes() / 2 + 4096) << exe->planned_bytes() << " vs f32's " << f32->planned_bytes();
    // Past the 256-row query and key tiles, so tiles are widened at offsets within each head.
    testing::expect_equivalent(g, inputs, "cpu");
  }
}

TEST(HalfPrecisionCpu, AttentionGradientsReadTheirHalfOperandsWhereTheyAre) {
  QKV_GET_BACKEND_OR_SKIP(cpu, "cpu");
  // dq, dk and dv widen q, k, v and dy tile by tile as they read them: none of the four is
  // widened whole into the scratch, so the backward's plan is well under f32's.
  const std::map<std::string, std::int64_t> dims{{"B", 2}, {"H", 3}, {"N", 300}, {"D", 32}};
  auto backward = [](DType dtype) { return ir::build_backward(sdpa(dtype), {"", {"q", "k", "v"}, {"out"}}); };
  auto f32 = cpu->compile(backward(DType::f32));
  f32->run(backend::random_inputs(backward(DType::f32), dims, 5));
  for (DType dtype : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const ir::Graph g = backward(dtype);
    const backend::TensorMap inputs = backend::random_inputs(g, dims, 5);
    auto exe = cpu->compile(g);
    exe->run(inputs);
    EXPECT_LE(exe->planned_bytes(), f32->planned_bytes() * 6 / 10) << exe->planned_bytes() << " vs f32's " << f32->planned_bytes();
    // Past the 256-row tiles: rows widened at offsets within each head, on every path (dq, dk
    // and dv in one kernel, and each alone).
    testing::expect_equivalent(g, inputs, "cpu");
    for (const char* wrt : {"q", "k", "v"}) {
      const ir::Graph one = ir::build_backward(sdpa(dtype), {"", {wrt}, {"out"}});
      testing::expect_equivalent(one, backend::random_inputs(one, dims, 6), "cpu");
    }
  }
}

/// Whether any Vulkan device has 16-bit storage buffers.
bool any_storage16() {
  for (const auto& d : backend::vulkan_devices())
    if (d.storage16) return true;
  return false;
}

/// A vulkan backend with the environment's options changed by `change`.
template <class Change> std::unique_ptr<backend::Backend> vulkan_with(Change change) {
  auto options = backend::vulkan_options_from_env();
  change(options);
  return backend::make_vulkan_backend(options);
}

/// How each attention and matmul kernel an executable runs computes, in node order: the matmul
/// or flash-attention kernel its name gives ("flash_attention_dq_coop16x16x16", "matmul_lanes8",
/// also inside a fused kernel's name), leaving out how its operands and result are held (16-bit
/// buffers or widened, rounded on store) and what its epilogue computes.
std::vector<std::string> computing_kernels(const backend::Backend& b, const ir::Graph& lowered) {
  // The name's '_'-separated words: "flash" "attention" <what>, or "matmul", then the variant
  // word(s) if any: "coop16x16x16", "coop" "emulated16x16x16", "lanes8".
  const auto computing = [](std::string_view name) -> std::string {
    std::vector<std::string_view> w;
    for (std::size_t at = 0; at <= name.size();) {
      const std::size_t end = std::min(name.find('_', at), name.size());
      w.push_back(name.substr(at, end - at));
      at = end + 1;
    }
    for (std::size_t i = 0; i < w.size(); ++i) {
      std::string out;
      std::size_t next = 0;
      bool matmul = false;
      if (w[i] == "flash" && i + 2 < w.size() && w[i + 1] == "attention") {
        out = "flash_attention_" + std::string(w[i + 2]);
        next = i + 3;
      } else if (w[i] == "matmul") {
        out = "matmul";
        next = i + 1;
        matmul = true;
      } else {
        continue;
      }
      if (next < w.size() && w[next].starts_with("coop")) {
        out += "_" + std::string(w[next]);
        if (w[next] == "coop" && next + 1 < w.size() && w[next + 1].starts_with("emulated")) out += "_" + std::string(w[next + 1]);
      } else if (matmul && next < w.size() && w[next].starts_with("lanes")) {
        out += "_" + std::string(w[next]);
      }
      return out;
    }
    return {};
  };
  std::vector<std::string> names;
  for (std::size_t i = 0; i < lowered.size(); ++i) {
    const std::string k = b.kernel_name(lowered, static_cast<ir::ValueId>(i));
    if (!k.starts_with("glsl ")) continue;
    if (std::string c = computing(std::string_view(k).substr(5)); !c.empty()) names.push_back(std::move(c));
  }
  return names;
}

/// Runs `g` on `half` (16-bit buffers, conversions on the device) and on `widened` (conversions
/// on the host) and expects the same bits, after asserting that both ran the same attention and
/// matmul kernels: only then are the bits a promise.
void expect_same_kernels_same_bits(const ir::Graph& g, const backend::TensorMap& inputs, backend::Backend& half, backend::Backend& widened) {
  auto a = half.compile(g), b = widened.compile(g);
  ASSERT_EQ(computing_kernels(half, a->graph()), computing_kernels(widened, b->graph()));
  const backend::TensorMap got = a->run(inputs), want = b->run(inputs);
  for (const auto& [name, t] : want) {
    ASSERT_EQ(got.at(name).dtype(), t.dtype()) << name;
    EXPECT_EQ(std::memcmp(got.at(name).raw(), t.raw(), t.nbytes()), 0) << name << ": the same kernels, converting on the device or the host";
  }
}

/// Whether any device has cooperative matrices (VK_KHR_cooperative_matrix or VK_NV_...).
bool any_cooperative_matrix() {
  for (const auto& d : backend::vulkan_devices())
    if (d.cooperative_matrix) return true;
  return false;
}

/// A vulkan backend multiplying f16 values with cooperative matrices: the device's where one has
/// them (VK_KHR's, the kernels translated, when QKV_VULKAN_COOPERATIVE_MATRIX=khr), else emulated
/// with `fragment` (rows, columns, depth); nullptr where the device lacks what the emulation needs
/// (f16 arithmetic).
std::unique_ptr<backend::Backend> cooperative_backend(std::array<std::uint32_t, 3> fragment = {16, 16, 16}) {
  auto options = backend::vulkan_options_from_env();
  using C = backend::VulkanOptions::CooperativeMatrix;
  options.cooperative_matrix = options.cooperative_matrix == C::khr ? C::khr : any_cooperative_matrix() ? C::on : C::emulated;
  options.emulated_fragment = fragment;
  try {
    return backend::make_vulkan_backend(options);
  } catch (const BackendError&) {
    return nullptr;
  }
}

TEST(HalfPrecisionVulkan, HalfTensorsCrossAndStayIn16BitBuffers) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  using C = backend::VulkanOptions::CooperativeMatrix;
  if (!any_storage16()) GTEST_SKIP() << "no device with 16-bit storage buffers";
  // Widened on the host, f16 attention has f32 operands and runs the scalar kernels; in 16-bit
  // buffers it takes cooperative matrices where the device has them. Bits are compared between
  // the scalar kernels on both sides; the cooperative ones (the device's, or emulated) within the
  // budget, as a GPU runs them by default.
  auto host_widened = vulkan_with([](backend::VulkanOptions& o) {
    o.half_storage = false;
    o.cooperative_matrix = C::off;
  });
  auto scalar = vulkan_with([](backend::VulkanOptions& o) { o.cooperative_matrix = C::off; });
  auto cooperative = cooperative_backend();  // nullptr: no cooperative matrices, nor f16 arithmetic to emulate them
  const std::map<std::string, std::int64_t> dims{{"B", 2}, {"H", 2}, {"N", 70}, {"D", 16}};
  for (DType dtype : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    // Forward and backward: half inputs uploaded as they are and widened by cast kernels, half
    // outputs narrowed on the device and downloaded in 16 bits.
    const ir::Graph forward = sdpa(dtype);
    const ir::Graph g = ir::build_backward(forward, {"", {"q", "k", "v"}, {"out"}});
    const backend::TensorMap inputs = backend::random_inputs(g, dims, 9);
    auto exe = vulkan->compile(g);
    for (ir::ValueId v : exe->graph().inputs()) EXPECT_EQ(exe->graph().node(v).dtype, dtype) << exe->graph().node(v).name;
    for (const auto& [name, v] : exe->graph().outputs()) EXPECT_EQ(exe->graph().node(v).dtype, dtype) << name;
    // Each input is widened by a cast kernel, or read in 16 bits by the flash kernels (q and k
    // are read only by them: their casts are views of the inputs).
    int views = 0;
    for (std::size_t i = 0; i < exe->graph().size(); ++i) {
      const ir::Node& n = exe->graph().nodes()[i];
      if (n.op != ir::Op::cast || exe->graph().node(n.inputs[0]).op != ir::Op::input) continue;
      const std::string kernel = vulkan->kernel_name(exe->graph(), static_cast<ir::ValueId>(i));
      views += kernel.starts_with("(view of");
      EXPECT_TRUE(kernel.starts_with("(view of") || kernel == "glsl cast_" + std::string(dtype_name(dtype)) + "_f32") << kernel;
    }
    EXPECT_GE(views, 2);
    for (const auto& [name, t] : exe->run(inputs)) EXPECT_EQ(t.dtype(), dtype) << name;
    expect_same_kernels_same_bits(g, inputs, *scalar, *host_widened);
    testing::expect_equivalent(g, inputs, "vulkan");
    // f16 attention on cooperative matrices (bf16 has none: the scalar kernels again).
    if (cooperative) {
      const auto coop_kernels = computing_kernels(*cooperative, cooperative->compile(g)->graph());
      EXPECT_EQ(std::count_if(coop_kernels.begin(), coop_kernels.end(), [](const std::string& k) { return k.find("_coop") != std::string::npos; }),
                dtype == DType::f16 ? 5 : 0)
          << ::testing::PrintToString(coop_kernels);
      testing::expect_equivalent(g, inputs, *cooperative);
    }

    // The forward alone: the flash kernel reads q, k and v in 16 bits and writes its output
    // rounded into the output's 16-bit storage, so the plan is half of f32's.
    auto f32 = vulkan->compile(sdpa(DType::f32));
    f32->run(backend::random_inputs(sdpa(DType::f32), dims, 9));
    auto half = vulkan->compile(forward);
    const backend::TensorMap forward_inputs = backend::random_inputs(forward, dims, 9);
    EXPECT_EQ(half->run(forward_inputs).at("out").dtype(), dtype);
    const ir::ValueId out = half->graph().output("out");
    EXPECT_TRUE(vulkan->kernel_name(half->graph(), out).starts_with("(written in place by")) << vulkan->kernel_name(half->graph(), out);
    EXPECT_LE(half->planned_bytes(), f32->planned_bytes() / 2 + 1024) << half->planned_bytes() << " vs f32's " << f32->planned_bytes();
    testing::expect_equivalent(forward, forward_inputs, "vulkan");
  }
}

/// y = a b^T + c over `dtype` operands, a [2, 3, M, K] against b [3, N, K] (b broadcast over the
/// first batch dim), c [N] a bias the matmul's epilogue adds; z = b a^T alone.
ir::Graph matmuls(DType dtype) {
  ir::Graph g;
  const auto m = g.symbol("M"), n = g.symbol("N"), k = g.symbol("K");
  const ir::ValueId a = g.add_input("a", dtype, {2, 3, m, k}), b = g.add_input("b", dtype, {3, n, k}), c = g.add_input("c", dtype, {n});
  ir::Attrs tb;
  tb.transpose_b = true;
  g.set_output("y", g.add(ir::Op::add, {g.add(ir::Op::matmul, {a, b}, tb), c}));
  g.set_output("z", g.add(ir::Op::matmul, {b, a}, tb));
  return g;
}

TEST(HalfPrecisionVulkan, MovesOfRoundedValuesAreNotRoundedAgain) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  // A half graph rounds every half op's result but a permute's, a slice's or a concat's of values
  // already rounded (ir::emulate_half_precision): those rounds would be the identity. The moved
  // values are read where they lie or moved by their own kernels, the same numbers.
  for (DType dtype : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    ir::Graph g;
    const ir::ValueId x = g.add_input("x", dtype, {6, g.symbol("N")});
    const ir::ValueId t = g.add(ir::Op::tanh, {x});
    ir::Attrs swap, rows, axis0;
    swap.perm = {1, 0};
    rows.axis = 1;
    rows.begin = 2;
    rows.end = 5;
    axis0.axis = 0;
    const ir::ValueId p = g.add(ir::Op::permute, {t}, swap);  // [N, 6]
    const ir::ValueId s = g.add(ir::Op::slice, {p}, rows);    // [N, 3]
    g.set_output("y", g.add(ir::Op::exp, {g.add(ir::Op::concat, {s, s}, axis0)}));
    auto exe = vulkan->compile(g);
    int rounds = 0, moves = 0;
    for (std::size_t i = 0; i < exe->graph().size(); ++i) {
      const ir::Node& n = exe->graph().nodes()[i];
      moves += n.op == ir::Op::permute || n.op == ir::Op::slice || n.op == ir::Op::concat;
      if (n.op != ir::Op::round_f16 && n.op != ir::Op::round_bf16) continue;
      const ir::Op of = exe->graph().node(n.inputs[0]).op;
      rounds += of == ir::Op::permute || of == ir::Op::slice || of == ir::Op::concat;
    }
    EXPECT_EQ(moves, 3);
    EXPECT_EQ(rounds, 0) << ir::print(exe->graph());
    for (std::int64_t n : {1, 9}) testing::expect_equivalent(g, backend::random_inputs(g, {{"N", n}}, 13), *vulkan);
  }
}

TEST(HalfPrecisionVulkan, ReductionsAndAttentionStoreTheirRoundedValues) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  // A half graph rounds each sum, max, softmax and attention: where the round is the value's one
  // reader, the value's own kernel stores it rounded and the round is a view. A sum keeping its
  // dim whose round elementwise nodes read (x - mean) stays in their row kernel instead. Both
  // geometries: an invocation per row (lavapipe's) and a subgroup per row (GPUs').
  auto gpu = vulkan_with([](backend::VulkanOptions& o) { o.tuning = backend::VulkanOptions::Tuning::gpu; });
  for (backend::Backend* b : {vulkan.get(), gpu.get()})
    for (DType dtype : {DType::f16, DType::bf16}) {
      SCOPED_TRACE(dtype_name(dtype));
      ir::Graph g;
      const ir::Dim n = g.symbol("N");
      const ir::ValueId x = g.add_input("x", dtype, {2, n, 40});
      const ir::ValueId q = g.add_input("q", dtype, {2, n, 8}), k = g.add_input("k", dtype, {2, n, 8}), v = g.add_input("v", dtype, {2, n, 8});
      ir::Attrs over_n, over_row, softmax_row, sdpa;
      over_n.axis = 1;
      over_n.keepdim = false;
      over_row.axis = 2;
      over_row.keepdim = true;
      softmax_row.axis = 2;
      sdpa.scale = 0.3;
      sdpa.causal = true;
      // Each read by an elementwise op (a result would be a cast to the half dtype instead).
      g.set_output("sum", g.add(ir::Op::tanh, {g.add(ir::Op::reduce_sum, {x}, over_n)}));
      g.set_output("max", g.add(ir::Op::exp, {g.add(ir::Op::reduce_max, {x}, over_n)}));
      g.set_output("softmax", g.add(ir::Op::sqrt, {g.add(ir::Op::softmax, {x}, softmax_row)}));
      g.set_output("centred", g.add(ir::Op::sub, {x, g.add(ir::Op::reduce_sum, {x}, over_row)}));
      g.set_output("attention", g.add(ir::Op::tanh, {g.add(ir::Op::attention, {q, k, v}, sdpa)}));
      auto exe = b->compile(g);
      const ir::Graph& lowered = exe->graph();
      int rounded = 0, views = 0;
      for (std::size_t i = 0; i < lowered.size(); ++i) {
        const ir::Node& node = lowered.nodes()[i];
        if (node.op == ir::Op::round_f16 || node.op == ir::Op::round_bf16) {
          const ir::Op of = lowered.node(node.inputs[0]).op;
          const bool stored_rounded = of == ir::Op::softmax || of == ir::Op::attention || of == ir::Op::reduce_max ||
                                      (of == ir::Op::reduce_sum && !lowered.node(node.inputs[0]).attrs.keepdim);
          if (!stored_rounded) continue;
          EXPECT_TRUE(b->kernel_name(lowered, static_cast<ir::ValueId>(i)).starts_with("(view of")) << ir::op_name(of);
          ++views;
        } else if (node.op == ir::Op::reduce_sum && node.attrs.keepdim) {
          EXPECT_EQ(b->kernel_name(lowered, static_cast<ir::ValueId>(i)).find("_round_"), std::string::npos) << "a row kernel's sum";
        } else if (node.op == ir::Op::reduce_sum || node.op == ir::Op::reduce_max || node.op == ir::Op::softmax || node.op == ir::Op::attention) {
          const std::string kernel = b->kernel_name(lowered, static_cast<ir::ValueId>(i));
          EXPECT_NE(kernel.find("_round_" + std::string(dtype_name(dtype))), std::string::npos) << kernel;
          ++rounded;
        }
      }
      EXPECT_EQ(views, 4);
      EXPECT_EQ(rounded, 4);
      for (std::int64_t rows : {1, 37}) testing::expect_equivalent(g, backend::random_inputs(g, {{"N", rows}}, 17), *b);
    }
  // What those kernels store are half numbers: an f32 graph's explicit rounds, results
  // themselves (views of the values' storage). Sums of integers are exact in f32, so their f16
  // rounding is the reference's bit for bit (f16 steps are 4 past 4096: sums of 37 rows up to
  // 200 round visibly); softmax in bf16 and attention in f16 hold their format's numbers.
  ir::Graph g;
  const ir::ValueId x = g.add_input("x", DType::f32, {3, 37, 20}), q = g.add_input("q", DType::f32, {3, 37, 8});
  ir::Attrs over_n, softmax_row, sdpa;
  over_n.axis = 1;
  over_n.keepdim = false;
  softmax_row.axis = 2;
  sdpa.scale = 0.3;
  g.set_output("sum", g.add(ir::Op::round_f16, {g.add(ir::Op::reduce_sum, {x}, over_n)}));
  g.set_output("softmax", g.add(ir::Op::round_bf16, {g.add(ir::Op::softmax, {x}, softmax_row)}));
  g.set_output("attention", g.add(ir::Op::round_f16, {g.add(ir::Op::attention, {q, q, q}, sdpa)}));
  backend::TensorMap in = backend::random_inputs(g, {}, 3);
  Tensor& xs = in.at("x");
  for (std::int64_t i = 0; i < xs.numel(); ++i) xs.data<float>()[i] = static_cast<float>((i * 7919) % 200);
  const auto want = backend::make_reference_backend({backend::Precision::f64, true})->compile(g)->run(in);
  for (backend::Backend* b : {vulkan.get(), gpu.get()}) {
    auto exe = b->compile(g);
    for (const char* name : {"sum", "softmax", "attention"})
      EXPECT_TRUE(b->kernel_name(exe->graph(), exe->graph().output(name)).starts_with("(view of")) << name;
    const auto got = exe->run(in);
    int rounded_visibly = 0;
    for (std::int64_t i = 0; i < want.at("sum").numel(); ++i) {  // [3, 20]
      EXPECT_EQ(got.at("sum").at(i), want.at("sum").at(i)) << "sum " << i;
      double exact = 0;
      for (std::int64_t r = 0; r < 37; ++r) exact += xs.at((i / 20 * 37 + r) * 20 + i % 20);
      rounded_visibly += want.at("sum").at(i) != exact;
    }
    EXPECT_GT(rounded_visibly, 0);
    for (std::int64_t i = 0; i < got.at("softmax").numel(); ++i) {
      const double v = got.at("softmax").at(i);
      EXPECT_EQ(v, round_to(DType::bf16, v)) << "softmax " << i;
    }
    for (std::int64_t i = 0; i < got.at("attention").numel(); ++i) {
      const double v = got.at("attention").at(i);
      EXPECT_EQ(v, round_to(DType::f16, v)) << "attention " << i;
    }
  }
}

TEST(HalfPrecisionVulkan, ElementwiseAndReductionKernelsReadAndWriteTheir16BitBuffers) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  if (!any_storage16()) GTEST_SKIP() << "no device with 16-bit storage buffers";
  auto host_widened = vulkan_with([](backend::VulkanOptions& o) { o.half_storage = false; });
  auto gpu = vulkan_with([](backend::VulkanOptions& o) { o.tuning = backend::VulkanOptions::Tuning::gpu; });
  for (DType dtype : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    // Half inputs read by a fused chain, an elementwise op alone, a sum and a softmax; each
    // result a chain's, a sum's or a softmax's value stored into its 16-bit output.
    ir::Graph g;
    const ir::Dim n = g.symbol("N");
    const ir::ValueId x = g.add_input("x", dtype, {3, n, 24}), b = g.add_input("b", dtype, {24}), w = g.add_input("w", dtype, {3, n, 24});
    ir::Attrs rows, cols;
    rows.axis = 2;
    cols.axis = 1;
    cols.keepdim = false;
    g.set_output("chain", g.add(ir::Op::tanh, {g.add(ir::Op::mul, {g.add(ir::Op::add, {x, b}), w})}));
    g.set_output("alone", g.add(ir::Op::neg, {w}));
    g.set_output("sum", g.add(ir::Op::reduce_sum, {x}, cols));
    g.set_output("softmax", g.add(ir::Op::softmax, {w}, rows));
    const ir::Graph backward = ir::build_backward(g, {"", {"x", "b", "w"}, {"chain", "sum", "softmax"}});
    for (const ir::Graph* graph : {static_cast<const ir::Graph*>(&g), &backward}) {
      const backend::TensorMap inputs = backend::random_inputs(*graph, {{"N", 37}}, 19);
      const backend::TensorMap want = host_widened->compile(*graph)->run(inputs);
      for (auto* be : {vulkan.get(), gpu.get()}) {
        auto exe = be->compile(*graph);
        const ir::Graph& lowered = exe->graph();
        // No cast kernel in the forward: each input's widening is a view its readers load through,
        // each output's narrowing is written by the kernel computing the value. (The backward
        // keeps a few: an input read through a reshape, outputs whose values other ops read too.)
        for (std::size_t i = 0; i < lowered.size() && graph == &g; ++i)
          if (lowered.nodes()[i].op == ir::Op::cast) {
            const std::string kernel = be->kernel_name(lowered, static_cast<ir::ValueId>(i));
            EXPECT_TRUE(kernel.starts_with("(view of") || kernel.starts_with("(written in place by")) << "%" << i << ": " << kernel;
          }
        const backend::TensorMap got = exe->run(inputs);
        for (const auto& [name, t] : want) {
          ASSERT_EQ(got.at(name).dtype(), t.dtype()) << name;
          EXPECT_EQ(std::memcmp(got.at(name).raw(), t.raw(), t.nbytes()), 0) << name << ": the same kernels, converting on the device or the host";
        }
      }
      testing::expect_equivalent(*graph, inputs, "vulkan");
    }
  }
}

TEST(HalfPrecisionVulkan, MatmulsReadAndWriteTheir16BitBuffers) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  if (!any_storage16()) GTEST_SKIP() << "no device with 16-bit storage buffers";
  using C = backend::VulkanOptions::CooperativeMatrix;
  // Bits are compared between the scalar kernels, converting on the device or the host; the
  // cooperative-matrix kernel (the device's, or emulated) that f16 matmuls take by default on a
  // GPU is compared within the budget.
  auto host_widened = vulkan_with([](backend::VulkanOptions& o) {
    o.half_storage = false;
    o.cooperative_matrix = C::off;
  });
  // The device's geometry (lavapipe's lanes kernel, a GPU's tiled one) and the tiled one, each
  // reading 16-bit operands, then the cooperative-matrix kernel.
  auto scalar = vulkan_with([](backend::VulkanOptions& o) { o.cooperative_matrix = C::off; });
  auto tiled = vulkan_with([](backend::VulkanOptions& o) {
    o.tuning = backend::VulkanOptions::Tuning::gpu;
    o.cooperative_matrix = C::off;
  });
  auto cooperative = cooperative_backend();  // nullptr: no cooperative matrices, nor f16 arithmetic to emulate them
  const std::map<std::string, std::int64_t> dims{{"M", 37}, {"N", 70}, {"K", 45}};
  for (DType dtype : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    // Forward, and backward: dA = dY B and dB = sum over the batch of dY^T A read a and b too.
    const ir::Graph forward = matmuls(dtype);
    const ir::Graph backward = ir::build_backward(forward, {"", {"a", "b", "c"}, {"y", "z"}});
    for (const ir::Graph* g : {&forward, &backward}) {
      const backend::TensorMap inputs = backend::random_inputs(*g, dims, 11);
      for (auto* b : {scalar.get(), tiled.get(), cooperative.get()}) {
        if (!b) continue;
        auto exe = b->compile(*g);
        // a and b are read only by matmuls, which load them in 16 bits: their casts are views.
        for (std::size_t i = 0; i < exe->graph().size(); ++i) {
          const ir::Node& n = exe->graph().nodes()[i];
          if (n.op != ir::Op::cast || exe->graph().node(n.inputs[0]).op != ir::Op::input) continue;
          const std::string& name = exe->graph().node(n.inputs[0]).name;
          if (name != "a" && name != "b") continue;
          EXPECT_TRUE(b->kernel_name(exe->graph(), static_cast<ir::ValueId>(i)).starts_with("(view of")) << name;
        }
        testing::expect_equivalent(*g, inputs, *b);
      }
      // The device's geometry converting on the device or the host: the same kernels, the same bits.
      expect_same_kernels_same_bits(*g, inputs, *scalar, *host_widened);
      if (cooperative) {
        const auto coop_kernels = computing_kernels(*cooperative, cooperative->compile(*g)->graph());
        EXPECT_TRUE(dtype != DType::f16 ||
                    std::all_of(coop_kernels.begin(), coop_kernels.end(), [](const std::string& k) { return k.find("_coop") != std::string::npos; }))
            << ::testing::PrintToString(coop_kernels);
      }
      testing::expect_equivalent(*g, inputs, "vulkan");
    }
    // z's matmul writes its product rounded into z's 16-bit storage: no kernel for the cast.
    auto exe = vulkan->compile(forward);
    const ir::ValueId z = exe->graph().output("z");
    EXPECT_TRUE(vulkan->kernel_name(exe->graph(), z).starts_with("(written in place by")) << vulkan->kernel_name(exe->graph(), z);
  }
}

TEST_P(HalfPrecision, GradientsFlowThroughCastsInTheirDtypes) {
  for (DType dtype : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const ir::Graph g = attention(dtype);
    const ir::Graph backward = ir::build_backward(g, {"", {"q", "k", "v", "w"}, {"out"}});
    EXPECT_EQ(backward.node(backward.output("d_q")).dtype, dtype);
    EXPECT_EQ(backward.node(backward.output("d_v")).dtype, DType::f32);  // v came in as f32
    testing::expect_equivalent(backward, backend::random_inputs(backward, {{"B", 2}, {"N", 17}}, 6), GetParam());
  }
}

/// Causal multi-head self-attention written in the DSL over `DT` activations and weights, with
/// an f32 key-padding bias (cast to the scores' dtype): forward and the backward of all weights.
template <DType DT> ir::Graph multi_head_model() {
  auto x = input<"x", DT>(dim<"B">, dim<"T">, dim<16>);
  auto kpm = input<"key_padding_mask", DType::boolean>(dim<"B">, dim<"T">);
  auto r = multi_head_attention<2>(x, x, x, input<"wq", DT>(dim<16>, dim<16>), input<"wk", DT>(dim<16>, dim<16>), input<"wv", DT>(dim<16>, dim<16>),
                                   input<"bq", DT>(dim<16>), input<"bk", DT>(dim<16>), input<"bv", DT>(dim<16>), input<"wo", DT>(dim<16>, dim<16>),
                                   input<"bo", DT>(dim<16>), causal, key_padding_bias(kpm));
  static_assert(decltype(r.output)::dtype == DT);
  return lower(named<"out">(r.output));
}

TEST_P(HalfPrecision, MultiHeadAttentionWrittenInTheDslTrainsInItsDtype) {
  for (const ir::Graph& g : {multi_head_model<DType::f16>(), multi_head_model<DType::bf16>()}) {
    const DType dtype = g.node(g.output("out")).dtype;
    SCOPED_TRACE(dtype_name(dtype));
    auto in = backend::random_inputs(g, {{"B", 2}, {"T", 9}}, 7);
    for (auto& [name, t] : in)  // Xavier-scale weights keep the scores moderate
      if (name[0] == 'w') {
        Tensor wide = t.to(DType::f64);
        for (std::int64_t i = 0; i < wide.numel(); ++i) wide.data<double>()[i] *= 0.25;
        t = wide.to(dtype);
      }
    testing::expect_equivalent(g, in, GetParam());
    const ir::Graph backward = ir::build_backward(g, {"", {"x", "wq", "wk", "wv", "wo", "bq", "bo"}, {"out"}});
    EXPECT_EQ(backward.node(backward.output("d_wq")).dtype, dtype);
    in["dout"] = backend::random_inputs(backward, {{"B", 2}, {"T", 9}}, 8).at("dout");
    testing::expect_equivalent(backward, in, GetParam());
  }
}

TEST(CooperativeMatrixVulkan, TheKernelMatchesTheReferenceEmulatedOrOnTheDevice) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  // Where no device has cooperative matrices (lavapipe), the same kernel with its fragment
  // operations as scalar code: tiles staged in f16, edges, transposes, broadcast batches,
  // epilogues and the store. Where one has them, the kernel itself (QKV_VULKAN_COOPERATIVE_MATRIX=1).
  const bool device = any_cooperative_matrix();
  auto coop = cooperative_backend();
  if (!coop) GTEST_SKIP() << "no f16 arithmetic for the emulated kernel";
  const std::string kernel = device ? "matmul_coop" : "matmul_coop_emulated";
  // Sizes across the 64 x 64 tiles and 32-deep steps: partial tiles in every direction.
  const std::map<std::string, std::int64_t> dims{{"M", 70}, {"N", 37}, {"K", 45}};
  const ir::Graph forward = matmuls(DType::f16);
  const ir::Graph backward = ir::build_backward(forward, {"", {"a", "b", "c"}, {"y", "z"}});
  for (const ir::Graph* g : {&forward, &backward}) {
    auto exe = coop->compile(*g);
    int cooperative = 0;
    for (std::size_t i = 0; i < exe->graph().size(); ++i)
      if (exe->graph().nodes()[i].op == ir::Op::matmul) {
        // The fused kernels take the name of their chain; the matmul's own kernels say which.
        const std::string name = coop->kernel_name(exe->graph(), static_cast<ir::ValueId>(i));
        cooperative += name.starts_with("glsl " + kernel);
      }
    EXPECT_GE(cooperative, 1);
    testing::expect_equivalent(*g, backend::random_inputs(*g, dims, 12), *coop);
  }
  // Multi-head attention in f16 (projections with bias epilogues, the backward's weight
  // gradients summed over the batch) trains through it.
  const ir::Graph mha = multi_head_model<DType::f16>();
  auto in = backend::random_inputs(mha, {{"B", 2}, {"T", 9}}, 7);
  testing::expect_equivalent(mha, in, *coop);
  const ir::Graph mha_backward = ir::build_backward(mha, {"", {"x", "wq", "wk", "wv", "wo", "bq", "bo"}, {"out"}});
  in["dout"] = backend::random_inputs(mha_backward, {{"B", 2}, {"T", 9}}, 8).at("dout");
  testing::expect_equivalent(mha_backward, in, *coop);
  // bf16 operands are not f16 values: the scalar kernels.
  auto bf16 = coop->compile(matmuls(DType::bf16));
  for (std::size_t i = 0; i < bf16->graph().size(); ++i)
    EXPECT_FALSE(coop->kernel_name(bf16->graph(), static_cast<ir::ValueId>(i)).find("coop") != std::string::npos);
}

/// Whether an attention forward, log-sum-exp or dv of the compiled graph runs a cooperative-matrix kernel.
bool attention_is_cooperative(backend::Backend& b, const ir::Graph& g) {
  auto exe = b.compile(g);
  for (std::size_t i = 0; i < exe->graph().size(); ++i) {
    const std::string kernel = b.kernel_name(exe->graph(), static_cast<ir::ValueId>(i));
    if (ir::is_fused_attention(exe->graph().nodes()[i].op) && kernel.starts_with("glsl flash_attention_") &&
        kernel.find("_coop") != std::string::npos)
      return true;
  }
  return false;
}

TEST(CooperativeMatrixVulkan, AttentionMatchesTheReferenceEmulatedOrOnTheDevice) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  // Every forward, log-sum-exp and gradient case of the fused attention ops (causal, windows,
  // keep-masks, score modifiers that mask whole tiles, dropout) in f16 through the cooperative
  // kernels: q k^T (dv, dk: k q^T), p v (dv: p dy), and for dq and dk dy v^T and ds k (ds q) as
  // fragment products, the softmax and ds in scalar code between them. The cases' lse inputs are
  // random, not the forward's: p and ds reach far past f16's range, which the kernels' per-row
  // scaling of ds must keep.
  auto coop = cooperative_backend();
  if (!coop) GTEST_SKIP() << "no f16 arithmetic for the emulated kernel";
  int cooperative = 0;
  for (const auto& rc : testing::registry_cases([](ir::Op op) { return ir::is_fused_attention(op); })) {
    // A modifier tensor's gradient is score-shaped: decomposed, no flash kernel (the f16
    // conformance cases run those).
    if (rc.op == ir::Op::flex_attention_grad && rc.c.attrs.wrt > 2) continue;
    // The tangent's kernel has no cooperative path: the same scalar kernel as the f16 conformance
    // cases run.
    if (ir::attention_roles(rc.op).jvp()) continue;
    SCOPED_TRACE(testing::case_label(rc));
    const ir::Graph h = ir::to_dtype(ir::case_graph(rc.op, rc.c), DType::f16);
    cooperative += attention_is_cooperative(*coop, h);
    testing::expect_equivalent(h, testing::inputs_in_dtype(testing::case_inputs(rc.c, 1234 + rc.index), DType::f16), *coop);
  }
  EXPECT_GE(cooperative, 40);
  // Past one workgroup's 64 query rows and one tile's keys, head dims that are no multiple of a
  // fragment's (q and k 40, v 24), causal, forward and backward; and bf16, whose values are no f16
  // values: the scalar kernel.
  auto sdpa = [](DType dtype, bool causal, std::int64_t n = 77, std::int64_t m = 100, std::int64_t d = 40, std::int64_t dv = 24,
                 double scale = 0.16) {
    ir::Graph g;
    const ir::ValueId q = g.add_input("q", dtype, {2, n, d}), k = g.add_input("k", dtype, {2, m, d}), v = g.add_input("v", dtype, {2, m, dv});
    ir::Attrs a;
    a.scale = scale;
    a.causal = causal;
    a.align = ir::CausalAlign::bottom_right;
    g.set_output("out", g.add(ir::Op::attention, {q, k, v}, a));
    return g;
  };
  // The forward and its backward (dq, dk, dv) through b's cooperative kernels, against the reference.
  auto forward_and_backward = [](backend::Backend& b, const ir::Graph& g, std::uint64_t seed, std::uint64_t backward_seed) {
    EXPECT_TRUE(attention_is_cooperative(b, g));
    testing::expect_equivalent(g, backend::random_inputs(g, {}, seed), b);
    const ir::Graph backward = ir::build_backward(g, {"", {"q", "k", "v"}, {"out"}});
    EXPECT_TRUE(attention_is_cooperative(b, backward));
    testing::expect_equivalent(backward, backend::random_inputs(backward, {}, backward_seed), b);
  };
  // Causal only: its tiles below the diagonal run unmasked, as a non-causal kernel's do (the
  // registry's cases above run non-causal attention through the cooperative kernels too).
  forward_and_backward(*coop, sdpa(DType::f16, true), 21, 23);
  EXPECT_FALSE(attention_is_cooperative(*coop, sdpa(DType::bf16, false)));
  // Head dim 128: on lavapipe's 32 KiB four subgroups' rows do not fit; two subgroups take the
  // workgroup (NSG from the launch's workgroup size), forward and backward.
  {
    SCOPED_TRACE("head dim 128");
    forward_and_backward(*coop, sdpa(DType::f16, true, 45, 45, 128, 128, 0.25), 25, 26);
  }
  // The kernels' other lane layouts over lavapipe's subgroups of 8: a 4 x 8 x 8 fragment gives
  // two lanes per score row, as NVIDIA's 32 lanes over 16 rows (subgroup shuffles combine a row's
  // max, sum and largest ds); NVIDIA's other fragment, 16 x 8 x 16, has fewer columns than depth
  // (head dims padded to both) and gives each lane two rows. Causal only: the lane layout is the
  // same without the mask, and each layout's kernels cost lavapipe half a minute to compile.
  if (!any_cooperative_matrix() && backend::vulkan_devices().front().subgroup_size == 8) {
    for (const std::array<std::uint32_t, 3> fragment : {std::array<std::uint32_t, 3>{4, 8, 8}, std::array<std::uint32_t, 3>{16, 8, 16}}) {
      SCOPED_TRACE(std::to_string(fragment[0]) + "x" + std::to_string(fragment[1]) + "x" + std::to_string(fragment[2]));
      auto other = cooperative_backend(fragment);
      ASSERT_TRUE(other);
      forward_and_backward(*other, sdpa(DType::f16, true), 22, 24);
    }
  }
}

TEST(CooperativeMatrixVulkan, AttentionForwardPropagatesNanAndInfAsTheReference) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  auto coop = cooperative_backend();
  if (!coop) GTEST_SKIP() << "no f16 arithmetic for the emulated kernel";
  // A NaN in q, an inf in k and in v: NaN rows where the reference has them (p = 0 times an
  // infinite v is NaN, as in the decomposition), finite values elsewhere.
  ir::Graph g;
  const ir::ValueId q = g.add_input("q", DType::f16, {1, 70, 16}), k = g.add_input("k", DType::f16, {1, 50, 16}),
                    v = g.add_input("v", DType::f16, {1, 50, 16});
  ir::Attrs a;
  a.scale = 0.25;
  a.causal = true;
  g.set_output("out", g.add(ir::Op::attention, {q, k, v}, a));
  ASSERT_TRUE(attention_is_cooperative(*coop, g));
  auto in = backend::random_inputs(g, {}, 5);
  auto poke = [&](const char* name, std::int64_t at, float value) {
    Tensor wide = in.at(name).to(DType::f32);
    wide.data<float>()[at] = value;
    in[name] = wide.to(DType::f16);
  };
  poke("q", 3 * 16 + 2, std::numeric_limits<float>::quiet_NaN());
  poke("k", 40 * 16 + 1, std::numeric_limits<float>::infinity());
  poke("v", 20 * 16 + 5, -std::numeric_limits<float>::infinity());
  auto want = backend::make_reference_backend({backend::Precision::f64, true})->compile(g)->run(in).at("out");
  auto have = coop->compile(g)->run(in).at("out");
  int nan = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    const double w = want.at(i), h = have.at(i);
    nan += std::isnan(w);
    if (std::isnan(w)) EXPECT_TRUE(std::isnan(h)) << "element " << i;
    else if (std::isinf(w)) EXPECT_EQ(h, w) << "element " << i;
    else EXPECT_NEAR(h, w, 1e-2 * (1.0 + std::abs(w))) << "element " << i;
  }
  EXPECT_GT(nan, 16);
}

TEST(CooperativeMatrixVulkan, TheFragmentIsChosenAmongWhatTheDeviceOffers) {
  using C = vk::ComponentTypeNV;
  auto offer = [](std::uint32_t m, std::uint32_t n, std::uint32_t k, C ab, C cd, vk::ScopeNV scope = vk::ScopeNV::eSubgroup) {
    return vk::CooperativeMatrixPropertiesNV(m, n, k, ab, ab, cd, cd, scope);
  };
  using F = std::array<std::uint32_t, 3>;
  // NVIDIA's list (Turing to Hopper): 16 x 16 x 16 with f32 accumulators where offered.
  EXPECT_EQ(backend::vulkan::chosen_fragment({offer(16, 8, 16, C::eFloat16, C::eFloat16), offer(16, 8, 16, C::eFloat16, C::eFloat32),
                                              offer(16, 16, 16, C::eFloat16, C::eFloat32), offer(16, 8, 8, C::eFloat16, C::eFloat32)}),
            (F{16, 16, 16}));
  EXPECT_EQ(backend::vulkan::chosen_fragment({offer(16, 8, 8, C::eFloat16, C::eFloat32), offer(16, 8, 16, C::eFloat16, C::eFloat32)}),
            (F{16, 8, 16}));
  // f16 accumulators, int8 operands, another scope, odd sizes: none the kernel can use.
  EXPECT_EQ(backend::vulkan::chosen_fragment({offer(16, 16, 16, C::eFloat16, C::eFloat16), offer(16, 16, 32, C::eSint8, C::eSint32),
                                              offer(16, 16, 16, C::eFloat16, C::eFloat32, vk::ScopeNV::eWorkgroup),
                                              offer(12, 16, 16, C::eFloat16, C::eFloat32)}),
            (F{0, 0, 0}));
}

TEST(CooperativeMatrixVulkan, RequiringThemWhereTheDeviceHasNoneIsAnError) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  if (any_cooperative_matrix()) GTEST_SKIP() << "a device here has cooperative matrices";
  using C = backend::VulkanOptions::CooperativeMatrix;
  for (const auto& [mode, message] : {std::pair{C::on, "has no VK_NV_cooperative_matrix or VK_KHR_cooperative_matrix"},
                                      std::pair{C::khr, "VK_KHR_cooperative_matrix required (QKV_VULKAN_COOPERATIVE_MATRIX=khr)"}}) {
    auto options = backend::vulkan_options_from_env();
    options.cooperative_matrix = mode;
    try {
      backend::make_vulkan_backend(options);
      ADD_FAILURE() << "no error";
    } catch (const BackendError& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
  setenv("QKV_VULKAN_COOPERATIVE_MATRIX", "sometimes", 1);
  EXPECT_THROW(backend::vulkan_options_from_env(), BackendError);
  setenv("QKV_VULKAN_COOPERATIVE_MATRIX", "emulate", 1);
  EXPECT_EQ(backend::vulkan_options_from_env().cooperative_matrix, C::emulated);
  setenv("QKV_VULKAN_COOPERATIVE_MATRIX", "khr", 1);
  EXPECT_EQ(backend::vulkan_options_from_env().cooperative_matrix, C::khr);
  unsetenv("QKV_VULKAN_COOPERATIVE_MATRIX");
}

TEST(CooperativeMatrixVulkan, AnEmulatedFragmentThatDoesNotSplitOverTheSubgroupIsAnError) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  if (!cooperative_backend()) GTEST_SKIP() << "no f16 arithmetic for the emulated kernel";
  for (const std::array<std::uint32_t, 3> fragment : {std::array<std::uint32_t, 3>{0, 16, 16}, std::array<std::uint32_t, 3>{3, 3, 3}}) {
    auto options = backend::vulkan_options_from_env();
    options.cooperative_matrix = backend::VulkanOptions::CooperativeMatrix::emulated;
    options.emulated_fragment = fragment;
    try {
      backend::make_vulkan_backend(options);
      ADD_FAILURE() << "no error for " << fragment[0] << " x " << fragment[1] << " x " << fragment[2];
    } catch (const BackendError& e) {
      EXPECT_NE(std::string(e.what()).find("does not split over subgroups of"), std::string::npos) << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, HalfPrecision, ::testing::Values("reference", "cpu", "vulkan"), ::qkv::testing::BackendParamName());

}  // namespace
}  // namespace qkv
