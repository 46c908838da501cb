// The cpu and vulkan backends run attention fused, forward and backward: no score matrix in their
// memory plans, and the same numbers as the reference, NaN included.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>

#include "backends/backend.hpp"
#include "backends/cpu/attention.hpp"
#include "backends/equivalence.hpp"
#include "backends/reference/reference_backend.hpp"
#include "backends/vulkan/context.hpp"
#include "backends/vulkan/vulkan_backend.hpp"
#include "codegen/glsl.hpp"
#include "dsl/dsl.hpp"
#include "ir/bind.hpp"
#include "ir/passes/passes.hpp"
#include "ir/printer.hpp"
#include "ir/region.hpp"
#include "tests/support/backend_fixture.hpp"

namespace qkv {
namespace {

TEST(FusedAttention, CpuMemoryIsLinearInSequenceLength) {
  auto q = input<"q">(dim<"B">, dim<"N">, dim<64>);
  ir::Graph g = lower(scaled_dot_product_attention(q, q, q, causal));
  auto exe = backend::create("cpu")->compile(g);
  bool fused = false;
  for (const auto& n : exe->graph().nodes()) fused |= n.op == ir::Op::attention;
  EXPECT_TRUE(fused) << "the cpu backend did not fuse attention";
  const std::int64_t n = 2048;
  exe->run(backend::random_inputs(g, {{"B", 1}, {"N", n}}, 1));
  // The output (N x 64 floats) is all it plans; the N x N scores would be 16 MiB.
  EXPECT_LE(exe->planned_bytes(), 2 * n * 64 * 4);
  auto unfused = backend::create("reference")->compile(g);
  unfused->run(backend::random_inputs(g, {{"B", 1}, {"N", 64}}, 1));
  EXPECT_GE(unfused->planned_bytes(), 64 * 64 * 8) << "the reference materialises the scores";
}

TEST(FusedAttention, CpuBackwardKeepsAttentionFusedAndMemoryLinear) {
  auto q = input<"q">(dim<1>, dim<"N">, dim<64>);
  auto k = input<"k">(dim<1>, dim<"N">, dim<64>);
  auto v = input<"v">(dim<1>, dim<"N">, dim<64>);
  ir::Graph forward = lower(named<"out">(scaled_dot_product_attention(q, k, v, causal)));
  ir::Graph g = ir::build_backward(forward, {"", {"q", "k", "v"}, {"out"}});
  auto cpu = backend::create("cpu");
  auto exe = cpu->compile(g);
  // What `qkv explain` says: one backward kernel, the other gradients and the lse in others'.
  std::vector<std::string> kernels;
  for (std::size_t i = 0; i < exe->graph().size(); ++i) {
    const ir::Node& n = exe->graph().nodes()[i];
    EXPECT_NE(n.op, ir::Op::softmax);
    EXPECT_NE(n.op, ir::Op::matmul);
    if (n.op == ir::Op::attention_grad || n.op == ir::Op::attention_lse)
      kernels.push_back(std::string(ir::op_name(n.op)) + ": " + cpu->kernel_name(exe->graph(), static_cast<ir::ValueId>(i)));
  }
  EXPECT_EQ(kernels, (std::vector<std::string>{"attention_lse: (in %3's kernel)", "attention_grad: fused attention backward (FlashAttention-2)",
                                               "attention_grad: (in %8's kernel with a batch entry per thread)",
                                               "attention_grad: (in %8's kernel with a batch entry per thread)"}));
  const std::int64_t n = 4096;
  auto out = exe->run(backend::random_inputs(g, {{"N", n}}, 3));
  for (const char* name : {"d_q", "d_k", "d_v"}) EXPECT_EQ(out.at(name).numel(), n * 64) << name;
  // The output, lse and delta, the three gradients and dy * y: about 6 N x 64 floats (6 MiB);
  // one N x N matrix would be 64 MiB.
  EXPECT_LE(exe->planned_bytes(), 8 * n * 64 * 4);
}

/// Score modifiers the attention library writes (soft-capping, ALiBi with causality, a float bias
/// and a boolean mask after soft-capping) run as fused flex attention on the cpu, forward and
/// backward: no softmax left, linear memory at N = 2048, and the reference's
/// numbers (forward and the gradients of q, k, v and a trained bias).
TEST(FusedAttention, CpuFlexModifiersRunFusedForwardAndBackward) {
  auto q = input<"q">(dim<1>, dim<4>, dim<"N">, dim<64>);
  auto k = input<"k">(dim<1>, dim<4>, dim<"N">, dim<64>);
  auto v = input<"v">(dim<1>, dim<4>, dim<"N">, dim<64>);
  auto mask = input<"mask", DType::boolean>(dim<"N">, dim<"N">);
  auto bias = input<"bias">(dim<4>, dim<1>, dim<"N">);
  const std::vector<std::pair<std::string, ir::Graph>> models = {
      {"softcap", lower(named<"out">(scaled_dot_product_attention(q, k, v, softcap_scores(2.0))))},
      {"alibi causal", lower(named<"out">(scaled_dot_product_attention(q, k, v, causal_bottom_right, alibi_bias<4>(k))))},
      {"bias", lower(named<"out">(scaled_dot_product_attention(q, k, v, bias)))},
      {"mask after softcap", lower(named<"out">(scaled_dot_product_attention(q, k, v, mask, softcap_scores(3.0))))}};
  auto cpu = backend::create("cpu");
  for (const auto& [name, forward] : models) {
    std::vector<std::string> wrt = {"q", "k", "v"};
    if (name == "bias") wrt.push_back("bias");
    ir::Graph g = ir::build_backward(forward, {"", wrt, {"out"}});
    auto exe = cpu->compile(g);
    int flex = 0, grads = 0;
    for (std::size_t i = 0; i < exe->graph().size(); ++i) {
      const ir::Node& n = exe->graph().nodes()[i];
      EXPECT_NE(n.op, ir::Op::softmax) << name;
      flex += n.op == ir::Op::flex_attention;
      grads += n.op == ir::Op::flex_attention_grad && n.attrs.wrt < 3;
      if (n.op == ir::Op::flex_attention) {
        EXPECT_NE(cpu->kernel_name(exe->graph(), static_cast<ir::ValueId>(i)).find("fused flex attention (online softmax), mod = "),
                  std::string::npos);
      }
    }
    EXPECT_EQ(flex, 1) << name << "\n" << ir::print(exe->graph());
    EXPECT_EQ(grads, 3) << name << "\n" << ir::print(exe->graph());
    testing::expect_equivalent(g, backend::random_inputs(g, {{"N", 37}}, 5), "cpu");
    if (name == "bias") continue;  // a trained bias's gradient is score-sized before its sum
    const std::int64_t n = 2048;
    exe->run(backend::random_inputs(g, {{"N", n}}, 3));
    // Per head: output, lse, delta, three gradients, dy * y (N x 64 each); a mask is N x N bytes
    // widened to floats (an input, 16 MiB here); the scores would be 64 MiB.
    const std::int64_t inputs = name == "mask after softcap" ? n * n * 4 : 0;
    EXPECT_LE(exe->planned_bytes(), inputs + 4 * 8 * n * 64 * 4) << name;
  }
}

/// With a batch entry per thread or more, the cpu backend computes dq, dk and dv in one kernel
/// (one pass over the scores); with fewer, one kernel each (B = 1 here on machines with more than
/// two threads; the registry sweep of attention_grad runs the separate kernels everywhere).
/// Against the reference, with broadcast k and v (grouped heads), a padding mask, and a sliding
/// window that skips blocks.
TEST(FusedAttention, CpuBackwardMatchesReferenceJointAndSeparate) {
  auto q = input<"q">(dim<"B">, dim<2>, dim<"N">, dim<16>);
  auto k = input<"k">(dim<"B">, dim<1>, dim<"M">, dim<16>);
  auto v = input<"v">(dim<"B">, dim<1>, dim<"M">, dim<8>);
  auto keep = input<"keep", DType::boolean>(dim<"B">, dim<1>, dim<1>, dim<"M">);
  auto loss = [](auto y) { return named<"loss">(sum_all(y * y)); };
  const ir::Graph graphs[] = {
      lower(loss(scaled_dot_product_attention(q, k, v, sliding_window<40>))),
      lower(loss(scaled_dot_product_attention(q, k, v, keep))),
  };
  for (const ir::Graph& forward : graphs) {
    ir::Graph g = ir::build_backward(forward, {"loss", {"q", "k", "v"}, {}});
    for (std::int64_t batch : {1, 40}) {
      SCOPED_TRACE(batch);
      auto in = backend::random_inputs(g, {{"B", batch}, {"N", 150}, {"M", 300}}, 5);
      testing::expect_equivalent(g, in, "cpu");
    }
  }
}

/// The forward kernel writes attention_lse's rows while it still reads v; when v is a value only
/// attention reads, the plan may give the lse v's bytes, and the two must then run apart.
TEST(FusedAttention, CpuLseBesideTheForwardNeverOverwritesItsOperands) {
  ir::Graph g = ir::parse_graph(
      "graph {\n"
      "  %0 = input \"q\" : f32[2,300,8]\n"
      "  %1 = input \"k\" : f32[2,300,8]\n"
      "  %2 = input \"x\" : f32[2,300,8]\n"
      "  %3 = exp(%2) : f32[2,300,8]\n"
      "  %4 = attention(%0, %1, %3) {scale=0.35, causal=true, align=top_left} : f32[2,300,8]\n"
      "  %5 = attention_lse(%0, %1) {scale=0.35, causal=true, align=top_left} : f32[2,300,1]\n"
      "  return y=%4, lse=%5\n"
      "}\n");
  testing::expect_equivalent(g, backend::random_inputs(g, {}, 11), "cpu");
}

/// Vulkan runs the forward, the lse and the three gradients as flash-attention shaders; forward +
/// backward at N = 2048 plans O(N D) memory (one N x N matrix would be 16 MiB). Head dim 32:
/// lavapipe took a minute compiling the five kernels at 64.
TEST(FusedAttention, VulkanForwardAndBackwardAreFlashKernelsInLinearMemory) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  auto q = input<"q">(dim<1>, dim<"N">, dim<32>);
  auto k = input<"k">(dim<1>, dim<"N">, dim<32>);
  auto v = input<"v">(dim<1>, dim<"N">, dim<32>);
  ir::Graph forward = lower(named<"out">(scaled_dot_product_attention(q, k, v, causal)));
  ir::Graph g = ir::build_backward(forward, {"", {"q", "k", "v"}, {"out"}});
  auto exe = vulkan->compile(g);
  std::vector<std::string> kernels;
  for (std::size_t i = 0; i < exe->graph().size(); ++i) {
    const ir::Node& n = exe->graph().nodes()[i];
    EXPECT_NE(n.op, ir::Op::softmax);
    EXPECT_NE(n.op, ir::Op::matmul);
    const std::string kernel = vulkan->kernel_name(exe->graph(), static_cast<ir::ValueId>(i));
    if (kernel.find("flash_attention") != std::string::npos) kernels.push_back(kernel);
  }
  EXPECT_EQ(kernels, (std::vector<std::string>{"glsl flash_attention_forward_causal_b1", "glsl flash_attention_lse_causal_b1",
                                               "glsl flash_attention_dq_causal_b1", "glsl flash_attention_dk_causal_b1",
                                               "glsl flash_attention_dv_causal_b1"}));
  const std::int64_t n = 2048;
  auto out = exe->run(backend::random_inputs(g, {{"N", n}}, 3));
  for (const char* name : {"d_q", "d_k", "d_v"}) EXPECT_EQ(out.at(name).numel(), n * 32) << name;
  // The arena also holds the four inputs: with the output, its three gradients, dy * y, lse and
  // delta, about 9 N x 32 floats (2.3 MiB); one N x N matrix would be 16 MiB.
  EXPECT_LE(exe->planned_bytes(), 10 * n * 32 * 4);
}

/// The vulkan kernels against the reference where tiles are skipped (causal, a sliding window),
/// with grouped heads (k and v broadcast), a padding mask, and head dims that are not multiples
/// of 4, forward and backward, in both launch geometries (lavapipe's 8 x 8 and 16 x 4 rows per workgroup
/// and a GPU's 128 x 1), whichever device runs the test.
TEST(FusedAttention, VulkanMatchesReferenceWithSkippedTilesMasksAndOddHeadDims) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  const auto tunings = testing::vulkan_tunings();
  auto q = input<"q">(dim<"B">, dim<2>, dim<"N">, dim<13>);
  auto k = input<"k">(dim<"B">, dim<1>, dim<"M">, dim<13>);
  auto v = input<"v">(dim<"B">, dim<1>, dim<"M">, dim<6>);
  auto keep = input<"keep", DType::boolean>(dim<"B">, dim<1>, dim<1>, dim<"M">);
  auto loss = [](auto y) { return named<"loss">(sum_all(y * y)); };
  const ir::Graph graphs[] = {
      lower(loss(scaled_dot_product_attention(q, k, v, sliding_window<40>))),
      lower(loss(scaled_dot_product_attention(q, k, v, causal_bottom_right))),
      lower(loss(scaled_dot_product_attention(q, k, v, keep, causal))),
  };
  for (const ir::Graph& forward : graphs) {
    ir::Graph g = ir::build_backward(forward, {"loss", {"q", "k", "v"}, {}});
    for (auto& b : tunings) testing::expect_equivalent(g, backend::random_inputs(g, {{"B", 2}, {"N", 150}, {"M", 200}}, 5), *b);
  }
}

