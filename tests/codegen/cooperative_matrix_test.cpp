// The cooperative-matrix kernels (GL_NV_cooperative_matrix): which matmuls and attention ops
// take them, that every variant compiles to SPIR-V that spirv-val accepts for Vulkan 1.1, and
// that each translates to SPV_KHR_cooperative_matrix as it must. No device here has cooperative
// matrices: the backends tests run the same kernels emulated on lavapipe.
#include <gtest/gtest.h>

#define SPV_ENABLE_UTILITY_CODE
#include <spirv-tools/libspirv.hpp>
#include <spirv/unified1/spirv.hpp>

#include <unistd.h>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "codegen/attention_glsl.hpp"
#include "codegen/fusion.hpp"
#include "codegen/glsl.hpp"
#include "codegen/spirv.hpp"
#include "codegen/spirv_needs.hpp"
#include "codegen/storage_plan.hpp"
#include "ir/bind.hpp"
#include "ir/passes/passes.hpp"
#include "sweeps/op_cases.hpp"

namespace qkv::codegen {
namespace {

/// A GPU with cooperative matrices of `m` x `n` x `k` f16 fragments (NVIDIA's: subgroups of 32,
/// 48 KiB of shared memory).
Target gpu(std::uint32_t m = 16, std::uint32_t n = 16, std::uint32_t k = 16) {
  Target t;
  t.cpu_device = false;
  t.shared_bytes = 49152;
  t.max_invocations = 1024;
  t.subgroup_size = 32;
  t.subgroup_reductions = true;
  t.cooperative_matrix = {m, n, k, false};
  return t;
}

/// out = a b (transposed as asked) over `dtype` inputs with `batch` leading dims, and with a
/// bias added to the product when `bias` (the matmul's epilogue), lowered as the vulkan backend
/// lowers it (half inputs kept in 16 bits).
ir::Graph matmul(DType dtype, bool ta, bool tb, int batch, bool bias) {
  ir::Graph g;
  const auto m = g.symbol("M"), n = g.symbol("N"), k = g.symbol("K");
  auto shape = [&](ir::Dim r, ir::Dim c) {
    ir::Shape s;
    for (int i = 0; i < batch; ++i) s.push_back(g.symbol("B" + std::to_string(i)));
    s.push_back(r);
    s.push_back(c);
    return s;
  };
  ir::Attrs attrs;
  attrs.transpose_a = ta;
  attrs.transpose_b = tb;
  const ir::ValueId a = g.add_input("a", dtype, shape(ta ? k : m, ta ? m : k)), b = g.add_input("b", dtype, shape(tb ? n : k, tb ? k : n));
  ir::ValueId y = g.add(ir::Op::matmul, {a, b}, attrs);
  if (bias) y = g.add(ir::Op::add, {y, g.add_input("c", dtype, {n})});
  g.set_output("out", y);
  return ir::lower_for_backend(g, implements, ir::HalfInputs::kept);
}

/// Whether a kernel multiplies with cooperative matrices (or their emulation): it stages f16 tiles.
bool cooperative(const KernelSource& k) { return k.glsl.find("shared float16_t As[") != std::string::npos; }

/// The kernel that computes the graph's matmul (with its epilogue when fused).
KernelSource matmul_kernel(const ir::Graph& g, const Target& target) {
  for (const KernelGroup& k : plan_kernels(g, plan_storage(g))) {
    bool has_matmul = g.node(k.root).op == ir::Op::matmul;
    for (ir::ValueId v : k.inlined) has_matmul |= g.node(v).op == ir::Op::matmul;
    if (has_matmul) return k.fused() ? fused_source(g, plan_storage(g), k, target) : kernel_source(g, plan_storage(g), k.root, target);
  }
  ADD_FAILURE() << "no matmul kernel";
  return {};
}

/// A module's instructions by the id each defines, and how many of each opcode it has.
struct Instructions {
  std::map<std::uint32_t, std::vector<std::uint32_t>> defs;
  std::map<std::uint32_t, std::vector<std::vector<std::uint32_t>>> by_opcode;
  std::uint32_t bound = 0;
  bool unique = true;  // no id defined twice, every id below the bound

