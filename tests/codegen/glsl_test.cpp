// Every kernel the code generator emits for the registry's op cases compiles to SPIR-V.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "codegen/attention_glsl.hpp"
#include "codegen/fusion.hpp"
#include "codegen/glsl.hpp"
#include "codegen/glsl_files.hpp"
#include "codegen/spirv.hpp"
#include "codegen/storage_plan.hpp"
#include "ir/bind.hpp"
#include "ir/error.hpp"
#include "ir/passes/passes.hpp"
#include "sweeps/op_cases.hpp"

namespace qkv::codegen {
namespace {

TEST(Glsl, EveryOpCaseCompiles) {
  for (ir::Op op : ir::all_ops())
    for (const auto& c : ir::op_cases(op)) {
      ir::Graph g = ir::decompose_composites(ir::case_graph(op, c), implements);
      const ir::StoragePlan storage = plan_storage(g);
      for (std::size_t i = 0; i < g.size(); ++i) {
        // Every node that can have a kernel: the views of this plan too, as they would be
        // copied where a plan cannot view them.
        if (g.nodes()[i].op == ir::Op::input || g.nodes()[i].op == ir::Op::reshape) continue;
        ASSERT_FALSE(unsupported_reason(g, g.nodes()[i]).has_value()) << ir::op_name(op);
        KernelSource k = kernel_source(g, storage, static_cast<ir::ValueId>(i));
        auto words = compile_spirv(k.name, k.glsl);
        ASSERT_FALSE(words.empty());
        EXPECT_EQ(words[0], 0x07230203u) << "not SPIR-V";
      }
    }
}

TEST(Glsl, SourceDependsOnOpAndRankNotSizes) {
  auto source_for = [](std::vector<std::int64_t> shape) {
    ir::OpCase c{"x", {{shape}, {shape}}, {}};
    ir::Graph g = ir::case_graph(ir::Op::add, c);
    return kernel_source(g, plan_storage(g), g.output("out")).glsl;
  };
  EXPECT_EQ(source_for({3, 4}), source_for({30, 40}));
  EXPECT_NE(source_for({3, 4}), source_for({3, 4, 5}));
}

/// The flash-attention kernels take their launch geometry from the target (specialization
/// constants 3 and 4: invocations and rows per invocation; 5, 0 here, would select a
/// cooperative-matrix forward), not from their source: one shader
/// serves lavapipe's 8 x 8 rows per workgroup (forward) and a GPU's 128 x 1.
TEST(Glsl, AttentionGeometryIsPerTargetNotPerSource) {
  ir::Graph g;
  auto q = g.add_input("q", DType::f32, {8, 4096, 64});
  ir::Attrs a;
  a.scale = 0.125;
  auto y = g.add(ir::Op::attention, {q, q, q}, a);
  g.set_output("y", y);
  auto shapes = ir::bind_shapes(g, {{"q", Tensor(DType::f32, {8, 4096, 64})}});
  const KernelLaunch cpu = kernel_launch(g, plan_storage(g), y, shapes, Target{true}),
                     gpu = kernel_launch(g, plan_storage(g), y, shapes, Target{false});
  // D4, DV4, BC, invocations, RPT, COOP, DECODE, SPLIT.
  EXPECT_EQ(cpu.specialization, (std::vector<std::uint32_t>{16, 16, 16, 8, 8, 0, 0, 0}));
  EXPECT_EQ(gpu.specialization, (std::vector<std::uint32_t>{16, 16, 16, 128, 1, 0, 0, 0}));
  EXPECT_EQ(cpu.groups, (std::array<std::uint32_t, 3>{64, 8, 1}));  // 4096 queries / 64 per workgroup (8 x 8), 8 heads
  EXPECT_EQ(gpu.groups, (std::array<std::uint32_t, 3>{32, 8, 1}));  // 128 per workgroup
  EXPECT_EQ(cpu.push, gpu.push);
  // Where the device has 48 KiB of shared memory, tiles of 32 keys fit (2 x 8 KiB).
  EXPECT_EQ(kernel_launch(g, plan_storage(g), y, shapes, Target{false, 49152}).specialization,
            (std::vector<std::uint32_t>{16, 16, 32, 128, 1, 0, 0, 0}));
  // A tuning experiment's override (QKV_VULKAN_ATTENTION_GEOMETRY=32,4,8): 128 rows per workgroup.
  const KernelLaunch tuned = kernel_launch(g, plan_storage(g), y, shapes, Target{false, 49152, 32, 4, 8});
  EXPECT_EQ(tuned.specialization, (std::vector<std::uint32_t>{16, 16, 8, 32, 4, 0, 0, 0}));
  EXPECT_EQ(tuned.groups, (std::array<std::uint32_t, 3>{32, 8, 1}));
  // Head dims 2048: the registers suffice, one row of keys and values (16 KiB) does not fit in
  // the 16 KiB every device has, but does in 48 KiB.
  ir::Graph wide;
  auto w = wide.add_input("q", DType::f32, {1, 8, 2048});
  auto wy = wide.add(ir::Op::attention, {w, w, w}, a);
  auto wide_shapes = ir::bind_shapes(wide, {{"q", Tensor(DType::f32, {1, 8, 2048})}});
  try {
    kernel_launch(wide, plan_storage(wide), wy, wide_shapes, Target{false, 16384});
    ADD_FAILURE() << "16 KiB of keys and values per row in 16 KiB of shared memory";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("head dims 2048 and 2048 needs more than 16384 bytes of shared memory"), std::string::npos) << e.what();
  }
  const KernelLaunch wide_launch = kernel_launch(wide, plan_storage(wide), wy, wide_shapes, Target{false, 49152});
  EXPECT_EQ(detail::attention_spec_constants(wide.node(wy)).named(wide_launch).at("BC"), 2u);  // two rows per tile
  auto words = compile_spirv(kernel_source(g, plan_storage(g), y).name, kernel_source(g, plan_storage(g), y).glsl);
  EXPECT_FALSE(words.empty());
}

/// Flex attention's modifier is inlined as a GLSL function of the score and its indices, its
/// expression in a comment; each tensor it reads is addressed by which of the scores' dims it
/// spans, a specialization constant (here per-head slopes [3, 1, 1] of scores [2, 3, 6, 8]: the
/// head dim only), so one shader serves every sequence length. The gradients evaluate the
/// modifier and its derivative together.
TEST(Glsl, FlexModifierIsInlinedWithItsTensorsDims) {
  auto find = [](ir::Op op, const std::string& label) {
    for (const ir::OpCase& c : ir::op_cases(op))
      if (c.label == label) return c;
    ADD_FAILURE() << "no case " << label;
    return ir::OpCase{};
  };
  const ir::OpCase forward = find(ir::Op::flex_attention, "slopes per head causal");
  ir::Graph g = ir::case_graph(ir::Op::flex_attention, forward);
  const ir::ValueId y = g.output("out");
  const KernelSource k = kernel_source(g, plan_storage(g), y);
  EXPECT_EQ(k.name, "flash_attention_forward_flex_causal_b2");
  EXPECT_EQ(k.buffers, 7);  // q, k, v, the slopes, the output, the tile counter, the split buffer
  EXPECT_TRUE(k.counts_tiles);
  EXPECT_EQ(k.glsl.find("tile_masked"), std::string::npos) << "slopes never mask: no tile is tested";
  EXPECT_NE(k.glsl.find("// The score modifier, mod = score + t0 * (kv_idx - q_idx).\nfloat score_mod(float score, uint q_idx, uint kv_idx) {"),
            std::string::npos)
      << k.glsl;
  EXPECT_NE(k.glsl.find("T0[t0_at + q_idx * t0_row + kv_idx * t0_col]"), std::string::npos);
  EXPECT_NE(k.glsl.find("sc[t][j] = score_mod(sum4(s4[t]) * scale, own(t), t0 + c)"), std::string::npos);
  std::map<std::string, Tensor, std::less<>> in;
  for (std::size_t i = 0; i < forward.inputs.size(); ++i) in.emplace("x" + std::to_string(i), Tensor(DType::f32, forward.inputs[i].shape));
  const KernelLaunch l = kernel_launch(g, plan_storage(g), y, ir::bind_shapes(g, in), Target{true});
  EXPECT_EQ(detail::attention_spec_constants(g.node(y)).named(l).at("T0_DIMS"), 0b0010u) << "the slopes span the heads (dim 1 of 4) only";
  EXPECT_FALSE(compile_spirv(k.name, k.glsl).empty());

  ir::Graph grad = ir::case_graph(ir::Op::flex_attention_grad, find(ir::Op::flex_attention_grad, "dq slopes per head causal"));
  const KernelSource kd = kernel_source(grad, plan_storage(grad), grad.output("out"));
  EXPECT_EQ(kd.name, "flash_attention_dq_flex_causal_b2");
  EXPECT_NE(kd.glsl.find("vec2 score_mod_d(float score, uint q_idx, uint kv_idx)"), std::string::npos) << kd.glsl;
  EXPECT_NE(kd.glsl.find("ds[t] = pr * (sum4(dp4[t]) - delta_r[t]) * dmod;"), std::string::npos) << kd.glsl;
  EXPECT_FALSE(compile_spirv(kd.name, kd.glsl).empty());
}

/// A modifier that can mask (document ids: where(doc_q == doc_kv, score, -inf)) makes every
/// flash kernel test its tiles: the ids' ranges over the tile's queries and keys are gathered
/// in shared memory and the region is bounded from them by interval arithmetic in GLSL, node for
/// node as ir::bound_region; the tile is skipped when the bound is exactly -inf.
TEST(Glsl, MaskingModifierTestsEachTileByIntervalArithmetic) {
  auto find = [](ir::Op op, const std::string& label) {
    for (const ir::OpCase& c : ir::op_cases(op))
      if (c.label == label) return c;
    ADD_FAILURE() << "no case " << label;
    return ir::OpCase{};
  };
  for (const auto& [op, label] :
       {std::pair{ir::Op::flex_attention, "document ids, empty rows"}, std::pair{ir::Op::flex_attention_grad, "dq document ids, empty rows"}}) {
    ir::Graph g = ir::case_graph(op, find(op, label));
    const KernelSource k = kernel_source(g, plan_storage(g), g.output("out"));
    SCOPED_TRACE(k.name);
    EXPECT_NE(k.glsl.find("Iv bound_mod(Iv q_idx, Iv kv_idx, Iv t0, Iv t1) {"), std::string::npos) << k.glsl;
    EXPECT_NE(k.glsl.find(" = t1;  // cast"), std::string::npos) << k.glsl;
    EXPECT_NE(k.glsl.find(" = iv_equal(v"), std::string::npos) << k.glsl;
    EXPECT_NE(k.glsl.find(" = iv_where("), std::string::npos) << k.glsl;
    EXPECT_NE(k.glsl.find("if (may_skip && tile_masked("), std::string::npos) << k.glsl;
    EXPECT_NE(k.glsl.find("range_add(slot * 2u + 1u, T1["), std::string::npos) << k.glsl;
    // A tile whose ids provably match runs the modifier without the mask (FlexAttention's full
    // blocks): its condition bounded by keeps_mod, and a score_mod without the ids' reads.
    EXPECT_NE(k.glsl.find("bool keeps_mod(Iv q_idx, Iv kv_idx, Iv t0, Iv t1) {"), std::string::npos) << k.glsl;
    EXPECT_NE(k.glsl.find("tile_unmasked = !masked && keeps_mod("), std::string::npos) << k.glsl;
    const std::string fn = op == ir::Op::flex_attention ? "score_mod" : "score_mod_d";
    const std::size_t kept = k.glsl.find(fn + "_kept(float score, uint q_idx, uint kv_idx) {");
    ASSERT_NE(kept, std::string::npos) << k.glsl;
    EXPECT_EQ(k.glsl.substr(kept, k.glsl.find("\n}", kept) - kept).find("T1["), std::string::npos) << "the kept form reads no ids\n" << k.glsl;
    EXPECT_NE(k.glsl.find("return tile_unmasked ? " + fn + "_kept("), std::string::npos) << k.glsl;
    EXPECT_FALSE(compile_spirv(k.name, k.glsl).empty());
  }
}

/// Templates: longer names first, a placeholder alone on its line standing for whole lines (or
/// none), and inline elsewhere.
TEST(GlslTemplate, FillsInOnePassWholeLinesInPlace) {
  // Names end where capitals, digits and underscores do ($AT is not $A then T); ${NAME} where text
  // continues it.
  EXPECT_EQ(fill_glsl("a $AT $A ${A}T $Au\n", {{"A", "1"}, {"AT", "2"}}), "a 2 1 1T 1u\n");
  // A placeholder alone on its line with whole lines (or none) for a value: those lines in its place.
  EXPECT_EQ(fill_glsl("$LINES\n  x;\n$NONE\nend\n", {{"LINES", "l1\nl2\n"}, {"NONE", ""}}), "l1\nl2\n  x;\nend\n");
  // Not alone: the line and its newline stay.
  EXPECT_EQ(fill_glsl("x;$E\n$E y\n", {{"E", ""}}), "x;\n y\n");
  EXPECT_EQ(fill_glsl("$X\n", {{"X", "y"}}), "y\n");  // a value that is not whole lines
  // Values are not read for placeholders: a value naming one (a region input called $R) stays.
  EXPECT_EQ(fill_glsl("$X $R\n", {{"X", "$X $R"}, {"R", "r"}}), "$X $R r\n");
  EXPECT_EQ(fill_glsl("$ 2$ $x\n", {}), "$ 2$ $x\n");  // not placeholders
}

/// Every file of codegen/glsl/ is embedded as it is, and every .comp file is a whole kernel.
TEST(GlslTemplate, EveryFileOfTheFolderIsEmbedded) {
  std::set<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::path(QKV_SOURCE_DIR) / "codegen" / "glsl")) {
    const std::string name = entry.path().filename().string();
    files.insert(name);
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(glsl_file(name), text) << name;
    if (name.ends_with(".comp")) {
      EXPECT_NE(text.find("void main()"), std::string::npos) << name;
    }
  }
  const std::vector<std::string_view> embedded = glsl_file_names();
  EXPECT_EQ(std::set<std::string>(embedded.begin(), embedded.end()), files);
  EXPECT_GE(files.size(), 30u);
}