/// The same modifiers on vulkan, plus a relative-position bias slope * (kv_idx - q_idx) from
/// iotas: each runs as generated flash kernels with the modifier inlined as GLSL (forward, lse,
/// dq, dk, dv; a trained tensor's score-shaped gradient is the decomposition's), the reference's
/// numbers in both launch geometries, and forward + backward at N = 2048 in linear memory.
TEST(FusedAttention, VulkanFlexModifiersRunAsGeneratedFlashKernels) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  const auto tunings = testing::vulkan_tunings();
  auto q = input<"q">(dim<1>, dim<2>, dim<"N">, dim<24>);
  auto k = input<"k">(dim<1>, dim<2>, dim<"N">, dim<24>);
  auto v = input<"v">(dim<1>, dim<2>, dim<"N">, dim<24>);
  auto mask = input<"mask", DType::boolean>(dim<"N">, dim<"N">);
  auto bias = input<"bias">(dim<2>, dim<1>, dim<"N">);
  auto slope = input<"slope">(dim<1>);
  auto grid = matmul<false, true>(q, k);  // iota reads only its shape
  auto rel = (iota<-1>(grid) - iota<-2>(grid)) * slope;
  const std::vector<std::tuple<std::string, ir::Graph, std::vector<std::string>>> models = {
      {"softcap", lower(named<"out">(scaled_dot_product_attention(q, k, v, softcap_scores(2.0)))), {}},
      {"alibi causal", lower(named<"out">(scaled_dot_product_attention(q, k, v, causal_bottom_right, alibi_bias<2>(k)))), {}},
      {"bias", lower(named<"out">(scaled_dot_product_attention(q, k, v, bias))), {"bias"}},
      {"mask after softcap", lower(named<"out">(scaled_dot_product_attention(q, k, v, mask, softcap_scores(3.0)))), {}},
      {"relative position", lower(named<"out">(scaled_dot_product_attention(q, k, v, rel, causal))), {"slope"}}};
  for (const auto& [name, forward, trained] : models) {
    SCOPED_TRACE(name);
    std::vector<std::string> wrt = {"q", "k", "v"};
    wrt.insert(wrt.end(), trained.begin(), trained.end());
    ir::Graph g = ir::build_backward(forward, {"", wrt, {"out"}});
    auto exe = vulkan->compile(g);
    std::vector<std::string> kernels;
    for (std::size_t i = 0; i < exe->graph().size(); ++i) {
      const ir::Node& n = exe->graph().nodes()[i];
      EXPECT_NE(n.op, ir::Op::softmax);
      const std::string kernel = vulkan->kernel_name(exe->graph(), static_cast<ir::ValueId>(i));
      if (kernel.find("flash_attention") == std::string::npos) continue;
      EXPECT_NE(kernel.find("_flex"), std::string::npos) << kernel;
      kernels.push_back(kernel.substr(0, kernel.find("_flex")));
    }
    EXPECT_EQ(kernels, (std::vector<std::string>{"glsl flash_attention_forward", "glsl flash_attention_lse", "glsl flash_attention_dq",
                                                 "glsl flash_attention_dk", "glsl flash_attention_dv"}))
        << ir::print(exe->graph());
    // A GPU's geometry for the modifiers that read positions or a tensor (their indices come from
    // the lanes' layout); soft-capping is the same code in either.
    for (auto& b : tunings)
      if (b == tunings.front() || name != "softcap") testing::expect_equivalent(g, backend::random_inputs(g, {{"N", 70}}, 5), *b);
    if (!trained.empty()) continue;  // a trained tensor's gradient is score-sized before its sum
    const std::int64_t n = 2048;
    exe->run(backend::random_inputs(g, {{"N", n}}, 3));
    // The inputs, output, lse, delta, three gradients and dy * y, per head about 10 N x 24 floats
    // (a mask: N x N floats, an input); the scores would be N x N floats per head, 32 MiB.
    const std::int64_t inputs = name == "mask after softcap" ? n * n * 4 : 0;
    EXPECT_LE(exe->planned_bytes(), inputs + 2 * 12 * n * 24 * 4);
  }
}