  explicit Instructions(const std::vector<std::uint32_t>& w) : bound(w.at(3)) {
    for (std::size_t i = 5; i < w.size();) {
      const std::uint32_t count = w[i] >> 16, op = w[i] & 0xffffu;
      if (count == 0 || i + count > w.size()) {
        unique = false;
        return;
      }
      std::vector<std::uint32_t> in(w.begin() + static_cast<std::ptrdiff_t>(i), w.begin() + static_cast<std::ptrdiff_t>(i + count));
      bool result = false, type = false;
      if (op == kTypeKhr) result = true;
      else if (op == kLoadKhr || op == kMulAddKhr || op == kLengthKhr) result = type = true;
      else if (op != kStoreKhr) spv::HasResultAndType(static_cast<spv::Op>(op), &result, &type);
      if (result) {
        const std::uint32_t id = in.at(type ? 2 : 1);
        unique &= id < bound && !defs.count(id);
        defs[id] = in;
      }
      by_opcode[op].push_back(std::move(in));
      i += count;
    }
  }
  std::size_t count(std::uint32_t op) const { return by_opcode.count(op) ? by_opcode.at(op).size() : 0; }
  /// The value of an OpConstant, or -1.
  std::int64_t constant(std::uint32_t id) const {
    auto it = defs.find(id);
    return it != defs.end() && (it->second[0] & 0xffffu) == spv::OpConstant ? it->second.at(3) : -1;
  }
  /// The use of a value's KHR matrix type (0 A, 1 B, 2 accumulator), or -1.
  std::int64_t use_of_value(std::uint32_t id) const {
    auto value = defs.find(id);
    if (value == defs.end()) return -1;
    auto type = defs.find(value->second.at(1));
    return type != defs.end() && (type->second[0] & 0xffffu) == kTypeKhr ? constant(type->second.at(6)) : -1;
  }
  bool has_extension(const std::string& name) const {
    if (!by_opcode.count(spv::OpExtension)) return false;
    for (const auto& in : by_opcode.at(spv::OpExtension))
      if (name == reinterpret_cast<const char*>(in.data() + 1)) return true;
    return false;
  }
  bool has_capability(std::uint32_t c) const {
    if (!by_opcode.count(spv::OpCapability)) return false;
    for (const auto& in : by_opcode.at(spv::OpCapability))
      if (in.at(1) == c) return true;
    return false;
  }
  static constexpr std::uint32_t kTypeKhr = 4456, kLoadKhr = 4457, kStoreKhr = 4458, kMulAddKhr = 4459, kLengthKhr = 4460;
};

/// What a kernel translated to SPV_KHR_cooperative_matrix must be, checked word by word (Debian
/// 12's spirv-val predates the extension): no NV instruction left; KHR's capability and
/// extension; as many loads, stores and multiply-adds as NV's; each multiply-add's A, B and C of
/// KHR matrix types declared for uses A, B and accumulator, its result C's type; each load and
/// store with the layout constant NV's column-major flag stood for; ids defined once, below the
/// bound. Where QKV_SPIRV_VAL names a spirv-val that knows the extension (SPIRV-Tools 2023.4 or
/// later), it validates the module too.
void expect_khr_translation(const std::string& name, const std::vector<std::uint32_t>& nv_words) {
  const std::vector<std::uint32_t> khr_words = khr_cooperative_matrix(nv_words);
  const Instructions nv(nv_words), khr(khr_words);
  ASSERT_TRUE(khr.unique) << name;
  for (std::uint32_t op = spv::OpTypeCooperativeMatrixNV; op <= spv::OpCooperativeMatrixLengthNV; ++op)
    EXPECT_EQ(khr.count(op), 0u) << name << ": opcode " << op;
  EXPECT_FALSE(khr.has_capability(spv::CapabilityCooperativeMatrixNV)) << name;
  EXPECT_TRUE(khr.has_capability(6022)) << name;
  EXPECT_TRUE(khr.has_extension("SPV_KHR_cooperative_matrix") && !khr.has_extension("SPV_NV_cooperative_matrix")) << name;
  ASSERT_GT(nv.count(spv::OpCooperativeMatrixMulAddNV), 0u) << name;
  EXPECT_EQ(khr.count(Instructions::kMulAddKhr), nv.count(spv::OpCooperativeMatrixMulAddNV)) << name;
  EXPECT_EQ(khr.count(Instructions::kLoadKhr), nv.count(spv::OpCooperativeMatrixLoadNV)) << name;
  EXPECT_EQ(khr.count(Instructions::kStoreKhr), nv.count(spv::OpCooperativeMatrixStoreNV)) << name;
  for (const auto& m : khr.by_opcode.at(Instructions::kMulAddKhr)) {
    EXPECT_EQ(khr.use_of_value(m.at(3)), 0) << name << ": a multiply-add's A";
    EXPECT_EQ(khr.use_of_value(m.at(4)), 1) << name << ": a multiply-add's B";
    EXPECT_EQ(khr.use_of_value(m.at(5)), 2) << name << ": a multiply-add's C";
    EXPECT_EQ(m.at(1), khr.defs.at(m.at(5)).at(1)) << name << ": a multiply-add's result type";
  }
  // Column-major loads and stores: NV's flag (a boolean constant after the stride), KHR's layout
  // (1 before it).
  auto column_major = [](const Instructions& in, std::uint32_t op, std::size_t at, bool khr_layout) {
    std::size_t n = 0;
    if (!in.by_opcode.count(op)) return n;
    for (const auto& l : in.by_opcode.at(op)) {
      if (khr_layout) {
        EXPECT_TRUE(in.constant(l.at(at)) == 0 || in.constant(l.at(at)) == 1) << "a layout that is not 0 or 1";
        n += in.constant(l.at(at)) == 1;
      } else {
        n += (in.defs.at(l.at(at))[0] & 0xffffu) == spv::OpConstantTrue;
      }
    }
    return n;
  };
  EXPECT_EQ(column_major(khr, Instructions::kLoadKhr, 4, true), column_major(nv, spv::OpCooperativeMatrixLoadNV, 5, false)) << name;
  EXPECT_EQ(column_major(khr, Instructions::kStoreKhr, 3, true), column_major(nv, spv::OpCooperativeMatrixStoreNV, 4, false)) << name;
  for (const auto& l : khr.by_opcode.at(Instructions::kLoadKhr)) EXPECT_GE(khr.use_of_value(l.at(2)), 0) << name << ": a load's type";
  if (const char* val = std::getenv("QKV_SPIRV_VAL"); val && *val) {
    const std::filesystem::path file = std::filesystem::temp_directory_path() / ("qkv_khr_" + std::to_string(getpid()) + ".spv");
    std::ofstream(file, std::ios::binary).write(reinterpret_cast<const char*>(khr_words.data()), static_cast<std::streamsize>(khr_words.size() * 4));
    EXPECT_EQ(std::system((std::string(val) + " --target-env vulkan1.1 " + file.string()).c_str()), 0) << name;
    std::filesystem::remove(file);
  }
}

/// What spirv_needs reads of a cooperative kernel (NV's, and its KHR translation): the Vulkan
/// memory model with its Device-scope capability wherever Device scope is used, and every
/// multiply-add f16 x f16 + f32 -> f32 in a subgroup of the target's fragment.
void expect_cooperative_needs(const std::string& name, const std::vector<std::uint32_t>& words, const Target& t, bool khr) {
  const SpirvNeeds needs = spirv_needs(words);
  EXPECT_TRUE(needs.unknown.empty()) << name << ": " << ::testing::PrintToString(needs.unknown);
  EXPECT_EQ(needs.memory_model, static_cast<std::uint32_t>(spv::MemoryModelVulkan)) << name;
  EXPECT_TRUE(needs.capabilities.count(spv::CapabilityVulkanMemoryModel)) << name;
  EXPECT_EQ(needs.capabilities.count(spv::CapabilityVulkanMemoryModelDeviceScope), needs.memory_scopes.count(spv::ScopeDevice)) << name;
  EXPECT_TRUE(needs.capabilities.count(khr ? 6022u : static_cast<std::uint32_t>(spv::CapabilityCooperativeMatrixNV))) << name;
  ASSERT_FALSE(needs.products.empty()) << name;
  for (const SpirvNeeds::Product& p : needs.products) {
    EXPECT_EQ(std::vector<std::uint32_t>({p.m, p.n, p.k}),
              std::vector<std::uint32_t>({t.cooperative_matrix.m, t.cooperative_matrix.n, t.cooperative_matrix.k}))
        << name;
    EXPECT_EQ(std::vector<std::uint32_t>({p.a, p.b, p.c, p.result, p.scope}), std::vector<std::uint32_t>({0, 0, 1, 1, spv::ScopeSubgroup})) << name;
    EXPECT_EQ(p.khr, khr) << name;
  }
}

void expect_valid_spirv(const KernelSource& k, const Target& t = gpu()) {
  const std::vector<std::uint32_t> words = compile_spirv(k.name, k.glsl);
  spvtools::SpirvTools tools(SPV_ENV_VULKAN_1_1);
  std::string messages;
  tools.SetMessageConsumer([&](spv_message_level_t, const char*, const spv_position_t&, const char* m) { messages += std::string(m) + "\n"; });
  EXPECT_TRUE(tools.Validate(words)) << k.name << ":\n" << messages;
  EXPECT_EQ(uses_nv_cooperative_matrix(words), k.glsl.find("GL_NV_cooperative_matrix") != std::string::npos) << k.name;
  if (uses_nv_cooperative_matrix(words)) {
    expect_khr_translation(k.name, words);
    expect_cooperative_needs(k.name, words, t, false);
    expect_cooperative_needs(k.name + " (KHR)", khr_cooperative_matrix(words), t, true);
  } else {
    EXPECT_TRUE(spirv_needs(words).products.empty()) << k.name;
  }
}

TEST(CooperativeMatrix, EveryLayoutCompilesToValidSpirv) {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int batch : {0, 2})
        for (bool bias : {false, true}) {
          SCOPED_TRACE(std::string(ta ? "ta " : "") + (tb ? "tb " : "") + std::to_string(batch) + " batch dims" + (bias ? ", bias" : ""));
          const ir::Graph g = matmul(DType::f16, ta, tb, batch, bias);
          const KernelSource k = matmul_kernel(g, gpu());
          EXPECT_NE(k.glsl.find("coopMatMulAddNV"), std::string::npos) << k.name;
          expect_valid_spirv(k);
        }
  // NVIDIA's other fragment shape, and the emulated kernel (scalar fragments) for lavapipe.
  expect_valid_spirv(matmul_kernel(matmul(DType::f16, false, true, 1, false), gpu(16, 8, 16)), gpu(16, 8, 16));
  Target emulated = gpu();
  emulated.subgroup_size = 8;
  emulated.cooperative_matrix.emulated = true;
  const KernelSource e = matmul_kernel(matmul(DType::f16, true, false, 1, true), emulated);
  EXPECT_EQ(e.glsl.find("coopMatMulAddNV"), std::string::npos);
  EXPECT_NE(e.glsl.find("Emulated fragments"), std::string::npos) << e.name;
  expect_valid_spirv(e);
}

TEST(CooperativeMatrix, OnlyMatmulsOfF16ValuesTakeIt) {
  // f32 and bf16 operands keep the scalar kernels: an f16 product of them would round.
  for (DType dtype : {DType::f32, DType::bf16}) {
    const KernelSource k = matmul_kernel(matmul(dtype, false, false, 0, false), gpu());
    EXPECT_FALSE(cooperative(k)) << dtype_name(dtype) << ": " << k.name;
  }
  // f16 operands that are f32 values of the graph rounded to f16 (an f16 graph's intermediates).
  ir::Graph g;
  const auto n = g.symbol("N");
  const ir::ValueId x = g.add_input("x", DType::f16, {n, n});
  g.set_output("y", g.add(ir::Op::matmul, {g.add(ir::Op::tanh, {x}), x}));
  const ir::Graph lowered = ir::lower_for_backend(g, implements, ir::HalfInputs::kept);
  EXPECT_TRUE(cooperative(matmul_kernel(lowered, gpu())));
  // A device without cooperative matrices, or with too little shared memory for the tiles.
  EXPECT_FALSE(cooperative(matmul_kernel(lowered, Target{})));
  Target small = gpu();
  small.shared_bytes = 16384;
  EXPECT_FALSE(cooperative(matmul_kernel(lowered, small)));
}

TEST(CooperativeMatrix, LaunchCoversTheOutputInWorkgroupTiles) {
  // 64 x 64 tiles of four subgroups of 32: a 100 x 130 output over 3 x 2 batch entries.
  ir::Graph g;
  const ir::ValueId a = g.add_input("a", DType::f16, {3, 2, 100, 40}), b = g.add_input("b", DType::f16, {2, 40, 130});
  g.set_output("out", g.add(ir::Op::matmul, {a, b}));
  g = ir::lower_for_backend(g, implements, ir::HalfInputs::kept);
  ir::ValueId mm = -1;
  std::vector<ir::Shape> shapes;
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (g.nodes()[i].op == ir::Op::matmul) mm = static_cast<ir::ValueId>(i);
    shapes.push_back(g.nodes()[i].shape);
  }
  const KernelLaunch l = kernel_launch(g, plan_storage(g), mm, shapes, gpu());
  EXPECT_EQ(l.groups, (std::array<std::uint32_t, 3>{3, 2, 6}));
  EXPECT_EQ(l.specialization, std::vector<std::uint32_t>{128});
}