TEST(GlslTemplateDeathTest, APlaceholderLeftUnfilledOrFilledTwiceStops) {
  EXPECT_DEATH(glsl_template("qkv_philox.glsl", {{"M0", "1u"}, {"M1", "2u"}, {"W0", "3u"}, {"W1", "4u"}}), "qkv_philox.glsl: no value for \\$KEY1");
  // The value of $OWN is no value for $OWNCOUNT.
  EXPECT_DEATH(fill_glsl("$OWNCOUNT\n", {{"OWN", "qi"}}), "no value for \\$OWNCOUNT");
  EXPECT_DEATH(fill_glsl("$A\n", {{"A", "1"}, {"A", "2"}}), "\\$A given twice");
  EXPECT_DEATH(fill_glsl("${A\n", {{"A", "1"}}), "\\$\\{A is not closed");
}

TEST(Glsl, EmitGraphNamesEachNode) {
  ir::Graph g = ir::case_graph(ir::Op::softmax, ir::op_cases(ir::Op::softmax)[0]);
  std::string s = emit_glsl(g, plan_storage(g));
  EXPECT_NE(s.find("// ---- %1 = softmax"), std::string::npos);
  EXPECT_NE(s.find("#version 450"), std::string::npos);
}

// Without spirv-opt's passes (what the test programs run) a kernel compiles to other, larger
// words, cached apart from the optimised ones.
TEST(Spirv, OptimisationIsACompilerSettingOfTheCache) {
  ir::Graph g = ir::case_graph(ir::Op::flex_attention, ir::op_cases(ir::Op::flex_attention).front());
  const KernelSource k = kernel_source(g, plan_storage(g), g.output("out"));
  const auto optimised = compile_spirv(k.name, k.glsl, SpirvOptimization::performance);
  const auto plain = compile_spirv(k.name, k.glsl, SpirvOptimization::none);
  EXPECT_NE(optimised, plain);
  EXPECT_GT(plain.size(), optimised.size());
  EXPECT_EQ(compile_spirv(k.name, k.glsl), optimised) << "the default is the optimised kernel";
  EXPECT_EQ(compile_spirv(k.name, k.glsl, SpirvOptimization::none), plain);
}