/// Dropout on the weights runs inside the fused kernels, forward and backward: no dropout_mask,
/// softmax or score matrix left, and the reference's numbers, which come from the unfused meaning
/// (weights * dropout_mask(weights, seed)): the same Philox bits for the same weight in the
/// forward, the backward and on every backend. With and without a modifier (soft-capping, which
/// brings its derivative into dq and dk), causal (skipped blocks) or not; linear memory at N = 2048.
void expect_dropout_fused(backend::Backend& b) {
  SCOPED_TRACE(b.name());
  auto q = input<"q">(dim<1>, dim<2>, dim<"N">, dim<24>);
  auto k = input<"k">(dim<1>, dim<2>, dim<"N">, dim<24>);
  auto v = input<"v">(dim<1>, dim<2>, dim<"N">, dim<20>);
  auto seed = input<"seed", DType::i32>();
  const std::vector<std::pair<std::string, ir::Graph>> models = {
      {"causal", lower(named<"out">(scaled_dot_product_attention(q, k, v, causal, attn_dropout(0.2, seed))))},
      {"softcap", lower(named<"out">(scaled_dot_product_attention(q, k, v, softcap_scores(2.0), attn_dropout(0.5, seed))))}};
  for (const auto& [name, forward] : models) {
    SCOPED_TRACE(name);
    ir::Graph g = ir::build_backward(forward, {"", {"q", "k", "v"}, {"out"}});
    auto exe = b.compile(g);
    int flex = 0, dropped_grads = 0;
    for (std::size_t i = 0; i < exe->graph().size(); ++i) {
      const ir::Node& n = exe->graph().nodes()[i];
      EXPECT_NE(n.op, ir::Op::softmax);
      EXPECT_NE(n.op, ir::Op::dropout_mask);
      const std::string kernel = b.kernel_name(exe->graph(), static_cast<ir::ValueId>(i));
      if (n.op == ir::Op::flex_attention) {
        ++flex;
        EXPECT_NE(kernel.find("dropout"), std::string::npos) << kernel;
      }
      dropped_grads += n.op == ir::Op::flex_attention_grad && n.attrs.dropout > 0;
    }
    EXPECT_EQ(flex, 1) << ir::print(exe->graph());
    EXPECT_EQ(dropped_grads, 3) << ir::print(exe->graph());
    auto in = backend::random_inputs(g, {{"N", 150}}, 5);
    testing::expect_equivalent(g, in, b);
    // Another seed drops other weights.
    auto other = in;
    other.at("seed").data<std::int32_t>()[0] += 1;
    const Tensor a = exe->run(in).at("out"), c = exe->run(other).at("out");
    double diff = 0;
    for (std::int64_t i = 0; i < a.numel(); ++i) diff += std::abs(a.at(i) - c.at(i));
    EXPECT_GT(diff, 1.0) << "the seed keys the mask";
  }
  ir::Graph g = ir::build_backward(models[0].second, {"", {"q", "k", "v"}, {"out"}});
  const std::int64_t n = 2048;
  auto exe = b.compile(g);
  exe->run(backend::random_inputs(g, {{"N", n}}, 3));
  // Inputs, output, lse, delta, three gradients and dy * y, about 12 N x 24 floats per head;
  // the weights would be N x N floats per head, 32 MiB.
  EXPECT_LE(exe->planned_bytes(), 2 * 12 * n * 24 * 4);
}

TEST(FusedAttention, CpuRunsDropoutInsideTheFusedKernels) { expect_dropout_fused(*backend::create("cpu")); }

TEST(FusedAttention, VulkanRunsDropoutInsideTheFlashKernels) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  for (auto& b : testing::vulkan_tunings()) expect_dropout_fused(*b);
}

/// Head dims beyond what the flash kernels hold per row (registers; on small devices shared
/// memory, see Glsl.AttentionGeometryIsPerTargetNotPerSource) are refused by name at planning,
/// not run out of bounds or compiled for half a minute.
TEST(FusedAttention, VulkanRefusesHeadDimsBeyondItsLimits) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  auto q = input<"q">(dim<1>, dim<4>, dim<"D">);
  ir::Graph g = lower(scaled_dot_product_attention(q, q, q));
  auto exe = vulkan->compile(g);
  try {
    exe->run(backend::random_inputs(g, {{"D", 4096}}, 1));
    FAIL() << "ran with 32 KiB of keys and values per row";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("head dims 4096 and 4096"), std::string::npos) << e.what();
  }
  // (16: lavapipe takes half a minute compiling the forward at 64.)
  EXPECT_EQ(exe->run(backend::random_inputs(g, {{"D", 16}}, 1)).begin()->second.numel(), 4 * 16) << "smaller dims still run";
}

