// The backend registry: names, errors, the default from QKV_BACKEND, equivalence reports.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "backends/backend.hpp"
#include "backends/equivalence.hpp"
#include "backends/reference/reference_backend.hpp"
#include "sweeps/op_cases.hpp"

namespace qkv::backend {
namespace {

TEST(Registry, ListsBackendsInOrder) { EXPECT_EQ(backend_names(), (std::vector<std::string>{"reference", "cpu", "vulkan"})); }

TEST(Registry, UnknownNameIsAnError) {
  try {
    create("tpu");
    FAIL();
  } catch (const UnsupportedError& e) {
    EXPECT_STREQ(e.what(), "unknown backend 'tpu' (known: reference, cpu, vulkan)");
  }
}

TEST(Registry, DefaultFromEnvironment) {
  setenv("QKV_BACKEND", "reference", 1);
  EXPECT_EQ(default_backend_name(), "reference");
  unsetenv("QKV_BACKEND");
  EXPECT_EQ(default_backend_name(), "cpu");
}

TEST(Registry, ProbeReportsEveryBackend) {
  auto status = probe_backends();
  ASSERT_EQ(status.size(), 3u);
  EXPECT_TRUE(status[0].available);
  EXPECT_TRUE(status[1].available);
  EXPECT_FALSE(status[2].detail.empty());
}

TEST(Registry, VulkanWithImpossibleDeviceFilterSaysWhy) {
  setenv("QKV_VULKAN_DEVICE", "no-such-device-xyz", 1);
  try {
    create("vulkan");
    ADD_FAILURE() << "a device matched";
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("vulkan: "), std::string::npos) << e.what();
  }
  unsetenv("QKV_VULKAN_DEVICE");
}

TEST(Equivalence, ReportFailsUnknownBackendAndPrintsTable) {
  ir::Graph g = ir::case_graph(ir::Op::exp, ir::op_cases(ir::Op::exp)[0]);
  auto in = random_inputs(g, {}, 3);
  auto report = check_equivalence(g, in, {"reference", "cpu", "nope"});
  ASSERT_EQ(report.backends.size(), 3u);
  EXPECT_TRUE(report.backends[0].pass);
  EXPECT_TRUE(report.backends[1].pass);
  EXPECT_FALSE(report.backends[2].pass);
  EXPECT_FALSE(report.pass());
  EXPECT_NE(report.table().find("unknown backend 'nope'"), std::string::npos);
}

TEST(Equivalence, BudgetCatchesWrongResults) {
  Tensor oracle = Tensor::from<double>({3}, {1.0, 2.0, 3.0});
  Tensor plain = Tensor::from<double>({3}, {1.0, 2.0, 3.0000001});
  EXPECT_TRUE(compare_output("y", Tensor::from<float>({3}, {1.0f, 2.0f, 3.0f}), oracle, plain).pass);
  EXPECT_FALSE(compare_output("y", Tensor::from<float>({3}, {1.0f, 2.0f, 3.01f}), oracle, plain).pass);
  EXPECT_FALSE(compare_output("y", Tensor::from<float>({3}, {1.0f, NAN, 3.0f}), oracle, plain).pass);
}

// The plain float32 error is taken over two summation orders: 1e8 - 1e8 + 1 is exact in float32
// from the first term, and 0 from the last; a backend that sums from the end is within budget
// only when the budget knows that order.
TEST(Equivalence, BudgetTakesTheWorseOfTwoSummationOrders) {
  ir::Graph g;
  ir::Attrs sum;
  sum.axis = 0;
  sum.keepdim = false;
  g.set_output("y", g.add(ir::Op::reduce_sum, {g.add_input("x", DType::f32, {3})}, sum));
  const TensorMap x = {{"x", Tensor::from<float>({3}, {1e8f, -1e8f, 1.0f})}};
  const TensorMap plain = make_reference_backend({Precision::f32, true})->compile(g)->run(x);
  const TensorMap reversed =
      make_reference_backend({.precision = Precision::f32, .f64_outputs = true, .f64_inputs = false, .reversed_sums = true})->compile(g)->run(x);
  EXPECT_EQ(plain.at("y").at(0), 1.0);
  EXPECT_EQ(reversed.at("y").at(0), 0.0);
  const Tensor oracle = Tensor::from<double>({}, {1.0}), from_the_end = Tensor::from<float>({}, {0.0f}), wrong = Tensor::from<float>({}, {40.0f});
  EXPECT_FALSE(compare_output("y", from_the_end, oracle, plain.at("y")).pass);
  EXPECT_TRUE(compare_output("y", from_the_end, oracle, plain.at("y"), 8.0, &reversed.at("y")).pass);
  EXPECT_FALSE(compare_output("y", wrong, oracle, plain.at("y"), 8.0, &reversed.at("y")).pass);
}

// A loss of f16 products that cancel (terms of 0.2, a sum of 0.02): a backend whose f32 product
// lands on the other side of one rounding moves the sum by an ulp of 0.2, eight of the sum's. The
// budget scaled by the output's own ulps calls that wrong; with how far flipping every rounding
// moves the sum (half_rounding_spread) it passes, and an error ten times that still fails.
TEST(Equivalence, HalfRoundingsBeforeCancellationWidenTheBudgetByWhatTheyMove) {
  const std::int64_t n = 64;
  auto loss = [&](DType dtype) {
    ir::Graph g;
    ir::Attrs sum;
    sum.axis = 0;
    sum.keepdim = false;
    const ir::ValueId x = g.add_input("x", dtype, {n}), w = g.add_input("w", dtype, {n});
    g.set_output("y", g.add(ir::Op::reduce_sum, {g.add(ir::Op::mul, {w, x})}, sum));
    return g;
  };
  const ir::Graph g = loss(DType::f16);
  std::vector<float> xs, ws;
  for (std::int64_t i = 0; i < n; ++i) {
    xs.push_back(0.3f + 0.001f * static_cast<float>(i));
    ws.push_back(i % 2 != 0 ? 0.7f : -0.7f);
  }
  const TensorMap in = {{"x", Tensor::from<float>({n}, xs).to(DType::f16)}, {"w", Tensor::from<float>({n}, ws).to(DType::f16)}};
  const TensorMap oracle = make_reference_backend({Precision::f64, true})->compile(g)->run(in);
  const TensorMap plain = make_reference_backend({Precision::f32, true})->compile(g)->run(in);
  const double y = oracle.at("y").at(0), flip = std::ldexp(1.0, -13);  // an ulp of 0.2 in f16
  ASSERT_GT(y, 0.01);
  ASSERT_LT(y, 0.05);
  ComputedIn how = computed_in(g, "y");
  EXPECT_FALSE(
      compare_output("y", Tensor::from<double>({}, {y + flip}).to(DType::f16), oracle.at("y"), plain.at("y"), kDefaultBudgetFactor, nullptr, how)
          .pass);
  const std::map<std::string, double> spread = half_rounding_spread(g, in, oracle);
  ASSERT_EQ(spread.size(), 1u);
  how.spread = spread.at("y");
  EXPECT_GT(how.spread, 2 * flip);  // many products' roundings flipped
  EXPECT_LE(how.spread, y / 16);    // capped at a sixteenth of the sum
  EXPECT_TRUE(
      compare_output("y", Tensor::from<double>({}, {y + flip}).to(DType::f16), oracle.at("y"), plain.at("y"), kDefaultBudgetFactor, nullptr, how)
          .pass);
  EXPECT_FALSE(compare_output("y", Tensor::from<double>({}, {y + 10 * how.spread}).to(DType::f16), oracle.at("y"), plain.at("y"),
                              kDefaultBudgetFactor, nullptr, how)
                   .pass);
  // An f32 graph rounds nothing to half precision: no spread.
  EXPECT_TRUE(half_rounding_spread(loss(DType::f32), {{"x", in.at("x").to(DType::f32)}, {"w", in.at("w").to(DType::f32)}}, oracle).empty());
}

}  // namespace
}  // namespace qkv::backend
