// The vulkan matmul kernels (lanes and tiled) in each geometry they can be given: odd sizes on both sides of a tile
// (1, 7, 63, 65, 129), transposed operands read in place, broadcast batch dims, against the
// float64 reference; and geometries the device cannot run are refused with the reason.
#include <gtest/gtest.h>

#include "backends/vulkan/context.hpp"
#include "backends/vulkan/vulkan_backend.hpp"
#include "tests/support/backend_fixture.hpp"

namespace qkv {
namespace {

using ir::Graph;
using ir::Op;
using qkv::DType;

/// a @ b (transposed as asked), a of shape a_batch + [M, K] (or [K, M]), b of b_batch + [K, N]
/// (or [N, K]).
ir::ValueId add_matmul(Graph& g, const ir::Shape& a_batch, const ir::Shape& b_batch, bool ta, bool tb) {
  const ir::Dim m = g.symbol("M"), n = g.symbol("N"), k = g.symbol("K");
  ir::Shape as = a_batch, bs = b_batch;
  as.push_back(ta ? k : m);
  as.push_back(ta ? m : k);
  bs.push_back(tb ? n : k);
  bs.push_back(tb ? k : n);
  ir::Attrs attrs;
  attrs.transpose_a = ta;
  attrs.transpose_b = tb;
  return g.add(Op::matmul, {g.add_input("a", DType::f32, as), g.add_input("b", DType::f32, bs)}, attrs);
}

/// out = a @ b.
Graph matmul_graph(const ir::Shape& a_batch, const ir::Shape& b_batch, bool ta, bool tb) {
  Graph g;
  g.set_output("out", add_matmul(g, a_batch, b_batch, ta, tb));
  return g;
}

std::unique_ptr<backend::Backend> vulkan_with(std::array<std::uint32_t, 5> geometry, backend::VulkanOptions::Tuning tuning) {
  auto options = backend::vulkan_options_from_env();
  options.matmul_geometry = geometry;
  options.tuning = tuning;
  return backend::make_vulkan_backend(options);
}

/// Each geometry (invocations, rows and vec4 columns per invocation, depth, invocations across)
/// on sizes around its tiles: the defaults for lavapipe and for GPUs (0: chosen per shape, which
/// takes the thin path at M = 1), and uneven ones whose loads do not divide the invocations.
TEST(VulkanMatmul, EveryGeometryMatchesTheReferenceOnOddShapes) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  using Tuning = backend::VulkanOptions::Tuning;
  const std::pair<std::array<std::uint32_t, 5>, Tuning> geometries[] = {
      {{0, 0, 0, 0, 0}, Tuning::cpu},   {{0, 0, 0, 0, 0}, Tuning::gpu},   {{256, 8, 2, 8, 16}, Tuning::gpu},
      {{64, 4, 1, 4, 64}, Tuning::cpu}, {{32, 12, 3, 5, 4}, Tuning::cpu}, {{16, 16, 4, 3, 2}, Tuning::gpu},
  };
  const Graph plain = matmul_graph({}, {}, false, false);
  const Graph transposed = matmul_graph({}, {}, true, true);
  for (const auto& [geometry, tuning] : geometries) {
    auto b = vulkan_with(geometry, tuning);
    SCOPED_TRACE(std::to_string(geometry[0]) + "," + std::to_string(geometry[1]) + "," + std::to_string(geometry[2]) + "," +
                 std::to_string(geometry[3]) + "," + std::to_string(geometry[4]));
    for (std::int64_t m : {1, 7, 65, 129})
      for (std::int64_t n : {1, 63, 129}) {
        const std::int64_t k = m == 1 ? 129 : n == 63 ? 65 : 7;
        const Graph& g = (m + n) % 2 ? transposed : plain;
        testing::expect_equivalent(g, backend::random_inputs(g, {{"M", m}, {"N", n}, {"K", k}}, 7), *b);
      }
  }
}

/// The lanes kernel takes a tile per launch that fits the output (1, 2 or 4 groups of 8 rows by
/// 1, 2, 4 or 8 columns per lane, one or two subgroups): every one of them, with rows and columns
/// on both sides of the tile's edge.
TEST(VulkanMatmul, EveryLanesTileMatchesTheReference) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  auto b = vulkan_with({}, backend::VulkanOptions::Tuning::cpu);
  const Graph plain = matmul_graph({2}, {}, false, false);
  const Graph transposed = matmul_graph({}, {}, true, true);
  for (std::int64_t m : {1, 8, 9, 16, 17, 32, 33})
    for (std::int64_t n : {1, 9, 16, 17, 33, 64, 65}) {
      const Graph& g = (m + n) % 2 ? transposed : plain;
      testing::expect_equivalent(g, backend::random_inputs(g, {{"M", m}, {"N", n}, {"K", 11}}, 5), *b);
    }
}

/// Batch dims broadcast from either side (a [2, 3, M, K] by b [K, N], a [1, M, K] by b [3, 1, K,
/// N] transposed), each operand read in place with batch stride 0 where it broadcasts.
TEST(VulkanMatmul, BroadcastBatchesMatchTheReference) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  for (auto tuning : {backend::VulkanOptions::Tuning::cpu, backend::VulkanOptions::Tuning::gpu}) {
    auto b = vulkan_with({}, tuning);
    const Graph left = matmul_graph({2, 3}, {}, false, false);
    testing::expect_equivalent(left, backend::random_inputs(left, {{"M", 65}, {"N", 33}, {"K", 17}}, 1), *b);
    const Graph right = matmul_graph({1}, {3, 1}, false, true);
    testing::expect_equivalent(right, backend::random_inputs(right, {{"M", 9}, {"N", 130}, {"K", 40}}, 2), *b);
    const Graph empty = matmul_graph({}, {}, false, false);  // K = 0: zeros
    testing::expect_equivalent(empty, backend::random_inputs(empty, {{"M", 5}, {"N", 6}, {"K", 0}}, 3), *b);
  }
}