/// A NaN that only masked scores meet, in a tile the causal kernels would skip, still gives NaN
/// as in the decomposition (0 * NaN): in v for the forward, in the output gradient for the
/// backward. The kernels check before they skip.
TEST(FusedAttention, NaNBehindSkippedTilesPropagatesOnEveryBackend) {
  auto q = input<"q">(dim<1>, dim<"N">, dim<8>);
  auto k = input<"k">(dim<1>, dim<"N">, dim<8>);
  auto v = input<"v">(dim<1>, dim<"N">, dim<8>);
  ir::Graph forward = lower(named<"out">(scaled_dot_product_attention(q, k, v, causal)));
  ir::Graph g = ir::build_backward(forward, {"", {"q", "k", "v"}, {"out"}});
  const std::int64_t n = 300;
  auto in = backend::random_inputs(g, {{"N", n}}, 9);
  in.at("v").data<float>()[250 * 8 + 3] = std::numeric_limits<float>::quiet_NaN();    // key 250, masked for rows < 250
  in.at("dout").data<float>()[20 * 8 + 5] = std::numeric_limits<float>::quiet_NaN();  // query 20, masked for keys > 20
  auto want = backend::make_reference_backend({backend::Precision::f64, true})->compile(g)->run(in);
  EXPECT_TRUE(std::isnan(want.at("out").at(3))) << "row 0 meets key 250's NaN only through a masked zero";
  for (const char* name : {"cpu", "vulkan"}) {
    SCOPED_TRACE(name);
    QKV_GET_BACKEND_OR_SKIP(b, name);
    testing::expect_equivalent(g, in, name);
  }
}

/// Modifiers written as score_mod and mask_mod mean what the library's options mean: the same
/// outputs on the reference, and fused on cpu and vulkan, forward and backward, within budgets.
/// ALiBi written FlexAttention's way, slope[h] * (kv_idx - q_idx), differs from alibi_bias by a
/// constant per row, which softmax ignores.
TEST(FusedAttention, ScoreAndMaskModsMeanWhatTheOptionsMean) {
  auto q = input<"q">(dim<"B">, dim<2>, dim<"N">, dim<16>);
  auto k = input<"k">(dim<"B">, dim<2>, dim<"N">, dim<16>);
  auto v = input<"v">(dim<"B">, dim<2>, dim<"N">, dim<16>);
  auto docs = input<"docs", DType::i32>(dim<"B">, dim<"N">);
  auto slope = input<"slope">(dim<2>);
  auto out = [](auto y) { return lower(named<"out">(y)); };
  struct Pair {
    std::string name;
    ir::Graph written, option;
  };
  const std::vector<Pair> pairs = {
      {"softcap", out(scaled_dot_product_attention(q, k, v, score_mod([](auto s, auto, auto, auto, auto) { return softcap(s, 2.0); }))),
       out(scaled_dot_product_attention(q, k, v, softcap_scores(2.0)))},
      {"causal", out(scaled_dot_product_attention(q, k, v, mask_mod([](auto, auto, auto i, auto j) { return j <= i; }))),
       out(scaled_dot_product_attention(q, k, v, causal))},
      {"sliding window", out(scaled_dot_product_attention(q, k, v, mask_mod([](auto, auto, auto i, auto j) { return j <= i && i - j < 5.0; }))),
       out(scaled_dot_product_attention(q, k, v, sliding_window<5>))},
      {"document",
       out(scaled_dot_product_attention(q, k, v, mask_mod([=](auto b, auto, auto i, auto j) { return at(docs, b, i) == at(docs, b, j); }))),
       out(scaled_dot_product_attention(q, k, v, document_mask(docs, docs)))},
      {"alibi",
       out(scaled_dot_product_attention(q, k, v, causal, score_mod([=](auto s, auto, auto h, auto i, auto j) { return s + slope[h] * (j - i); }))),
       out(scaled_dot_product_attention(q, k, v, causal_bottom_right, alibi_bias<2>(k)))},
  };
  auto reference = backend::make_reference_backend({backend::Precision::f64, true});
  for (const auto& [name, written, option] : pairs) {
    SCOPED_TRACE(name);
    auto in = backend::random_inputs(written, {{"B", 2}, {"N", 45}}, 4);
    if (in.contains("slope")) {
      in.at("slope").data<float>()[0] = static_cast<float>(alibi_slope(0, 2));
      in.at("slope").data<float>()[1] = static_cast<float>(alibi_slope(1, 2));
    }
    if (in.contains("docs"))
      for (std::int64_t i = 0; i < 2 * 45; ++i) in.at("docs").data<std::int32_t>()[i] = static_cast<std::int32_t>(i % 45 / 10);
    auto option_in = backend::random_inputs(option, {{"B", 2}, {"N", 45}}, 4);
    for (auto& [input, t] : option_in) t = in.at(input);
    const Tensor a = reference->compile(written)->run(in).at("out"), b = reference->compile(option)->run(option_in).at("out");
    for (std::int64_t e = 0; e < a.numel(); ++e) ASSERT_NEAR(a.at(e), b.at(e), 1e-6) << e;
    ir::Graph g = ir::build_backward(written, {"", {"q", "k", "v"}, {"out"}});
    auto grad_in = backend::random_inputs(g, {{"B", 2}, {"N", 45}}, 5);
    for (auto& [input, t] : in) grad_in.at(input) = t;
    for (const char* backend_name : {"cpu", "vulkan"}) {
      SCOPED_TRACE(backend_name);
      QKV_GET_BACKEND_OR_SKIP(be, backend_name);
      auto exe = be->compile(g);
      int flex = 0;
      for (const auto& n : exe->graph().nodes()) {
        EXPECT_NE(n.op, ir::Op::softmax);
        flex += n.op == ir::Op::flex_attention;
      }
      EXPECT_EQ(flex, 1) << ir::print(exe->graph());
      testing::expect_equivalent(g, grad_in, *be);
    }
  }
}

/// Attention over q [1, 2, N, 16] (q = k = v) keeping the keys of the query's own document, its
/// ids "docs" [1, N] read through a mask_mod; and ids packing documents of 128 tokens.
ir::Graph document_attention() {
  auto q = input<"q">(dim<1>, dim<2>, dim<"N">, dim<16>);
  auto docs = input<"docs", DType::i32>(dim<1>, dim<"N">);
  return lower(
      named<"out">(scaled_dot_product_attention(q, q, q, mask_mod([=](auto b, auto, auto i, auto j) { return at(docs, b, i) == at(docs, b, j); }))));
}
void pack_documents(backend::TensorMap& in, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) in.at("docs").data<std::int32_t>()[i] = static_cast<std::int32_t>(i / 128);
}

/// Prefix-LM (the first 100 keys seen by every query, the rest causally) and padding from per
/// batch entry lengths, written as mask_mods over q [B, 2, N, 16] (q = k = v).
std::vector<std::pair<std::string, ir::Graph>> prefix_and_padding_models() {
  auto q = input<"q">(dim<"B">, dim<2>, dim<"N">, dim<16>);
  auto lengths = input<"lengths", DType::i32>(dim<"B">);
  return {
      {"prefix",
       lower(named<"out">(scaled_dot_product_attention(q, q, q, mask_mod([](auto, auto, auto i, auto j) { return j < 100.0 || j <= i; }))))},
      {"lengths",
       lower(named<"out">(scaled_dot_product_attention(q, q, q, mask_mod([=](auto b, auto, auto, auto j) { return j < at(lengths, b); }))))},
  };
}