/// The fused attention node of a graph lowered for the vulkan backend, or -1.
ir::ValueId fused_attention(const ir::Graph& g) {
  for (std::size_t i = 0; i < g.size(); ++i)
    if (ir::is_fused_attention(g.nodes()[i].op)) return static_cast<ir::ValueId>(i);
  return -1;
}

TEST(CooperativeMatrix, AttentionKernelsCompileToValidSpirv) {
  // Every forward, log-sum-exp and gradient case of the fused attention ops in f16 (masks,
  // windows, modifiers, dropout), for NVIDIA's two fragments (32 lanes: two per score row) and
  // emulated over subgroups of 8.
  Target emulated = gpu();
  emulated.subgroup_size = 8;
  emulated.cooperative_matrix.emulated = true;
  int cases = 0;
  std::array<int, 3> grads{};  // dq, dk, dv
  for (ir::Op op : {ir::Op::attention, ir::Op::masked_attention, ir::Op::flex_attention, ir::Op::attention_lse, ir::Op::masked_attention_lse,
                    ir::Op::flex_attention_lse, ir::Op::attention_grad, ir::Op::masked_attention_grad, ir::Op::flex_attention_grad})
    for (const ir::OpCase& c : ir::op_cases(op)) {
      SCOPED_TRACE(std::string(ir::op_name(op)) + ": " + c.label);
      const ir::Graph g = ir::lower_for_backend(ir::to_dtype(ir::case_graph(op, c), DType::f16), implements, ir::HalfInputs::kept);
      const ir::ValueId a = fused_attention(g);
      if (a < 0) continue;  // a modifier's tensor gradient: decomposed
      if (op == ir::Op::attention_grad || op == ir::Op::masked_attention_grad || op == ir::Op::flex_attention_grad)
        ++grads.at(static_cast<std::size_t>(g.node(a).attrs.wrt));
      for (const Target& t : {gpu(), gpu(16, 8, 16), emulated}) {
        const KernelSource k = kernel_source(g, plan_storage(g), a, t);
        EXPECT_NE(k.name.find(t.cooperative_matrix.emulated ? "_coop_emulated" : "_coop"), std::string::npos) << k.name;
        EXPECT_EQ(k.glsl.find("coopMatMulAddNV") != std::string::npos, !t.cooperative_matrix.emulated) << k.name;
        expect_valid_spirv(k, t);
      }
      ++cases;
    }
  EXPECT_GE(cases, 20);
  for (int n : grads) EXPECT_GE(n, 3);
}