TEST(Spirv, CompileErrorsAreBackendErrors) { EXPECT_THROW(compile_spirv("broken", "#version 450\nvoid main() { nope(); }\n"), BackendError); }

}  // namespace
}  // namespace qkv::codegen

namespace qkv::codegen {
namespace {

TEST(ShaderCache, BadEntriesAreRecompiledNotTrusted) {
  const auto dir = std::filesystem::temp_directory_path() / ("qkv_cache_" + std::to_string(::getpid()));
  const auto file = dir / "entry.qkvspv";
  const std::vector<std::uint32_t> words{0x07230203u, 0x00010300u, 7, 8, 9};
  ASSERT_TRUE(store_cached_spirv(file, 42, words));
  EXPECT_EQ(load_cached_spirv(file, 42), words);
  EXPECT_EQ(load_cached_spirv(file, 43), std::nullopt);  // another key's entry
  const auto size = std::filesystem::file_size(file);
  std::filesystem::resize_file(file, size - 3);  // truncated
  EXPECT_EQ(load_cached_spirv(file, 42), std::nullopt);
  ASSERT_TRUE(store_cached_spirv(file, 42, words));
  {  // one flipped bit in the words
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size - 2));
    f.put('\x55');
  }
  EXPECT_EQ(load_cached_spirv(file, 42), std::nullopt);
  std::ofstream(file, std::ios::binary) << "\x03\x02\x23\x07 not a cache entry";  // a raw .spv of old
  EXPECT_EQ(load_cached_spirv(file, 42), std::nullopt);
  for (const auto& e : std::filesystem::directory_iterator(dir)) EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace qkv::codegen
