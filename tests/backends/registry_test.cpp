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

}  // namespace
}  // namespace qkv::backend
