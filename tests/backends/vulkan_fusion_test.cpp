// Kernel fusion on the device: fused kernels give the reference's numbers (broadcast operands,
// inlined constants, chains split by the buffer limit, forward and backward), the kernels of a
// known graph are counted, and random graphs still match with fusion off.
#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>

#include "backends/random_graph.hpp"
#include "backends/vulkan/vulkan_backend.hpp"
#include "dsl/dsl.hpp"
#include "ir/passes/passes.hpp"
#include "ir/printer.hpp"
#include "tests/support/backend_fixture.hpp"

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

/// The elementwise tail of x * w + b -> tanh -> * 2 is one kernel after the matmul.
TEST(VulkanFusion, CountsTheKernelsOfAKnownGraph) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  auto x = input<"x">(dim<"N">, dim<16>);
  auto w = input<"w">(dim<16>, dim<8>);
  auto b = input<"b">(dim<8>);
  const ir::Graph g = lower(named<"y">(tanh(matmul(x, w) + b) * 2.0));
  auto exe = vulkan->compile(g);
  EXPECT_EQ(kernels(*vulkan, exe->graph()), 2);  // the matmul, then add-tanh-mul with the constant inlined
  EXPECT_EQ(kernels(*vulkan_fusing(false), exe->graph()), 5);
  testing::expect_equivalent(g, backend::random_inputs(g, {{"N", 70}}, 2), *vulkan);
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
