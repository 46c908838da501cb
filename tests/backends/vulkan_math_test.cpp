// The Vulkan kernels' own sin and cos (codegen/glsl/qkv_sincos.glsl): GLSL's built-ins need only
// be within 2^-11 on [-pi, pi], and NVIDIA's err by about 1e-7 absolute (a dozen ulps of
// sin(0.1)); these are held to a few ulps of the float64 result over every quadrant up to
// |x| = 1e5, a budget NVIDIA's built-ins fail.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numbers>
#include <random>

#include "backends/backend.hpp"
#include "ir/graph.hpp"
#include "tests/support/backend_fixture.hpp"

namespace qkv {
namespace {

/// One ulp of |y| in float (of the smallest normal below it).
double ulp(double y) {
  const float a = std::max(std::fabs(static_cast<float>(y)), std::numeric_limits<float>::min());
  return static_cast<double>(std::nextafter(a, std::numeric_limits<float>::infinity()) - a);
}

TEST(VulkanMath, SinAndCosAreWithinAFewUlpsOverEveryQuadrant) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  std::vector<float> x = {0.0f, -0.0f, 1e-30f, -1e-7f, 0.1f, -0.1f, 0.5f, 1.0f, 3.0f, 1e4f, -9.9e4f, 1e5f};
  // Every quadrant and both sides of its boundaries, the floats nearest k pi / 2 (where sin or
  // cos is near zero and r must be exact), and random arguments of every magnitude up to 1e5.
  for (int k : {1, 2, 3, 4, 5, 7, 100, 1001, 4096, 63000}) {
    const float at = static_cast<float>(k * std::numbers::pi / 2);
    for (float f : {std::nextafter(at, 0.0f), at, std::nextafter(at, 1e9f)}) {
      x.push_back(f);
      x.push_back(-f);
    }
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 400; ++i) x.push_back(std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng), i % 17));
  const auto n = static_cast<std::int64_t>(x.size());
  ir::Graph g;
  const ir::ValueId in = g.add_input("x", DType::f32, {n});
  g.set_output("sin", g.add(ir::Op::sin, {in}));
  g.set_output("cos", g.add(ir::Op::cos, {in}));
  const backend::TensorMap out = vulkan->compile(g)->run({{"x", Tensor::from({n}, x)}});
  for (std::int64_t i = 0; i < n; ++i) {
    const double a = x[static_cast<std::size_t>(i)];
    for (const auto& [name, exact] : {std::pair<std::string, double>{"sin", std::sin(a)}, {"cos", std::cos(a)}}) {
      const double got = out.at(name).at(i);
      EXPECT_LE(std::fabs(got - exact), 4 * ulp(exact)) << name << "(" << a << ") = " << got << ", float64 gives " << exact;
    }
  }
}

TEST(VulkanMath, SinAndCosOfNanAndTheInfinitiesAreNanAndSinKeepsTheSignOfZero) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {std::numeric_limits<float>::quiet_NaN(), inf, -inf, 3e5f, -0.0f};
  ir::Graph g;
  const ir::ValueId in = g.add_input("x", DType::f32, {5});
  g.set_output("sin", g.add(ir::Op::sin, {in}));
  g.set_output("cos", g.add(ir::Op::cos, {in}));
  const backend::TensorMap out = vulkan->compile(g)->run({{"x", Tensor::from({5}, x)}});
  for (const char* name : {"sin", "cos"}) {
    for (std::int64_t i = 0; i < 3; ++i) EXPECT_TRUE(std::isnan(out.at(name).at(i))) << name << "(" << x[static_cast<std::size_t>(i)] << ")";
    // Beyond 1e5 the built-in: finite and within [-1, 1] (its precision is the driver's).
    EXPECT_LE(std::fabs(out.at(name).at(3)), 1.0) << name << "(3e5)";
  }
  EXPECT_TRUE(std::signbit(out.at("sin").at(4))) << "sin(-0) is -0";
  EXPECT_EQ(out.at("cos").at(4), 1.0);
}

}  // namespace
}  // namespace qkv