/// The cpu kernels skip tiles a modifier masks whole (interval arithmetic over the region, from
/// the tile's positions and ids), forward and backward, and say so: packed documents of 128
/// tokens at N = 512 are tiled document by document (tiles of 128 queries by 128 keys), each
/// query tile over its own document's keys, so 3/4 of the scores are skipped; causality written as a mask_mod skips the tiles above the diagonal and
/// most of the triangle in the tiles on it. A NaN in v behind a masked tile still gives NaN, as
/// the meaning does: that key tile is computed.
TEST(FusedAttention, CpuSkipsTilesTheModifierMasksWhole) {
  const std::int64_t n = 512;
  auto documents = [&](backend::TensorMap& in) { pack_documents(in, n); };
  const ir::Graph forward = document_attention();
  auto cpu = backend::create("cpu");
  {
    auto exe = cpu->compile(forward);
    auto in = backend::random_inputs(forward, {{"N", n}}, 2);
    documents(in);
    exe->run(in);
    ASSERT_EQ(exe->tile_counts().size(), 1u);
    EXPECT_EQ(exe->tile_counts()[0].computed, 2 * n * n / 4);  // scores, per head a quarter of 512 x 512
    EXPECT_EQ(exe->tile_counts()[0].skipped, 2 * n * n * 3 / 4);
    // Every slice computed lies inside one document: its mask is not evaluated.
    EXPECT_EQ(exe->tile_counts()[0].unmasked, 2 * n * n / 4);
    testing::expect_equivalent(forward, in, "cpu");
    // A NaN in head 0's key 300 (document 2; q, k and v are one tensor) meets the queries of
    // the other documents only through a masked zero: the meaning gives NaN there, and the
    // kernel leaves out no masked key of the key tile that holds it (keys 256 to 511) in that
    // head. Head 0 still skips the other masked tile (queries 256-511 x keys 0-255) and half of
    // the diagonal tile of keys 0-255, 3/8 of its scores; head 1 its 3/4.
    in.at("q").data<float>()[300 * 16 + 2] = std::numeric_limits<float>::quiet_NaN();
    testing::expect_equivalent(forward, in, "cpu");
    EXPECT_TRUE(std::isnan(exe->run(in).at("out").at(2)));
    EXPECT_EQ(exe->tile_counts()[0].skipped, n * n * 3 / 8 + n * n * 3 / 4);
    // The tiles start at each document's first query and key (the ids are runs of packed
    // sequences): each head's four document tiles lie inside it; the rest is masked.
    EXPECT_EQ(exe->tile_counts()[0].unmasked, n * n / 4 + n * n / 4);
  }
  // Forward and backward: every kernel skips.
  ir::Graph g = ir::build_backward(forward, {"", {"q"}, {"out"}});
  auto in = backend::random_inputs(g, {{"N", n}}, 3);
  documents(in);
  auto exe = cpu->compile(g);
  exe->run(in);
  EXPECT_GE(exe->tile_counts().size(), 2u);
  for (const auto& t : exe->tile_counts()) EXPECT_GT(t.skipped, 0) << ir::op_name(exe->graph().node(t.value).op);
  testing::expect_equivalent(g, in, "cpu");
  // Causality written as a mask_mod skips the tiles wholly above the diagonal (256 x 256 scores
  // each): 6 of 16 per head, and runs the 4 the diagonal crosses in slices of 16 rows, each over
  // the chunks of 32 keys not wholly above its last row: slices 2t and 2t + 1 keep 32 (t + 1)
  // keys, so each such tile leaves out 16 * 2 * sum over t < 8 of (256 - 32 (t + 1)) = 16 * 1792
  // scores. The causal attribute cuts each slice at its last row exactly: the 6 tiles above the
  // diagonal and 15/32 of each of the 4 on it (slice s leaves out 256 - 16 (s + 1) keys of each
  // of its 16 rows).
  auto q = input<"q">(dim<1>, dim<2>, dim<"N">, dim<16>);
  auto skipped = [&](const ir::Graph& graph) {
    auto e = cpu->compile(graph);
    e->run(backend::random_inputs(graph, {{"N", 1024}}, 1));
    return e->tile_counts().at(0).skipped;
  };
  const auto written = skipped(lower(scaled_dot_product_attention(q, q, q, mask_mod([](auto, auto, auto i, auto j) { return j <= i; }))));
  EXPECT_EQ(written, 2 * (6 * 256 * 256 + 4 * 16 * 1792));
  EXPECT_EQ(skipped(lower(scaled_dot_product_attention(q, q, q, causal))), 2 * (6 * 256 * 256 + 4 * 16 * 16 * 120));
}

/// Vulkan's flash kernels skip the tiles a modifier masks whole, as the cpu's do: each tile
/// gathers the range of the ids it reads over its queries and its keys in shared memory and
/// bounds the region by interval arithmetic in GLSL. Documents of 128 tokens at N = 512 leave
/// 3 of 4 tiles masked in both launch geometries (rows of 64 or 128 by 32 keys); a NaN behind a
/// masked tile turns skipping off for its batch entry; the gradient kernels skip alike; prefix-LM
/// and a padding keep-mask from lengths ([B, 1, 1, M]: all-dropped key tiles) skip too. Every
/// result is the reference's.
TEST(FusedAttention, VulkanSkipsTilesTheModifierMasksWhole) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  const auto tunings = testing::vulkan_tunings();
  const std::int64_t n = 512;
  auto documents = [&](backend::TensorMap& in) { pack_documents(in, n); };
  const ir::Graph forward = document_attention();
  for (auto& b : tunings) {
    auto exe = b->compile(forward);
    auto in = backend::random_inputs(forward, {{"N", n}}, 2);
    documents(in);
    exe->run(in);
    ASSERT_EQ(exe->tile_counts().size(), 1u);
    EXPECT_EQ(exe->tile_counts()[0].computed, 2 * n * n / 4);
    EXPECT_EQ(exe->tile_counts()[0].skipped, 2 * n * n * 3 / 4);
    testing::expect_equivalent(forward, in, *b);
    // Key 300 of head 0 (document 2) holds a NaN: the meaning gives NaN wherever it meets a masked
    // zero, so head 0 visits every tile; head 1 still skips.
    in.at("q").data<float>()[300 * 16 + 2] = std::numeric_limits<float>::quiet_NaN();
    testing::expect_equivalent(forward, in, *b);
    EXPECT_TRUE(std::isnan(exe->run(in).at("out").at(2)));
    EXPECT_EQ(exe->tile_counts()[0].skipped, n * n * 3 / 4);
  }
  {
    ir::Graph g = ir::build_backward(forward, {"", {"q"}, {"out"}});
    auto in = backend::random_inputs(g, {{"N", n}}, 3);
    documents(in);
    auto exe = vulkan->compile(g);
    exe->run(in);
    EXPECT_EQ(exe->tile_counts().size(), 5u);  // forward, lse, dq, dk, dv
    for (const auto& t : exe->tile_counts()) EXPECT_EQ(t.skipped, 2 * n * n * 3 / 4) << ir::op_name(exe->graph().node(t.value).op);
    testing::expect_equivalent(g, in, *vulkan);
  }
  const auto models = prefix_and_padding_models();
  for (const auto& [name, model] : models) {
    SCOPED_TRACE(name);
    ir::Graph g = ir::build_backward(model, {"", {"q"}, {"out"}});
    auto in = backend::random_inputs(g, {{"B", 2}, {"N", 300}}, 6);
    if (in.contains("lengths")) {
      in.at("lengths").data<std::int32_t>()[0] = 120;  // keys 120.. of entry 0 are padding
      in.at("lengths").data<std::int32_t>()[1] = 300;
    }
    auto exe = vulkan->compile(g);
    exe->run(in);
    ASSERT_FALSE(exe->tile_counts().empty());
    for (const auto& t : exe->tile_counts()) EXPECT_GT(t.skipped, 0) << ir::op_name(exe->graph().node(t.value).op);
    testing::expect_equivalent(g, in, *vulkan);
  }
}

