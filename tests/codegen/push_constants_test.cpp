// Push constants declared once: the GLSL block and the packed words come from one declaration,
// and a launch packed from any other declaration (a sabotaged order) is refused before dispatch.
#include "codegen/push_constants.hpp"
#include "codegen/storage_plan.hpp"

#include <gtest/gtest.h>

#include <bit>

#include "codegen/attention_glsl.hpp"
#include "codegen/fusion.hpp"
#include "codegen/glsl_detail.hpp"
#include "codegen/matmul_glsl.hpp"
#include "codegen/spirv.hpp"
#include "codegen/spirv_needs.hpp"
#include "ir/bind.hpp"
#include "ir/graph.hpp"
#include "ir/passes/passes.hpp"
#include "sweeps/op_cases.hpp"

namespace qkv::codegen {
namespace {

using T = PushConstants::Type;

PushConstants example(int dims) {
  PushConstants p;
  p.scalar("rows", T::u32, "N").scalar("scale", T::f32, "").scalar("shift", T::i32, "").array("batch", dims, "sizes");
  return p;
}

TEST(PushConstants, TheBlockAndTheWordsFollowTheDeclaration) {
  const PushConstants p = example(2);
  EXPECT_EQ(p.words(), 5);
  EXPECT_EQ(p.glsl(),
            "layout(push_constant) uniform Params {\n  uint rows;  // N\n  float scale;\n  int shift;\n  uint batch[2];  // sizes\n} pc;\n");
  const std::int64_t sizes[] = {3, 7};
  // Set in any order, laid out as declared.
  const std::vector<std::uint32_t> words = p.values().set_array("batch", sizes).set_int("shift", -2).set_float("scale", 0.125).set("rows", 9).words();
  EXPECT_EQ(words, (std::vector<std::uint32_t>{9, std::bit_cast<std::uint32_t>(0.125f), static_cast<std::uint32_t>(-2), 3, 7}));
  // No batch dims: the array is declared with one element and packed with a zero.
  const PushConstants none = example(0);
  EXPECT_NE(none.glsl().find("uint batch[1];"), std::string::npos);
  EXPECT_EQ(none.values().set("rows", 1).set_float("scale", 1).set_int("shift", 0).set_array("batch", {}).words().size(), 4u);
  EXPECT_NE(example(2).signature(), example(3).signature());
}

TEST(PushConstantsDeathTest, AMisuseIsOurBugAndStopsAtOnce) {
  const PushConstants p = example(1);
  const std::int64_t one[] = {4}, two[] = {4, 5};
  EXPECT_DEATH(p.values().set("rows", 1).set_float("scale", 1).set_int("shift", 0).words(), "push constant batch was not set");
  EXPECT_DEATH(p.values().set("rows", 1).set("rows", 2), "push constant rows set twice");
  EXPECT_DEATH(p.values().set("scale", 1), "push constant scale is declared float, set as uint");
  EXPECT_DEATH(p.values().set("cols", 1), "push constant cols is not declared");
  EXPECT_DEATH(p.values().set_array("batch", two), "push constant batch: 2 values for 1");
  EXPECT_DEATH(p.values().set_array("rows", one), "push constant rows is not an array");
  EXPECT_DEATH(PushConstants().scalar("a", T::u32, "").scalar("a", T::f32, ""), "push constant a declared twice");
}

TEST(SpecConstants, TheDeclarationsAndTheValuesFollowTheDeclaration) {
  SpecConstants c;
  c.constant("D4", 1, "head dim").local_size("invocations").constant("BC", 32, "");
  EXPECT_EQ(c.glsl(),
            "layout(constant_id = 0) const uint D4 = 1u;  // head dim\nlayout(local_size_x_id = 1) in;  // invocations\n"
            "layout(constant_id = 2) const uint BC = 32u;\n");
  EXPECT_EQ(c.values().set("BC", 16).set("local_size", 128).set("D4", 4).words(), (std::vector<std::uint32_t>{4, 128, 16}));
  SpecConstants swapped;
  swapped.local_size("invocations").constant("D4", 1, "head dim").constant("BC", 32, "");
  EXPECT_NE(c.signature(), swapped.signature());
}

TEST(SpecConstantsDeathTest, AMisuseIsOurBugAndStopsAtOnce) {
  SpecConstants c;
  c.constant("D4", 1, "").local_size("");
  EXPECT_DEATH(c.values().set("D4", 1).words(), "specialization constant local_size was not set");
  EXPECT_DEATH(c.values().set("D4", 1).set("D4", 2), "specialization constant D4 set twice");
  EXPECT_DEATH(c.values().set("BC", 1), "specialization constant BC is not declared");
  EXPECT_DEATH(SpecConstants().constant("A", 0, "").constant("A", 1, ""), "specialization constant A declared twice");
}

/// A flash-attention node over q [..., 40, 16], k [..., 50, 16], v [..., 50, 8] with `batch_dims`
/// leading dims of sizes 2, 3, 4, 5.
struct Attention {
  ir::Graph g;
  ir::ValueId y = -1;
  std::vector<ir::Shape> shapes;
  explicit Attention(int batch_dims = 2) {
    ir::Shape qs, ks, vs;
    for (int d = 0; d < batch_dims; ++d) qs.push_back(2 + d), ks.push_back(2 + d), vs.push_back(2 + d);
    qs.push_back(40), qs.push_back(16), ks.push_back(50), ks.push_back(16), vs.push_back(50), vs.push_back(8);
    const ir::ValueId q = g.add_input("q", DType::f32, qs), k = g.add_input("k", DType::f32, ks), v = g.add_input("v", DType::f32, vs);
    ir::Attrs a;
    a.scale = 0.25;
    a.causal = true;
    y = g.add(ir::Op::attention, {q, k, v}, a);
    g.set_output("out", y);
    auto dims = [](const ir::Shape& s) { return std::vector<std::int64_t>(s.dims.begin(), s.dims.begin() + s.rank); };
    shapes = ir::bind_shapes(g, {{"q", Tensor(DType::f32, dims(qs))}, {"k", Tensor(DType::f32, dims(ks))}, {"v", Tensor(DType::f32, dims(vs))}});
  }
};

TEST(PushConstants, TheFlashKernelsDeclareTheirsByName) {
  // No batch dims to four (strided, heads read in place, up to two), each block as large as the
  // words its launch packs, within the pipeline's 32.
  for (int batch_dims = 0; batch_dims <= 4; ++batch_dims) {
    SCOPED_TRACE(batch_dims);
    const Attention a(batch_dims);
    const KernelSource source = detail::attention_source(a.g.node(a.y));
    const KernelLaunch launch = detail::attention_launch(a.g, plan_storage(a.g), a.y, a.shapes, Target{});
    EXPECT_NE(source.push_signature, 0u);
    EXPECT_EQ(launch.push_signature, source.push_signature);
    EXPECT_EQ(static_cast<int>(launch.push.size()), detail::attention_push_words(a.g.node(a.y)));
    EXPECT_LE(launch.push.size(), static_cast<std::size_t>(kMaxPushWords));
    for (const char* read : {"N = pc.queries;", "scale = pc.scale;", "rem % pc.batch[d]", "k_at += idx * pc.k_batch_strides[d];"})
      EXPECT_NE(source.glsl.find(read), std::string::npos) << read;
    EXPECT_EQ(source.glsl.find("pc.p["), std::string::npos) << "no word read by position";
    EXPECT_EQ(spirv_needs(compile_spirv(source.name, source.glsl, SpirvOptimization::none)).push_constant_bytes, launch.push.size() * 4);
    // What the words say, by name: N 40, M 50, D 16, Dv 8, the scale, then the batch dims.
    EXPECT_EQ(std::vector<std::uint32_t>(launch.push.begin(), launch.push.begin() + 4), (std::vector<std::uint32_t>{40, 50, 16, 8}));
    EXPECT_EQ(launch.push[4], std::bit_cast<std::uint32_t>(0.25f));
    for (int d = 0; d < batch_dims; ++d) EXPECT_EQ(launch.push[9 + static_cast<std::size_t>(d)], static_cast<std::uint32_t>(2 + d));
    if (batch_dims == 0) {
      EXPECT_EQ(launch.push[9], 0u);  // the empty batch array's one word
    }
  }
}

/// `declared` with members `a` and `b` trading places: the sabotaged order.
PushConstants swapped(const PushConstants& declared, const std::string& a, const std::string& b) {
  PushConstants p;
  for (const auto& m : declared.members()) {
    const std::string name = m.name == a ? b : m.name == b ? a : m.name;
    if (m.array) p.array(name, m.count, m.doc);
    else p.scalar(name, m.type, m.doc);
  }
  return p;
}

/// Kernels of every family fused: a matmul with a bias, a ReLU and a scale in its store (an
/// epilogue with an operand and constants), a layer norm's row kernel, a softmax of a chain.
ir::Graph fused_families() {
  using ir::Op;
  ir::Graph g;
  const auto x = g.add_input("x", DType::f32, {2, 8, 16}), w = g.add_input("w", DType::f32, {16, 32}), b = g.add_input("b", DType::f32, {32});
  const auto y = g.add(Op::mul, {g.add(Op::max, {g.add(Op::add, {g.add(Op::matmul, {x, w}), b}), g.constant(0.0)}), g.constant(0.5)});
  ir::Attrs last;
  last.axis = 2;
  last.keepdim = true;
  const auto centred = g.add(Op::sub, {y, g.add(Op::div, {g.add(Op::reduce_sum, {y}, last), g.constant(32.0)})});
  g.set_output("norm", g.add(Op::mul, {centred, g.add(Op::exp, {g.add(Op::reduce_max, {centred}, last)})}));
  g.set_output("soft", g.add(Op::softmax, {g.add(Op::tanh, {y})}, last));
  return g;
}

/// Every kernel the generator writes, for every op's cases and for fused kernels of every kind,
/// declares its push constants by name, and its launch packs that declaration: check_push
/// accepts each, and no launch has more words than a pipeline.
TEST(PushConstants, EveryKernelDeclaresItsPushConstantsAndItsLaunchPacksThem) {
  int kernels = 0, fused = 0;
  auto check = [&](const ir::Graph& g, const std::vector<ir::Shape>& shapes, const std::string& what) {
    const ir::StoragePlan storage = plan_storage(g, 16);
    for (bool fuse : {false, true})
      for (const KernelGroup& k : fuse ? plan_kernels(g, storage) : unfused_kernels(g, storage)) {
        const KernelSource source = k.fused() ? fused_source(g, storage, k) : kernel_source(g, storage, k.root);
        SCOPED_TRACE(what + ": " + source.name);
        const KernelLaunch launch = k.fused() ? fused_launch(g, storage, k, shapes) : kernel_launch(g, storage, k.root, shapes);
        EXPECT_NE(source.push_signature, 0u);
        check_push(source, launch);
        EXPECT_NE(source.glsl.find("layout(push_constant) uniform Params {"), std::string::npos);
        ++kernels;
        fused += k.fused();
      }
  };
  for (ir::Op op : ir::all_ops())
    for (const auto& c : ir::op_cases(op)) {
      const ir::Graph g = ir::decompose_composites(ir::case_graph(op, c), implements);
      std::map<std::string, Tensor, std::less<>> inputs;
      for (std::size_t k = 0; k < c.inputs.size(); ++k)
        inputs.emplace("x" + std::to_string(k), Tensor(ir::fill_dtype(c.inputs[k].fill), c.inputs[k].shape));
      check(g, ir::bind_shapes(g, inputs), std::string(ir::op_name(op)) + " " + c.label);
    }
  const ir::Graph g = fused_families();
  check(g, ir::bind_shapes(g, {{"x", Tensor(DType::f32, {2, 8, 16})}, {"w", Tensor(DType::f32, {16, 32})}, {"b", Tensor(DType::f32, {32})}}),
        "fused");
  EXPECT_GT(kernels, 200);
  EXPECT_GE(fused, 3) << "the epilogue, the row kernel and the softmax of a chain";
}

/// Each family's sabotage: its launch packed from its declaration with two members swapped is
/// refused (the words would read one as the other).
TEST(PushConstantsDeathTest, EachFamilysLaunchFromASwappedDeclarationIsRefused) {
  using ir::Op;
  ir::Graph g;
  const auto x = g.add_input("x", DType::f32, {2, 8, 16}), w = g.add_input("w", DType::f32, {2, 16, 32});
  ir::Attrs last;
  last.axis = 2;
  const auto sum = g.add(Op::add, {x, x}), mm = g.add(Op::matmul, {x, w}), reduced = g.add(Op::reduce_sum, {x}, last);
  for (auto v : {sum, mm, reduced}) g.set_output("y" + std::to_string(v), v);
  const auto shapes = ir::bind_shapes(g, {{"x", Tensor(DType::f32, {2, 8, 16})}, {"w", Tensor(DType::f32, {2, 16, 32})}});
  const ir::StoragePlan storage = plan_storage(g);
  struct Family {
    ir::ValueId v;
    PushConstants declared;
    std::string a, b;
  };
  const Family families[] = {{sum, detail::elementwise_push_constants(3, 2), "x0_strides", "x1_strides"},
                             {mm, detail::matmul_push_constants(3), "M", "N"},
                             {reduced, detail::axis_push_constants(), "n", "inner"}};
  for (const Family& f : families) {
    const KernelSource source = kernel_source(g, storage, f.v);
    KernelLaunch launch = kernel_launch(g, storage, f.v, shapes);
    EXPECT_EQ(launch.push_signature, f.declared.signature()) << source.name << ": the family's declaration";
    check_push(source, launch);  // as generated: accepted
    launch.push_signature = swapped(f.declared, f.a, f.b).signature();
    EXPECT_DEATH(check_push(source, launch), "its launch packed push constants declared differently from the shader's") << source.name;
  }
}

TEST(PushConstantsDeathTest, ALaunchPackedFromAnotherDeclarationIsRefused) {
  // The sabotage: the same members with queries and keys swapped. The launch's words would read
  // M as N; its signature differs from the shader's, and the dispatch stops before recording.
  const Attention a;
  const KernelSource source = detail::attention_source(a.g.node(a.y));
  KernelLaunch launch = detail::attention_launch(a.g, plan_storage(a.g), a.y, a.shapes, Target{});
  check_push(source, launch);  // as generated: accepted
  PushConstants swapped;
  const PushConstants declared = detail::attention_push_constants(a.g.node(a.y));
  for (const auto& m : declared.members()) {
    const std::string name = m.name == "queries" ? "keys" : m.name == "keys" ? "queries" : m.name;
    if (m.array) swapped.array(name, m.count, m.doc);
    else swapped.scalar(name, m.type, m.doc);
  }
  launch.push_signature = swapped.signature();
  EXPECT_DEATH(check_push(source, launch), "its launch packed push constants declared differently from the shader's");
}

/// The specialization constants' sabotage: a flash kernel's and each matmul kernel's launch set
/// from its declaration with two constants swapped is refused (the tile height would size the
/// head dim's registers).
TEST(SpecConstantsDeathTest, ALaunchFromASwappedDeclarationIsRefused) {
  const Attention a;
  const KernelSource source = detail::attention_source(a.g.node(a.y));
  KernelLaunch launch = detail::attention_launch(a.g, plan_storage(a.g), a.y, a.shapes, Target{});
  const SpecConstants declared = detail::attention_spec_constants(a.g.node(a.y));
  EXPECT_EQ(launch.spec_signature, declared.signature());
  EXPECT_EQ(launch.specialization.size(), declared.members().size());
  check_push(source, launch);  // as generated: accepted
  SpecConstants swapped;
  for (const auto& m : declared.members()) {
    if (m.name.empty()) swapped.local_size(m.doc);
    else swapped.constant(m.name == "D4" ? "BC" : m.name == "BC" ? "D4" : m.name, m.fallback, m.doc);
  }
  launch.spec_signature = swapped.signature();
  EXPECT_DEATH(check_push(source, launch), "its launch set specialization constants declared differently from the shader's");

  ir::Graph g;
  const auto x = g.add_input("x", DType::f32, {64, 64}), w = g.add_input("w", DType::f32, {64, 64});
  const auto mm = g.add(ir::Op::matmul, {x, w});
  g.set_output("y", mm);
  const auto shapes = ir::bind_shapes(g, {{"x", Tensor(DType::f32, {64, 64})}, {"w", Tensor(DType::f32, {64, 64})}});
  Target lanes;
  lanes.subgroup_size = 8;  // lavapipe's: the lanes kernel
  Target tiled;
  tiled.cpu_device = false;  // a GPU's: the tiled kernel
  for (const Target& t : {lanes, tiled}) {
    const KernelSource mm_source = kernel_source(g, plan_storage(g), mm, t);
    KernelLaunch mm_launch = kernel_launch(g, plan_storage(g), mm, shapes, t);
    check_push(mm_source, mm_launch);
    EXPECT_NE(mm_launch.spec_signature, 0u) << mm_source.name;
    mm_launch.spec_signature = detail::matmul_spec_constants(detail::MatmulKernel::cooperative).signature();
    EXPECT_DEATH(check_push(mm_source, mm_launch), "specialization constants declared differently") << mm_source.name;
  }
}

}  // namespace
}  // namespace qkv::codegen