TEST(CooperativeMatrix, OnlyAttentionOfF16ValuesTakesIt) {
  auto sdpa = [](DType dtype) {
    ir::Graph g;
    const ir::ValueId q = g.add_input("q", dtype, {1, 8, 4096, 64});
    ir::Attrs a;
    a.scale = 0.125;
    g.set_output("out", g.add(ir::Op::attention, {q, q, q}, a));
    return ir::lower_for_backend(g, implements, ir::HalfInputs::kept);
  };
  for (DType dtype : {DType::f32, DType::bf16}) {
    const ir::Graph g = sdpa(dtype);
    EXPECT_EQ(kernel_source(g, plan_storage(g), fused_attention(g), gpu()).name.find("coop"), std::string::npos) << dtype_name(dtype);
  }
  const ir::Graph g = sdpa(DType::f16);
  EXPECT_EQ(kernel_source(g, plan_storage(g), fused_attention(g), Target{}).name.find("coop"), std::string::npos) << "a device without";
  EXPECT_NE(kernel_source(g, plan_storage(g), fused_attention(g), gpu()).name.find("coop"), std::string::npos);
  // The training graph's kernels take it too: the forward's log-sum-exp, dq, dk and dv.
  const ir::Graph backward = ir::lower_for_backend(ir::build_backward(sdpa(DType::f16), {"", {"q"}, {"out"}}), implements, ir::HalfInputs::kept);
  int fused = 0;
  for (std::size_t i = 0; i < backward.size(); ++i)
    if (ir::is_fused_attention(backward.nodes()[i].op) && backward.nodes()[i].op != ir::Op::attention) {
      EXPECT_NE(kernel_source(backward, plan_storage(backward), static_cast<ir::ValueId>(i), gpu()).name.find("coop"), std::string::npos)
          << ir::op_name(backward.nodes()[i].op);
      ++fused;
    }
  EXPECT_GE(fused, 4);
}