/// A random masking modifier: where(cond, score, -inf) (or -inf on the other branch), cond a
/// random combination of comparisons between random arithmetic over q_idx, kv_idx, t0 (one value
/// per query) and t1 (one per key) and constants; logic through casts, as the DSL writes it.
std::shared_ptr<const ir::Graph> random_mask_region(std::mt19937& rng) {
  const std::vector<DType> f32s = {DType::f32, DType::f32};
  ir::Graph r = ir::make_region(f32s);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  ir::Attrs to_f32;
  to_f32.dtype = DType::f32;
  std::function<ir::ValueId(int)> arith = [&](int depth) -> ir::ValueId {
    if (depth == 0 || pick(3) == 0) {
      const int leaf = pick(5);
      if (leaf < 4) return leaf == 0 ? ir::kRegionQIdx : leaf == 1 ? ir::kRegionKvIdx : ir::kRegionFixedInputs + (leaf - 2);
      return r.constant(static_cast<double>(pick(300)) - 50.0);
    }
    const ir::ValueId a = arith(depth - 1);
    switch (pick(6)) {
      case 0: return r.add(ir::Op::add, {a, arith(depth - 1)});
      case 1: return r.add(ir::Op::sub, {a, arith(depth - 1)});
      case 2: return r.add(ir::Op::mul, {a, pick(2) == 0 ? arith(depth - 1) : r.constant(static_cast<double>(pick(7)) - 3.0)});
      case 3: return r.add(ir::Op::max, {a, arith(depth - 1)});
      case 4: return r.add(ir::Op::neg, {a});
      default: return r.add(ir::Op::div, {a, r.constant(static_cast<double>(pick(5)) + 0.5)});
    }
  };
  auto as_f32 = [&](ir::ValueId b) { return r.add(ir::Op::cast, {b}, to_f32); };
  std::function<ir::ValueId(int)> condition = [&](int depth) -> ir::ValueId {
    if (depth == 0 || pick(2) == 0) return r.add(pick(3) == 0 ? ir::Op::equal : ir::Op::greater, {arith(2), arith(2)});
    const ir::ValueId a = condition(depth - 1);
    switch (pick(3)) {
      case 0: return r.add(ir::Op::greater, {r.add(ir::Op::mul, {as_f32(a), as_f32(condition(depth - 1))}), r.constant(0.5)});  // and
      case 1: return r.add(ir::Op::greater, {r.add(ir::Op::max, {as_f32(a), as_f32(condition(depth - 1))}), r.constant(0.5)});  // or
      default: return r.add(ir::Op::equal, {as_f32(a), r.constant(0.0)});                                                       // not
    }
  };
  const ir::ValueId cond = condition(2), minus_inf = r.constant(-HUGE_VAL);
  const ir::ValueId kept = pick(2) == 0 ? ir::kRegionScore : r.add(ir::Op::add, {ir::kRegionScore, ir::kRegionFixedInputs + 1});
  r.set_output("mod", pick(2) == 0 ? r.add(ir::Op::where, {cond, kept, minus_inf}) : r.add(ir::Op::where, {cond, minus_inf, kept}));
  return std::make_shared<const ir::Graph>(std::move(r));
}

/// Block sparsity is sound for any masking modifier: random regions over the indices and
/// per-query / per-key tensors (segment ids, positions or noise), run fused on cpu and vulkan,
/// give the reference's numbers whatever tiles the interval arithmetic (C++ on the cpu, GLSL on
/// vulkan) lets them skip, and whatever tiles the cpu runs without evaluating the masks (proved
/// kept whole); across the regions both backends skip tiles, and the cpu runs some unmasked.
TEST(FusedAttention, RandomMaskingModifiersSkipOnlyMaskedTiles) {
  std::vector<std::shared_ptr<backend::Backend>> backends;
  backends.push_back(backend::create("cpu"));
  {
    QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
    backends.push_back(std::move(vulkan));
  }
  const std::int64_t n = 300, m = 520;
  std::mt19937 rng(20261123);
  std::vector<int> skipping(backends.size(), 0);
  int unmasking = 0;  // regions for which the cpu ran tiles kept whole without their masks
  const int trials = 10;
  for (int trial = 0; trial < trials; ++trial) {
    const auto region = random_mask_region(rng);
    SCOPED_TRACE("mod = " + ir::region_expression(*region));
    ir::Graph g;
    const ir::ValueId q = g.add_input("q", DType::f32, {1, 2, n, 8}), k = g.add_input("k", DType::f32, {1, 2, m, 8});
    const ir::ValueId t0 = g.add_input("t0", DType::f32, {n, 1}), t1 = g.add_input("t1", DType::f32, {m});
    ir::Attrs scale;
    scale.scale = 0.35;
    g.set_output("out", g.add(ir::Op::flex_attention, {q, k, k, t0, t1}, scale, region));
    auto in = backend::random_inputs(g, {}, static_cast<std::uint64_t>(trial));
    // Ids laid out in segments, positions, or noise: what lets tiles be proved masked, or not.
    const int layout = trial % 3;
    const std::int64_t segment = 40 + 30 * (trial % 4);
    for (const auto& [name, count] : {std::pair{"t0", n}, std::pair{"t1", m}})
      for (std::int64_t i = 0; i < count; ++i)
        in.at(name).data<float>()[i] = layout == 0   ? static_cast<float>(i / segment)
                                       : layout == 1 ? static_cast<float>(i)
                                                     : static_cast<float>(static_cast<int>(rng() % 5u));
    for (std::size_t b = 0; b < backends.size(); ++b) {
      SCOPED_TRACE(backends[b]->name());
      testing::expect_equivalent(g, in, *backends[b]);
      auto exe = backends[b]->compile(g);
      exe->run(in);
      ASSERT_EQ(exe->tile_counts().size(), 1u);
      skipping[b] += exe->tile_counts()[0].skipped > 0;
      if (b == 0) unmasking += exe->tile_counts()[0].unmasked > 0;
    }
  }
  EXPECT_GE(unmasking, 2) << "the cpu ran tiles without their masks for " << unmasking << " of " << trials << " regions";
  for (std::size_t b = 0; b < backends.size(); ++b)
    EXPECT_GE(skipping[b], 2) << backends[b]->name() << " skipped tiles for " << skipping[b] << " of " << trials << " regions";
}

