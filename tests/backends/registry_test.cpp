// The backend registry: names, errors, the default from QKV_BACKEND, equivalence reports.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "backends/backend.hpp"
#include "backends/equivalence.hpp"
#include "ir/op_cases.hpp"

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

}  // namespace
}  // namespace qkv::backend