/// A flash kernel's launch with its specialization constants by name.
using Spec = std::map<std::string, std::uint32_t>;
struct Launched {
  KernelLaunch launch;
  ir::Node node;
  Spec spec() const { return detail::attention_spec_constants(node).named(launch); }
};

TEST(CooperativeMatrix, AttentionTakesItWhereItsTilesFitTheSharedMemory) {
  // Head dim 64 on 48 KiB: four subgroups of 16 query rows, tiles of 32 keys (COOP: on).
  auto launch = [](std::int64_t d) {
    ir::Graph g;
    const ir::ValueId q = g.add_input("q", DType::f16, {1, 8, 1000, d});
    ir::Attrs a;
    a.scale = 0.125;
    g.set_output("out", g.add(ir::Op::attention, {q, q, q}, a));
    g = ir::lower_for_backend(g, implements, ir::HalfInputs::kept);
    std::vector<ir::Shape> shapes;
    for (const ir::Node& n : g.nodes()) shapes.push_back(n.shape);
    const ir::ValueId v = fused_attention(g);
    return Launched{kernel_launch(g, plan_storage(g), v, shapes, gpu()), g.node(v)};
  };
  const Launched l64 = launch(64);
  EXPECT_EQ(l64.spec(), (Spec{{"D4", 16}, {"DV4", 16}, {"BC", 32}, {"local_size", 128}, {"RPT", 1}, {"COOP", 1}, {"DECODE", 0}, {"SPLIT", 0}}));
  EXPECT_EQ(l64.launch.groups, (std::array<std::uint32_t, 3>{16, 8, 1}));  // 1000 queries in 64-row workgroups, 8 heads
  EXPECT_EQ(launch(128).spec(),
            (Spec{{"D4", 32}, {"DV4", 32}, {"BC", 16}, {"local_size", 128}, {"RPT", 1}, {"COOP", 1}, {"DECODE", 0}, {"SPLIT", 0}}));
  // Head dim 256: four subgroups' q rows alone take 33 KiB; two subgroups of 16 rows (64
  // invocations) with 16-key tiles.
  const Launched l256 = launch(256);
  EXPECT_EQ(l256.spec(), (Spec{{"D4", 64}, {"DV4", 64}, {"BC", 16}, {"local_size", 64}, {"RPT", 1}, {"COOP", 1}, {"DECODE", 0}, {"SPLIT", 0}}));
  EXPECT_EQ(l256.launch.groups, (std::array<std::uint32_t, 3>{32, 8, 1}));  // 1000 queries in 32-row workgroups
  // Head dim 512: not even that; the same kernel's scalar path (COOP: off), its geometry as
  // any GPU's.
  const Spec l512 = launch(512).spec();
  EXPECT_EQ(l512.at("COOP"), 0u);
  EXPECT_EQ(l512.at("local_size"), 128u);
  // dq and dk stage two operands' rows and tiles each: four subgroups with 32-row tiles at head
  // dim 64; two at 128.
  auto gradient = [](std::int64_t d, int wrt) {
    ir::Graph g;
    const ir::ValueId q = g.add_input("q", DType::f16, {1, 8, 1000, d});
    ir::Attrs a;
    a.scale = 0.125;
    g.set_output("out", g.add(ir::Op::attention, {q, q, q}, a));
    g = ir::lower_for_backend(ir::build_backward(g, {"", {"q"}, {"out"}}), implements, ir::HalfInputs::kept);
    std::vector<ir::Shape> shapes;
    for (const ir::Node& n : g.nodes()) shapes.push_back(n.shape);
    for (std::size_t i = 0; i < g.size(); ++i)
      if (g.nodes()[i].op == ir::Op::attention_grad && g.nodes()[i].attrs.wrt == wrt)
        return Launched{kernel_launch(g, plan_storage(g), static_cast<ir::ValueId>(i), shapes, gpu()), g.nodes()[i]}.spec();
    ADD_FAILURE() << "no gradient " << wrt;
    return Spec{};
  };
  for (int wrt : {0, 1}) {
    EXPECT_EQ(gradient(64, wrt), (Spec{{"D4", 16}, {"DV4", 16}, {"BC", 32}, {"local_size", 128}, {"RPT", 1}, {"COOP", 1}})) << wrt;
    EXPECT_EQ(gradient(128, wrt), (Spec{{"D4", 32}, {"DV4", 32}, {"BC", 32}, {"local_size", 64}, {"RPT", 1}, {"COOP", 1}})) << wrt;
  }
}