/// A modifier reading more tensors than the device binds storage buffers per shader (lavapipe:
/// 32; the flex forward binds q, k, v, its tensors, the output and a tile counter) is not
/// refused: vulkan runs its decomposition instead, with the reference's numbers; where the
/// device allows them, the kernel stays fused.
TEST(FusedAttention, VulkanDecomposesAModifierWithMoreTensorsThanTheDeviceBinds) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  const int tensors = 31;
  const std::vector<DType> f32s(tensors, DType::f32);
  ir::Graph region = ir::make_region(f32s);
  ir::ValueId mod = ir::kRegionScore;
  for (int i = 0; i < tensors; ++i) mod = region.add(ir::Op::add, {mod, ir::kRegionFixedInputs + i});
  region.set_output("mod", mod);
  ir::Graph g;
  std::vector<ir::ValueId> operands = {g.add_input("q", DType::f32, {1, 2, 40, 8})};
  operands.push_back(operands[0]);
  operands.push_back(operands[0]);
  for (int i = 0; i < tensors; ++i) operands.push_back(g.add_input("t" + std::to_string(i), DType::f32, {2, 1, 1}));
  ir::Attrs scale;
  scale.scale = 0.35;
  const ir::ValueId y = g.add(ir::Op::flex_attention, operands, scale, std::make_shared<const ir::Graph>(std::move(region)));
  g.set_output("out", y);
  const std::uint32_t most =
      backend::vulkan::Context::get(backend::vulkan_options_from_env())->properties().limits.maxPerStageDescriptorStorageBuffers;
  // q, k, v, the tensors, the output, the tile counts and the forward's split buffer.
  EXPECT_EQ(codegen::storage_buffers(g.node(y)), 3 + tensors + 3);
  auto exe = vulkan->compile(g);
  bool fused = false;
  for (const ir::Node& n : exe->graph().nodes()) fused |= n.op == ir::Op::flex_attention;
  EXPECT_EQ(fused, 3u + tensors + 3u <= most) << "the device binds " << most << " storage buffers per shader";
  testing::expect_equivalent(g, backend::random_inputs(g, {}, 4), *vulkan);
}

/// Prefix-LM (the first P keys seen by every query, the rest causally) and padding from per-row
/// lengths, both written as mask_mods: the cpu skips the tiles they mask whole (keys past a
/// sequence's length; keys above the diagonal beyond the prefix) and agrees with the reference,
/// forward and backward. Padding needs no score: fusion makes it masked_attention's [B, H, 1, M]
/// keep-mask, whose tiles of all-dropped keys are skipped alike.
TEST(FusedAttention, CpuSkipsPrefixLmAndPaddingFromLengths) {
  const std::int64_t n = 600;
  const auto models = prefix_and_padding_models();
  auto cpu = backend::create("cpu");
  for (const auto& [name, forward] : models) {
    SCOPED_TRACE(name);
    ir::Graph g = ir::build_backward(forward, {"", {"q"}, {"out"}});
    auto in = backend::random_inputs(g, {{"B", 2}, {"N", n}}, 6);
    if (in.contains("lengths")) {
      in.at("lengths").data<std::int32_t>()[0] = 200;  // keys 200.. of entry 0 are padding
      in.at("lengths").data<std::int32_t>()[1] = 600;
    }
    auto exe = cpu->compile(g);
    exe->run(in);
    ASSERT_FALSE(exe->tile_counts().empty());
    for (const auto& t : exe->tile_counts()) EXPECT_GT(t.skipped, 0) << ir::op_name(exe->graph().node(t.value).op);
    testing::expect_equivalent(g, in, "cpu");
  }
}

/// Few queries against many keys (decoding) split the keys into parts of kSplitKeys (flash-
/// decoding), each a task, merged by their log-sum-exp: the same numbers as the reference with
/// grouped heads (k and v broadcast over q's heads), every kind of masking and modifier, a part
/// whose keys are all masked, a fully masked row, NaN in a value, and half-precision operands.
TEST(FusedAttention, CpuSplitsTheKeysOfFewQueries) {
  EXPECT_EQ(backend::cpu::key_splits(1, backend::cpu::kSplitKeys), 1);
  EXPECT_EQ(backend::cpu::key_splits(1, backend::cpu::kSplitKeys + 1), 2);
  EXPECT_EQ(backend::cpu::key_splits(backend::cpu::kSplitQueries + 1, 100000), 1) << "more queries: a task per query block";
  EXPECT_EQ(backend::cpu::key_splits(0, 100000), 1) << "no query: no part";
  auto q = input<"q">(dim<"B">, dim<4>, dim<"N">, dim<32>);
  auto k = input<"k">(dim<"B">, dim<1>, dim<"M">, dim<32>);  // one key/value head for four query heads
  auto v = input<"v">(dim<"B">, dim<1>, dim<"M">, dim<24>);
  auto keep = input<"keep", DType::boolean>(dim<"N">, dim<"M">);
  auto bias = input<"bias">(dim<4>, dim<1>, dim<"M">);  // per head and key, as ALiBi's
  const std::vector<std::pair<std::string, ir::Graph>> models = {
      {"plain", lower(named<"out">(scaled_dot_product_attention(q, k, v)))},
      {"causal", lower(named<"out">(scaled_dot_product_attention(q, k, v, causal_bottom_right)))},
      {"window", lower(named<"out">(scaled_dot_product_attention(q, k, v, sliding_window<700>)))},
      {"keep-mask", lower(named<"out">(scaled_dot_product_attention(q, k, v, keep)))},
      {"softcap bias", lower(named<"out">(scaled_dot_product_attention(q, k, v, softcap_scores(2.0), bias)))}};
  auto cpu = backend::create("cpu");
  for (const auto& [name, g] : models)
    // 12 queries: split, the scores through the transposed key tiles (more than 4 rows); 40: not
    // split.
    for (const auto& [n, m] : std::vector<std::pair<std::int64_t, std::int64_t>>{{1, 1}, {1, 513}, {3, 1300}, {1, 2048}, {12, 1300}, {40, 1300}}) {
      SCOPED_TRACE(name + ", N " + std::to_string(n) + ", M " + std::to_string(m));
      auto in = backend::random_inputs(g, {{"B", 2}, {"N", n}, {"M", m}}, 7);
      testing::expect_equivalent(g, in, *cpu);
      if (m < 1300) continue;
      float* values = in.at("v").data<float>();
      if (in.contains("keep")) {
        bool* kept = in.at("keep").data<bool>();
        std::fill_n(kept, m, false);                                                                   // query 0 keeps no key: zeros
        if (n > 1) std::fill_n(kept + m + backend::cpu::kSplitKeys, backend::cpu::kSplitKeys, false);  // query 1: a part with none
      }
      values[(m - 2) * 24 + 5] = std::numeric_limits<float>::quiet_NaN();  // the last part's values, entry 0
      testing::expect_equivalent(g, in, *cpu);
      in.at("q").data<float>()[(4 + 1) * n * 32 + 7] = std::numeric_limits<float>::infinity();  // entry 1, head 1: NaN or inf scores
      testing::expect_equivalent(g, in, *cpu);
      auto exe = cpu->compile(g);
      exe->run(in);
      const auto counts = exe->tile_counts();
      ASSERT_EQ(counts.size(), 1u);
      const auto& t = counts[0];
      EXPECT_EQ(t.computed + t.skipped, 2 * 4 * n * m) << "every part's scores counted once";
    }
  // Training with few queries (cross-attention): the split forward writes each row's
  // log-sum-exp, merged from the parts', which the backward reads.
  for (const auto& [name, forward] : models) {
    SCOPED_TRACE(name + ", backward");
    const ir::Graph g = ir::build_backward(forward, {"", {"q", "k", "v"}, {"out"}});
    testing::expect_equivalent(g, backend::random_inputs(g, {{"B", 1}, {"N", 3}, {"M", 1100}}, 9), *cpu);
  }
  // In f16 and bf16 (operands read and the output written in 16 bits).
  for (DType half : {DType::f16, DType::bf16}) {
    const ir::Graph g = ir::to_dtype(models[1].second, half);
    testing::expect_equivalent(g, backend::random_inputs(g, {{"B", 2}, {"N", 1}, {"M", 1500}}, 8), *cpu);
  }
}