/// The matmul's epilogue (a scale, a bias broadcast over rows and batches, an activation and a
/// residual broadcast over one batch dim) computed in its store, in every geometry, on odd
/// sizes and transposed operands: one kernel, the reference's numbers.
TEST(VulkanMatmul, EpiloguesMatchTheReferenceInEveryGeometry) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  using Tuning = backend::VulkanOptions::Tuning;
  auto epilogue_graph = [](bool ta, bool tb) {
    Graph g;
    const ir::ValueId mm = add_matmul(g, {2, 3}, {3}, ta, tb);
    const ir::Dim n = g.symbol("N"), m = g.symbol("M");
    const ir::ValueId bias = g.add_input("bias", DType::f32, {n});
    const ir::ValueId res = g.add_input("res", DType::f32, {3, m, n});
    const ir::ValueId scaled = g.add(Op::mul, {mm, g.constant(0.125)});
    const ir::ValueId act = g.add(Op::tanh, {g.add(Op::add, {scaled, bias})});
    g.set_output("out", g.add(Op::add, {act, res}));
    return g;
  };
  const std::pair<std::array<std::uint32_t, 5>, Tuning> geometries[] = {
      {{0, 0, 0, 0, 0}, Tuning::cpu}, {{0, 0, 0, 0, 0}, Tuning::gpu}, {{32, 12, 3, 5, 4}, Tuning::cpu}, {{64, 8, 2, 16, 8}, Tuning::cpu}};
  const Graph plain = epilogue_graph(false, false), transposed = epilogue_graph(true, true);
  for (const auto& [geometry, tuning] : geometries) {
    auto b = vulkan_with(geometry, tuning);
    SCOPED_TRACE(std::to_string(geometry[0]) + "," + std::to_string(geometry[1]) + "," + std::to_string(geometry[2]));
    int launched = 0;
    for (std::size_t v = 0; v < plain.size(); ++v) launched += b->kernel_name(plain, static_cast<ir::ValueId>(v)).starts_with("glsl ");
    EXPECT_EQ(launched, 1) << "the epilogue is computed in the matmul's store";
    for (std::int64_t m : {1, 7, 65})
      for (std::int64_t n : {1, 63, 129}) {
        const Graph& g = (m + n) % 2 ? transposed : plain;
        testing::expect_equivalent(g, backend::random_inputs(g, {{"M", m}, {"N", n}, {"K", m == 1 ? 129 : 17}}, 9), *b);
      }
  }
}

/// lavapipe (a CPU device with subgroup broadcasts) takes the lanes kernel, a GPU's geometry or a
/// forced tile geometry the tiled one.
TEST(VulkanMatmul, EachTargetTakesItsKernel) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  // The lanes kernel unrolls its broadcasts over the device's subgroup, whose size its name
  // carries (4, 8 or 16 on lavapipe as LP_NATIVE_VECTOR_WIDTH sets it, 32 on NVIDIA); a device
  // without subgroup broadcasts, or of another size (AMD's 64), takes the tiled kernel.
  const std::uint32_t sg = backend::vulkan::Context::get(backend::vulkan_options_from_env())->subgroup_size();
  const bool lanes = sg >= 4 && sg <= 32 && (sg & (sg - 1)) == 0;
  const Graph g = matmul_graph({}, {}, false, true);
  const auto v = g.output("out");
  EXPECT_EQ(vulkan_with({}, backend::VulkanOptions::Tuning::cpu)->kernel_name(g, v),
            lanes ? "glsl matmul_lanes" + std::to_string(sg) + "_b0_tb" : std::string("glsl matmul_b0_tb"));
  EXPECT_EQ(vulkan_with({}, backend::VulkanOptions::Tuning::gpu)->kernel_name(g, v), "glsl matmul_b0_tb");
  EXPECT_EQ(vulkan_with({64, 8, 2, 16, 8}, backend::VulkanOptions::Tuning::cpu)->kernel_name(g, v), "glsl matmul_b0_tb");
}

TEST(VulkanMatmul, GeometriesTheDeviceCannotRunAreRefusedWithTheReason) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  auto refused = [](std::array<std::uint32_t, 5> g) {
    try {
      vulkan_with(g, backend::VulkanOptions::Tuning::automatic);
    } catch (const BackendError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(refused({48, 8, 1, 16, 8}).find("invocations must be a power of two"), std::string::npos);
  EXPECT_NE(refused({64, 6, 1, 16, 8}).find("rows per invocation must be 4, 8, 12 or 16"), std::string::npos);
  EXPECT_NE(refused({64, 8, 1, 16, 3}).find("must divide the invocations"), std::string::npos);
  EXPECT_NE(refused({1024, 16, 4, 64, 32}).find("bytes of shared memory, more than the device's"), std::string::npos);
  setenv("QKV_VULKAN_MATMUL_GEOMETRY", "64,8,1", 1);
  try {
    backend::vulkan_options_from_env();
    ADD_FAILURE() << "a short geometry was accepted";
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("give INVOCATIONS,ROWS,VEC4_COLUMNS,DEPTH,ACROSS"), std::string::npos) << e.what();
  }
  unsetenv("QKV_VULKAN_MATMUL_GEOMETRY");
}

}  // namespace
}  // namespace qkv