TEST(CooperativeMatrix, KhrTranslationRefusesWhatItCannotRewrite) {
  // One fragment fed to a multiply-add as both A and B: KHR needs two types and a conversion.
  const std::string head =
      "#version 450\n#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require\n#extension GL_EXT_shader_16bit_storage : "
      "require\n#extension GL_NV_cooperative_matrix : require\n#extension GL_KHR_memory_scope_semantics : require\nlayout(local_size_x = "
      "32) in;\nlayout(std430, binding = 0) buffer H { float16_t h[]; };\nlayout(std430, binding = 1) buffer F { float f[]; };\n";
  const std::string both = head +
                           "void main() {\n  fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> a;\n  coopMatLoadNV(a, h, 0, 16, false);\n"
                           "  fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> c = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);\n"
                           "  c = coopMatMulAddNV(a, a, c);\n  coopMatStoreNV(c, f, 0, 16, false);\n}\n";
  try {
    khr_cooperative_matrix(compile_spirv("both", both));
    ADD_FAILURE() << "no error";
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("both a multiply-add's A and its B"), std::string::npos) << e.what();
  }
  // The same with two fragments: translated, the one type declared for A and for B.
  const std::string two = head +
                          "void main() {\n  fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> a, b;\n  coopMatLoadNV(a, h, 0, 16, false);\n"
                          "  coopMatLoadNV(b, h, 256, 16, true);\n"
                          "  fcoopmatNV<32, gl_ScopeSubgroup, 16, 16> c = fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>(0.0);\n"
                          "  c = coopMatMulAddNV(a, b, c);\n  coopMatStoreNV(c, f, 0, 16, false);\n}\n";
  expect_khr_translation("two", compile_spirv("two", two));
  EXPECT_EQ(Instructions(khr_cooperative_matrix(compile_spirv("two", two))).count(Instructions::kTypeKhr), 3u);
  // A module without cooperative matrices has nothing to translate.
  EXPECT_FALSE(uses_nv_cooperative_matrix(compile_spirv("plain", "#version 450\nlayout(local_size_x = 1) in;\nvoid main() {}\n")));
}

}  // namespace
}  // namespace qkv::codegen