/// The split described for the lowered forward of `g` at these inputs (Backend::work_split).
std::string forward_split(backend::Backend& b, const ir::Graph& g, const backend::TensorMap& in) {
  auto exe = b.compile(g);
  const std::vector<ir::Shape> shapes = ir::bind_shapes(exe->graph(), in);
  for (std::size_t i = 0; i < exe->graph().size(); ++i)
    if (ir::is_fused_attention(exe->graph().nodes()[i].op)) return b.work_split(exe->graph(), static_cast<ir::ValueId>(i), shapes);
  return {};
}

/// Vulkan's decode layout (a GPU's geometry: a workgroup's invocations share its few queries,
/// each streaming keys of its own, merged by log-sum-exp) and, past 512 keys, its split of the
/// keys over workgroups (the last part to finish merges them), beside lavapipe's query layout,
/// which keeps both off: the reference's numbers with grouped heads, causality,
/// a keep-mask, a window and dropout, a part whose keys are all masked, a fully masked row, NaN and inf, in
/// both launch geometries and in f16 and bf16; every score computed once; the same bits on
/// every run, whichever part finishes last.
TEST(FusedAttention, VulkanDecodeSpreadsAndSplitsTheKeysOfFewQueries) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  const auto tunings = testing::vulkan_tunings();
  // Head dims of 16 and 12 (lavapipe's compile time grows with them; the layouts do not change).
  auto q = input<"q">(dim<"B">, dim<4>, dim<"N">, dim<16>);
  auto k = input<"k">(dim<"B">, dim<1>, dim<"M">, dim<16>);  // one key/value head for four query heads: four query rows
  auto v = input<"v">(dim<"B">, dim<1>, dim<"M">, dim<12>);
  auto kh = input<"k">(dim<"B">, dim<4>, dim<"M">, dim<16>);  // a key/value head per query head: N query rows
  auto vh = input<"v">(dim<"B">, dim<4>, dim<"M">, dim<12>);
  auto keep = input<"keep", DType::boolean>(dim<"N">, dim<"M">);
  auto seed = input<"seed", DType::i32>();
  // A modifier is code per score, the same in either layout: the conformance cases run them.
  const std::vector<std::pair<std::string, ir::Graph>> models = {
      {"plain", lower(named<"out">(scaled_dot_product_attention(q, kh, vh)))},
      {"grouped causal", lower(named<"out">(scaled_dot_product_attention(q, k, v, causal_bottom_right)))},
      {"keep-mask", lower(named<"out">(scaled_dot_product_attention(q, kh, vh, keep)))},
      {"window dropout", lower(named<"out">(scaled_dot_product_attention(q, kh, vh, sliding_window<700>, attn_dropout(0.2, seed))))}};
  for (const auto& [name, g] : models)
    for (const auto& [n, m] : std::vector<std::pair<std::int64_t, std::int64_t>>{{1, 1}, {1, 513}, {3, 1300}, {1, 1100}}) {
      SCOPED_TRACE(name + ", N " + std::to_string(n) + ", M " + std::to_string(m));
      auto in = backend::random_inputs(g, {{"B", 2}, {"N", n}, {"M", m}}, 7);
      if (in.contains("seed")) in.insert_or_assign("seed", Tensor::from<std::int32_t>({}, {77}));
      // A GPU's geometry first (a row per workgroup: N row blocks), then lavapipe's (all rows in
      // one), so that no output is left from an earlier run in the same memory.
      for (std::size_t t = tunings.size(); t-- > 0;) {
        SCOPED_TRACE(t == 0 ? "lavapipe's geometry" : "a GPU's geometry");
        testing::expect_equivalent(g, in, *tunings[t]);
      }
      if (name == "plain")  // N query rows: a GPU's geometry takes the decode layout, split past 512 keys
        for (std::size_t t = 0; t < tunings.size(); ++t) {
          const std::string split = forward_split(*tunings[t], g, in);
          EXPECT_EQ(split.find("decode layout") != std::string::npos, t == 1) << split;
          EXPECT_EQ(split.find("split-KV") != std::string::npos, t == 1 && m > 512) << split;
        }
      if (m < 1300) continue;
      float* values = in.at("v").data<float>();
      if (in.contains("keep")) {
        bool* kept = in.at("keep").data<bool>();
        std::fill_n(kept, m, false);                         // query 0 keeps no key: zeros
        if (n > 1) std::fill_n(kept + m + 512, 512, false);  // query 1: a part with none
      }
      values[(m - 2) * 12 + 5] = std::numeric_limits<float>::quiet_NaN();  // the last part's values, entry 0
      testing::expect_equivalent(g, in, *vulkan);
      in.at("q").data<float>()[(4 + 1) * n * 16 + 7] = std::numeric_limits<float>::infinity();  // entry 1, head 1: NaN or inf scores
      for (std::size_t t = tunings.size(); t-- > 0;) {
        SCOPED_TRACE(t == 0 ? "lavapipe's geometry" : "a GPU's geometry");
        testing::expect_equivalent(g, in, *tunings[t]);
      }
      for (std::size_t t = 0; t < tunings.size(); ++t) {
        SCOPED_TRACE(t == 0 ? "lavapipe's geometry" : "a GPU's geometry");
        auto exe = tunings[t]->compile(g);
        const backend::TensorMap first = exe->run(in);
        const backend::TensorMap second = exe->run(in);
        EXPECT_EQ(std::memcmp(first.at("out").raw(), second.at("out").raw(), first.at("out").nbytes()), 0) << "the same bits on every run";
        if (name != "plain") continue;
        const auto counts = exe->tile_counts();
        ASSERT_EQ(counts.size(), 1u);
        EXPECT_EQ(counts[0].computed, 2 * 4 * n * m) << "every score computed once, by one invocation of one part";
      }
    }
  // In f16 and bf16 (operands read and the output written in 16 bits), split.
  for (DType half : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(half));
    const ir::Graph g = ir::to_dtype(models[0].second, half);
    const backend::TensorMap in = backend::random_inputs(g, {{"B", 2}, {"N", 1}, {"M", 1100}}, 8);
    for (auto& b : tunings) testing::expect_equivalent(g, in, *b);
  }
  // QKV_VULKAN_SPLIT_KV=0's layout: no decode layout, the same numbers.
  auto options = backend::vulkan_options_from_env();
  options.split_kv = false;
  auto unsplit = backend::make_vulkan_backend(options);
  const ir::Graph& plain = models[0].second;
  const backend::TensorMap in = backend::random_inputs(plain, {{"B", 2}, {"N", 1}, {"M", 1100}}, 9);
  EXPECT_EQ(forward_split(*unsplit, plain, in), "");
  testing::expect_equivalent(plain, in, *unsplit);
}

}  // namespace
}  // namespace qkv
