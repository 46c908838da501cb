// Forward mode (ir::build_jvp): attention's Jacobian-vector products with every option of the
// library against central differences on the float64 reference, and the same graphs on cpu and
// vulkan against the reference; the DSL's jvp(). Every op's rule is swept in gradient_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "backends/vulkan/vulkan_backend.hpp"
#include "dsl/dsl.hpp"
#include "ir/passes/passes.hpp"
#include "tests/support/backend_fixture.hpp"
#include "tests/support/gradcheck.hpp"

namespace qkv {
namespace {

using namespace dsl;

/// The inputs as f32 (the tangents come back from the check in f64).
backend::TensorMap in_f32(const backend::TensorMap& in) {
  backend::TensorMap r;
  for (const auto& [name, t] : in) r.emplace(name, t.dtype() == DType::f64 ? t.to(DType::f32) : t);
  return r;
}

// Every option the library composes (score and mask modifiers, windows, sinks), the tangents of
// q, k and v at once: against central differences, then on cpu and vulkan against the reference.
TEST(Jvp, AttentionWithEveryOptionMatchesCentralDifferencesAndEveryBackend) {
  auto q = input<"q">(dim<2>, dim<2>, dim<5>, dim<8>);
  auto k = input<"k">(dim<2>, dim<2>, dim<7>, dim<8>);
  auto v = input<"v">(dim<2>, dim<2>, dim<7>, dim<6>);
  auto slopes = input<"slopes">(dim<2>);
  auto alibi = score_mod([=](auto score, auto, auto head, auto q_idx, auto kv_idx) { return score + at(slopes, head) * (kv_idx - q_idx); });
  auto near = mask_mod([](auto, auto, auto q_idx, auto kv_idx) { return kv_idx > q_idx + 3.0; });
  auto sink_logits = input<"sinks">(dim<2>);
  const std::vector<std::pair<std::string, ir::Graph>> models = {
      {"plain", lower(named<"out">(scaled_dot_product_attention(q, k, v)))},
      {"causal", lower(named<"out">(scaled_dot_product_attention(q, k, v, causal_bottom_right)))},
      {"sliding window", lower(named<"out">(scaled_dot_product_attention(q, k, v, sliding_window<3>)))},
      {"alibi", lower(named<"out">(scaled_dot_product_attention(q, k, v, alibi)))},
      {"mask_mod, soft-capped", lower(named<"out">(scaled_dot_product_attention(q, k, v, near, softcap_scores(2.0))))},
      {"sinks, causal", lower(named<"out">(scaled_dot_product_attention(q, k, v, causal_bottom_right, sinks(sink_logits))))}};
  for (const auto& [name, g] : models) {
    SCOPED_TRACE(name);
    backend::TensorMap in = backend::random_inputs(g, {}, 3);
    if (in.contains("slopes")) in.insert_or_assign("slopes", Tensor::from<float>({2}, {0.5f, 0.25f}));
    const ir::Graph jvp = ir::build_jvp(g, {{"q", "k", "v"}, {}});
    const backend::TensorMap with_tangents = in_f32(testing::expect_jvp_matches_central_differences(g, in, {"q", "k", "v"}));
    for (const char* b : {"cpu", "vulkan"}) {
      SCOPED_TRACE(b);
      testing::expect_equivalent(jvp, with_tangents, b);
    }
  }
}

// The tangents of the modifier's tensor and of the sink logits too (every float input), and a
// fully masked row (its output and tangent zero as the forward's).
TEST(Jvp, ModifierTensorsSinksAndMaskedRowsHaveTangents) {
  auto q = input<"q">(dim<1>, dim<2>, dim<4>, dim<8>);
  auto k = input<"k">(dim<1>, dim<2>, dim<6>, dim<8>);
  auto v = input<"v">(dim<1>, dim<2>, dim<6>, dim<8>);
  auto slopes = input<"slopes">(dim<2>);
  auto sink_logits = input<"sinks">(dim<2>);
  auto keep = input<"keep", DType::boolean>(dim<4>, dim<6>);
  auto alibi = score_mod([=](auto score, auto, auto head, auto q_idx, auto kv_idx) { return score + at(slopes, head) * (kv_idx - q_idx); });
  const ir::Graph g = lower(named<"out">(scaled_dot_product_attention(q, k, v, keep, alibi, sinks(sink_logits))));
  backend::TensorMap in = backend::random_inputs(g, {}, 4);
  Tensor mask(DType::boolean, {4, 6});
  for (std::int64_t i = 0; i < mask.numel(); ++i) mask.data<bool>()[i] = i >= 6 && i % 5 != 0;  // query 0 keeps no key
  in.insert_or_assign("keep", mask);
  const std::vector<std::string> wrt = {"q", "k", "v", "slopes", "sinks"};
  const backend::TensorMap with_tangents = in_f32(testing::expect_jvp_matches_central_differences(g, in, wrt));
  testing::expect_equivalent(ir::build_jvp(g, {wrt, {}}), with_tangents, "cpu");
}

/// The cpu, and vulkan where a device is at hand (a missing one fails `why`'s test where Vulkan is
/// required), with the words their tangent kernels' names hold.
struct Backends {
  std::shared_ptr<backend::Backend> cpu = backend::create("cpu"), vulkan;
  std::string why;
  Backends() { vulkan = testing::backend_or_reason("vulkan", why); }
  std::vector<std::pair<backend::Backend*, std::string>> all() const {
    std::vector<std::pair<backend::Backend*, std::string>> r = {{cpu.get(), "fused attention tangent"}};
    if (vulkan) r.emplace_back(vulkan.get(), "glsl flash_attention_jvp");
    return r;
  }
};

/// Replaces the random [1, N] q_docs and [1, M] kv_docs in `in` with `docs` documents of equal
/// lengths along the queries and the keys, the last query row padding (document -1).
void set_documents(backend::TensorMap& in, std::int64_t docs) {
  Tensor qd = in.at("q_docs"), kd = in.at("kv_docs");
  const std::int64_t n = qd.numel(), m = kd.numel();
  for (std::int64_t i = 0; i < n; ++i) qd.data<std::int32_t>()[i] = i == n - 1 ? -1 : static_cast<std::int32_t>(i / (n / docs));
  for (std::int64_t j = 0; j < m; ++j) kd.data<std::int32_t>()[j] = static_cast<std::int32_t>(j / (m / docs));
  in.insert_or_assign("q_docs", qd);
  in.insert_or_assign("kv_docs", kd);
}

/// A backend's kernels for the attention ops of its lowering of `g` ("op: kernel").
std::vector<std::string> attention_kernels(backend::Backend& b, backend::Executable& exe) {
  std::vector<std::string> r;
  const ir::Graph& lowered = exe.graph();
  for (std::size_t i = 0; i < lowered.size(); ++i)
    if (ir::is_fused_attention(lowered.nodes()[i].op))
      r.push_back(std::string(ir::op_name(lowered.nodes()[i].op)) + ": " + b.kernel_name(lowered, static_cast<ir::ValueId>(i)));
  return r;
}

// The fused tangent (attention_jvp, one streaming pass with the forward) on cpu: every option at
// shapes that cross its query and key tiles and skip masked ones, dropout, f32 and f16, against
// the reference; the forward computed in the tangent's kernel.
TEST(Jvp, FusedAttentionTangentOnCpuMatchesTheReference) {
  auto q = input<"q">(dim<1>, dim<2>, dim<300>, dim<16>);
  auto k = input<"k">(dim<1>, dim<2>, dim<600>, dim<16>);
  auto v = input<"v">(dim<1>, dim<2>, dim<600>, dim<8>);
  auto slopes = input<"slopes">(dim<2>);
  auto sink_logits = input<"sinks">(dim<2>);
  auto seed = input<"seed", DType::i32>();
  auto q_docs = input<"q_docs", DType::i32>(dim<1>, dim<300>);
  auto kv_docs = input<"kv_docs", DType::i32>(dim<1>, dim<600>);
  auto alibi = score_mod([=](auto score, auto, auto head, auto q_idx, auto kv_idx) { return score + at(slopes, head) * (kv_idx - q_idx); });
  auto out = [](auto y) { return lower(named<"out">(y)); };
  const std::vector<std::pair<std::string, ir::Graph>> models = {
      {"plain", out(scaled_dot_product_attention(q, k, v))},
      {"causal bottom-right", out(scaled_dot_product_attention(q, k, v, causal_bottom_right))},
      {"sliding window, soft-capped", out(scaled_dot_product_attention(q, k, v, sliding_window<100>, softcap_scores(3.0)))},
      {"alibi, sinks", out(scaled_dot_product_attention(q, k, v, alibi, sinks(sink_logits)))},
      {"documents (tiles skipped)", out(scaled_dot_product_attention(q, k, v, document_mask(q_docs, kv_docs)))},
      {"causal dropout", out(scaled_dot_product_attention(q, k, v, causal_bottom_right, attn_dropout(0.2, seed)))}};
  auto cpu = backend::create("cpu");
  for (const auto& [name, g] : models) {
    for (DType dtype : {DType::f32, DType::f16}) {
      SCOPED_TRACE(name + " " + std::string(dtype_name(dtype)));
      const ir::Graph jvp = ir::build_jvp(dtype == DType::f32 ? g : ir::to_dtype(g, dtype), {{"q", "k", "v"}, {}});
      backend::TensorMap in = backend::random_inputs(jvp, {}, 7);
      if (in.contains("slopes")) in.insert_or_assign("slopes", Tensor::from<float>({2}, {0.05f, 0.02f}).to(in.at("slopes").dtype()));
      if (in.contains("q_docs")) set_documents(in, 3);
      auto exe = cpu->compile(jvp);
      const std::vector<std::string> kernels = attention_kernels(*cpu, *exe);
      ASSERT_EQ(kernels.size(), 2u) << ::testing::PrintToString(kernels);
      EXPECT_NE(kernels[0].find("(in %"), std::string::npos) << kernels[0];
      EXPECT_NE(kernels[1].find("fused attention tangent"), std::string::npos) << kernels[1];
      testing::expect_equivalent(jvp, in, *cpu);
    }
  }
}

// The vulkan tangent kernel (flash_attention_jvp: one streaming pass that also writes the output)
// with the library's options combined (each generated variant costs CI seconds to compile),
// grouped heads (k and v broadcast over q's heads) and head dims that are not multiples of 4, f32
// in both launch geometries (lavapipe's rows per invocation, a GPU's one) and f16, against the
// reference. Causality with a softcap and a keep-mask are the next tests'.
TEST(Jvp, FusedAttentionTangentOnVulkanMatchesTheReference) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  const auto tunings = testing::vulkan_tunings();
  auto q = input<"q">(dim<1>, dim<2>, dim<100>, dim<13>);
  auto k = input<"k">(dim<1>, dim<1>, dim<200>, dim<13>);
  auto v = input<"v">(dim<1>, dim<1>, dim<200>, dim<6>);
  auto slopes = input<"slopes">(dim<2>);
  auto sink_logits = input<"sinks">(dim<2>);
  auto seed = input<"seed", DType::i32>();
  auto q_docs = input<"q_docs", DType::i32>(dim<1>, dim<100>);
  auto kv_docs = input<"kv_docs", DType::i32>(dim<1>, dim<200>);
  auto alibi = score_mod([=](auto score, auto, auto head, auto q_idx, auto kv_idx) { return score + at(slopes, head) * (kv_idx - q_idx); });
  auto out = [](auto y) { return lower(named<"out">(y)); };
  struct Model {
    std::string name;
    ir::Graph g;
    DType dtype;
  };
  const std::vector<Model> models = {
      {"sliding window, soft-capped", out(scaled_dot_product_attention(q, k, v, sliding_window<40>, softcap_scores(3.0))), DType::f32},
      {"alibi, sinks, causal dropout",
       out(scaled_dot_product_attention(q, k, v, alibi, sinks(sink_logits), causal_bottom_right, attn_dropout(0.2, seed))), DType::f32},
      {"documents (tiles skipped)", out(scaled_dot_product_attention(q, k, v, document_mask(q_docs, kv_docs))), DType::f32},
      {"causal bottom-right", out(scaled_dot_product_attention(q, k, v, causal_bottom_right)), DType::f16}};
  for (const Model& m : models) {
    SCOPED_TRACE(m.name + " " + std::string(dtype_name(m.dtype)));
    const ir::Graph jvp = ir::build_jvp(m.dtype == DType::f32 ? m.g : ir::to_dtype(m.g, m.dtype), {{"q", "k", "v"}, {}});
    backend::TensorMap in = backend::random_inputs(jvp, {}, 7);
    if (in.contains("slopes")) in.insert_or_assign("slopes", Tensor::from<float>({2}, {0.05f, 0.02f}));
    if (in.contains("q_docs")) set_documents(in, 2);
    for (std::size_t t = 0; t < (m.dtype == DType::f32 ? tunings.size() : 1); ++t) {
      auto exe = tunings[t]->compile(jvp);
      const std::vector<std::string> kernels = attention_kernels(*tunings[t], *exe);
      ASSERT_EQ(kernels.size(), 2u) << ::testing::PrintToString(kernels);
      EXPECT_NE(kernels[0].find("(in %"), std::string::npos) << kernels[0];
      EXPECT_NE(kernels[1].find("glsl flash_attention_jvp"), std::string::npos) << kernels[1];
      testing::expect_equivalent(jvp, in, *tunings[t]);
    }
  }
}

// Attention whose output is a model's output and feeds another op: the forward is computed in its
// tangent's kernel, in f32 and in f16 (where a round of the output comes between them until the
// pipeline places the tangent first), on cpu and vulkan, and run_observed reports the output once
// that kernel ran. Where vulkan writes the output through a permute's strides (heads back to
// [B, N, H, Dv], in f32), the forward keeps its own kernel.
TEST(Jvp, FusedAttentionTangentInsideAModel) {
  auto q = input<"q">(dim<1>, dim<2>, dim<40>, dim<16>);
  auto k = input<"k">(dim<1>, dim<2>, dim<40>, dim<16>);
  auto v = input<"v">(dim<1>, dim<2>, dim<40>, dim<8>);
  auto w = input<"w">(dim<8>, dim<8>);
  auto y = scaled_dot_product_attention(q, k, v, causal);
  const Backends backends;
  if (!backends.vulkan && testing::vulkan_required()) ADD_FAILURE() << "vulkan: " << backends.why;
  for (const auto& [b, kernel] : backends.all()) {
    const bool vulkan = b == backends.vulkan.get();
    for (const bool permuted : {false, true}) {
      for (DType dtype : {DType::f32, DType::f16}) {
        SCOPED_TRACE(b->name() + " " + std::string(dtype_name(dtype)) + (permuted ? " permuted" : ""));
        const ir::Graph g = permuted ? lower(named<"out">(matmul(permute<0, 2, 1, 3>(y), w))) : lower(named<"y">(y), named<"out">(matmul(y, w)));
        const ir::Graph jvp = ir::build_jvp(dtype == DType::f32 ? g : ir::to_dtype(g, dtype), {{"q", "k"}, {}});
        auto exe = b->compile(jvp);
        const std::vector<std::string> kernels = attention_kernels(*b, *exe);
        ASSERT_EQ(kernels.size(), 2u);
        // (In f16 a round comes between the forward and the permute: the output is stored rounded,
        // not placed.)
        if (permuted && vulkan && dtype == DType::f32) EXPECT_NE(kernels[0].find("glsl flash_attention_forward"), std::string::npos) << kernels[0];
        else EXPECT_NE(kernels[0].find("(in %"), std::string::npos) << kernels[0];
        EXPECT_NE(kernels[1].find(kernel), std::string::npos) << kernels[1];
        const backend::TensorMap in = backend::random_inputs(jvp, {}, 12);
        testing::expect_equivalent(jvp, in, *b);
        struct Keep : backend::RunObserver {
          backend::TensorMap seen;
          void output_ready(std::string_view name, const Tensor& t) override { seen.insert_or_assign(std::string(name), t); }
        } observer;
        exe->run(backend::random_inputs(jvp, {}, 13));  // other values in the arena: what a report too early would show
        const backend::TensorMap observed = exe->run_observed(in, observer), plain = exe->run(in);
        for (const auto& [name, t] : plain) {
          ASSERT_EQ(observer.seen.at(name).nbytes(), t.nbytes()) << name;
          EXPECT_EQ(std::memcmp(observer.seen.at(name).raw(), t.raw(), t.nbytes()), 0) << name << " reported before it was final";
          EXPECT_EQ(std::memcmp(observed.at(name).raw(), t.raw(), t.nbytes()), 0) << name;
        }
      }
    }
  }
  if (!backends.vulkan) return;
  // Fusion off (a kernel per node): the tangent's kernel still writes the forward's output.
  backend::VulkanOptions options = backend::vulkan_options_from_env();
  options.fusion = false;
  auto unfused = backend::make_vulkan_backend(options);
  const ir::Graph jvp = ir::build_jvp(lower(named<"y">(y), named<"out">(matmul(y, w))), {{"q", "k"}, {}});
  auto exe = unfused->compile(jvp);
  EXPECT_NE(attention_kernels(*unfused, *exe).front().find("(in %"), std::string::npos);
  testing::expect_equivalent(jvp, backend::random_inputs(jvp, {}, 14), *unfused);
}

// Tangents of some of q, k and v: the others are zeros, whose products the kernel leaves out
// (exactly: a NaN in k still reaches the rows that see it).
TEST(Jvp, FusedAttentionTangentOfSomeOperands) {
  auto q = input<"q">(dim<1>, dim<2>, dim<70>, dim<16>);
  auto k = input<"k">(dim<1>, dim<2>, dim<300>, dim<16>);
  auto v = input<"v">(dim<1>, dim<2>, dim<300>, dim<8>);
  const ir::Graph g = lower(named<"out">(scaled_dot_product_attention(q, k, v, causal_bottom_right, softcap_scores(4.0))));
  const Backends backends;
  if (!backends.vulkan && testing::vulkan_required()) ADD_FAILURE() << "vulkan: " << backends.why;
  for (const auto& [b, kernel] : backends.all())
    for (const std::vector<std::string>& wrt : std::vector<std::vector<std::string>>{{"q"}, {"k"}, {"v"}, {"q", "v"}, {"k", "v"}}) {
      SCOPED_TRACE(b->name() + " " + ::testing::PrintToString(wrt));
      const ir::Graph jvp = ir::build_jvp(g, {wrt, {}});
      auto exe = b->compile(jvp);
      EXPECT_NE(attention_kernels(*b, *exe).back().find(kernel), std::string::npos);
      backend::TensorMap in = backend::random_inputs(jvp, {}, 11);
      testing::expect_equivalent(jvp, in, *b);
      Tensor nan_k = in.at("k");
      nan_k.data<float>()[(300 + 17) * 16 + 5] = std::numeric_limits<float>::quiet_NaN();  // head 1, key 17: every row sees it
      in.insert_or_assign("k", nan_k);
      testing::expect_equivalent(jvp, in, *b);
    }
}

// A NaN in a value under a masked key reaches the output and its tangent as in the meaning (0 *
// NaN), one in a value's tangent there the tangent alone, and a row that keeps no key gives zeros
// for both, on cpu and vulkan; the cpu tangent's memory is O(N D): at N = 4096 nothing the size
// of the scores is held.
TEST(Jvp, FusedAttentionTangentPropagatesNaNAndHoldsNoScores) {
  auto q = input<"q">(dim<1>, dim<4>, dim<8>);
  auto k = input<"k">(dim<1>, dim<300>, dim<8>);
  auto v = input<"v">(dim<1>, dim<300>, dim<8>);
  auto keep = input<"keep", DType::boolean>(dim<1>, dim<300>);
  const ir::Graph g = ir::build_jvp(lower(named<"out">(scaled_dot_product_attention(q, k, v, keep))), {{"q", "k", "v"}, {}});
  backend::TensorMap in = backend::random_inputs(g, {}, 2);
  Tensor mask(DType::boolean, {1, 300});
  for (std::int64_t j = 0; j < 300; ++j) mask.data<bool>()[j] = j < 20;  // key tiles past the first masked whole
  in.insert_or_assign("keep", mask);
  const Backends backends;
  if (!backends.vulkan && testing::vulkan_required()) ADD_FAILURE() << "vulkan: " << backends.why;
  for (const auto& backend_and_kernel : backends.all()) {
    backend::Backend* b = backend_and_kernel.first;
    SCOPED_TRACE(b->name());
    testing::expect_equivalent(g, in, *b);
    for (const char* x : {"v", "t_v"}) {
      backend::TensorMap with_nan = in;
      Tensor nan_x = with_nan.at(x);
      nan_x.data<float>()[280 * 8 + 3] = std::numeric_limits<float>::quiet_NaN();  // under a masked key
      with_nan.insert_or_assign(x, nan_x);
      const backend::TensorMap out = b->compile(g)->run(with_nan);
      for (std::int64_t i = 0; i < 4; ++i) {
        EXPECT_EQ(std::isnan(out.at("out").data<float>()[i * 8 + 3]), x == std::string("v")) << x << ": out, row " << i;
        EXPECT_TRUE(std::isnan(out.at("t_out").data<float>()[i * 8 + 3])) << x << ": t_out, row " << i;
      }
      testing::expect_equivalent(g, with_nan, *b);
    }
    backend::TensorMap no_key = in;
    Tensor none_kept = mask;
    for (std::int64_t j = 0; j < 300; ++j) none_kept.data<bool>()[j] = false;  // no key at all: zeros
    no_key.insert_or_assign("keep", none_kept);
    const backend::TensorMap none = b->compile(g)->run(no_key);
    for (const char* name : {"out", "t_out"})
      for (std::int64_t e = 0; e < none.at(name).numel(); ++e) EXPECT_EQ(none.at(name).data<float>()[e], 0.0f) << name;
  }

  auto qn = input<"q">(dim<1>, dim<"N">, dim<32>);
  auto kn = input<"k">(dim<1>, dim<"N">, dim<32>);
  auto vn = input<"v">(dim<1>, dim<"N">, dim<32>);
  const ir::Graph long_rows = ir::build_jvp(lower(named<"out">(scaled_dot_product_attention(qn, kn, vn, causal))), {{"q", "k", "v"}, {}});
  const std::int64_t n = 4096;
  auto exe = backends.cpu->compile(long_rows);
  const backend::TensorMap y = exe->run(backend::random_inputs(long_rows, {{"N", n}}, 3));
  EXPECT_EQ(y.at("t_out").numel(), n * 32);
  // The output and its tangent: 2 N x 32 floats (1 MiB); one N x N matrix would be 64 MiB.
  EXPECT_LE(exe->planned_bytes(), 4 * n * 32 * 4);
}

// The DSL's jvp(): the outputs and their tangents t_<out>, inputs t_<x> for the inputs named.
TEST(Jvp, TheDslNamesTangentsAfterTheirValues) {
  auto x = input<"x">(dim<"N">, dim<4>);
  auto w = input<"w">(dim<4>, dim<3>);
  const ir::Graph g = jvp(named<"y">(tanh(matmul(x, w))), wrt(x, w));
  EXPECT_NO_THROW(g.output("y"));
  const ir::ValueId t = g.output("t_y");
  EXPECT_EQ(g.node(t).shape, g.node(g.output("y")).shape);
  std::vector<std::string> names;
  for (ir::ValueId in : g.inputs()) names.push_back(g.node(in).name);
  EXPECT_EQ(names, (std::vector<std::string>{"x", "w", "t_x", "t_w"}));
  // d tanh(x w) = (1 - y^2) (t_x w + x t_w), checked against central differences.
  const ir::Graph forward = lower(named<"y">(tanh(matmul(x, w))));
  testing::expect_jvp_matches_central_differences(forward, backend::random_inputs(forward, {{"N", 3}}, 2), {"x", "w"});
  EXPECT_THROW(ir::build_jvp(forward, {{"nope"}, {}}), ShapeError);
  EXPECT_THROW(ir::build_jvp(forward, {{"x"}, {"nope"}}), ShapeError);
}

// Names autodiff gives its seeds and gradients ("dd_x", "dout") may be the graph's own: forward
// over reverse differentiates a backward graph, whose seed "dout" is a real input there; an output
// that does not depend on the inputs with tangents has a zero tangent.
TEST(Jvp, ForwardOverReverseAndNamesAutodiffUses) {
  auto x = input<"x">(dim<4>);
  auto dd_x = input<"dd_x">(dim<4>);
  auto w = input<"w">(dim<4>);
  const ir::Graph own_names = lower(named<"y">(x * dd_x), named<"dy">(exp(w)));
  testing::expect_jvp_matches_central_differences(own_names, backend::random_inputs(own_names, {}, 3), {"x"});
  const ir::Graph jvp = ir::build_jvp(own_names, {{"x"}, {}});
  std::vector<std::string> names;
  for (ir::ValueId in : jvp.inputs()) names.push_back(jvp.node(in).name);
  EXPECT_EQ(names, (std::vector<std::string>{"x", "dd_x", "w", "t_x"}));
  // A Hessian-vector product: the tangent of d_k (the gradient of attention's output with respect
  // to k, seeded from the input dout) along q.
  auto q = input<"q">(dim<1>, dim<2>, dim<5>, dim<8>);
  auto k = input<"k">(dim<1>, dim<2>, dim<6>, dim<8>);
  auto v = input<"v">(dim<1>, dim<2>, dim<6>, dim<8>);
  const ir::Graph backward =
      ir::build_backward(lower(named<"out">(scaled_dot_product_attention(q, k, v, causal_bottom_right))), {"", {"k"}, {"out"}});
  const backend::TensorMap in = backend::random_inputs(backward, {}, 5);
  const backend::TensorMap with_tangents = in_f32(testing::expect_jvp_matches_central_differences(backward, in, {"q"}));
  testing::expect_equivalent(ir::build_jvp(backward, {{"q"}, {}}), with_tangents, "cpu");
}

}  // namespace
}  // namespace qkv
