// Per-kernel device timing (Executable::set_profiling / profile): what qkv bench --profile and
// the benchmarks' QKV_BENCH_DEVICE_TIME read.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>

#include "backends/vulkan/vulkan_backend.hpp"
#include "dsl/dsl.hpp"
#include "tests/support/backend_fixture.hpp"

namespace qkv {
namespace {

ir::Graph attention_with_weights() {
  auto q = input<"q">(dim<2>, dim<"N">, dim<8>);
  auto k = input<"k">(dim<2>, dim<"N">, dim<8>);
  auto v = input<"v">(dim<2>, dim<"N">, dim<8>);
  auto weights = attention_weights(q, k);
  return lower(named<"out">(matmul(weights, v)), named<"weights">(weights));
}

/// With profiling on, every kernel of the run appears once, in launch order, with a device time
/// that is positive and within the run's wall time; turning it off empties the profile again.
TEST(Profile, VulkanTimesEveryKernelOfTheLastRun) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  ir::Graph g = attention_with_weights();
  auto exe = vulkan->compile(g);
  auto in = backend::random_inputs(g, {{"N", 33}}, 1);
  exe->run(in);
  EXPECT_TRUE(exe->profile().empty()) << "profiling is off by default";
  exe->set_profiling(true);
  const auto reference = exe->run(in);
  auto t0 = std::chrono::steady_clock::now();
  const auto again = exe->run(in);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(again.at("out").nbytes(), reference.at("out").nbytes());
  EXPECT_EQ(std::memcmp(again.at("out").raw(), reference.at("out").raw(), again.at("out").nbytes()), 0) << "timestamps change no result";
  const auto profile = exe->profile();
  std::vector<ir::ValueId> kernels;
  for (std::size_t i = 0; i < exe->graph().size(); ++i)
    if (vulkan->kernel_name(exe->graph(), static_cast<ir::ValueId>(i)).starts_with("glsl ")) kernels.push_back(static_cast<ir::ValueId>(i));
  ASSERT_EQ(profile.size(), kernels.size());
  double total = 0;
  for (std::size_t k = 0; k < profile.size(); ++k) {
    EXPECT_EQ(profile[k].value, kernels[k]);
    EXPECT_GE(profile[k].seconds, 0.0);
    total += profile[k].seconds;
  }
  EXPECT_GT(total, 0.0);
  EXPECT_LT(total, wall);
  exe->set_profiling(false);
  exe->run(in);
  EXPECT_TRUE(exe->profile().empty());
}

/// Every device reports what kernels may use, within what Vulkan guarantees; the one the
/// backend picked can write the timestamps profiling needs exactly when the listing says so.
TEST(Profile, VulkanDevicesReportTheirCapabilities) {
  QKV_GET_BACKEND_OR_SKIP(vulkan, "vulkan");
  const auto devices = backend::vulkan_devices();
  ASSERT_FALSE(devices.empty());
  bool picked = false;
  for (const auto& d : devices) {
    SCOPED_TRACE(d.name + ": " + d.capabilities());
    EXPECT_GE(d.subgroup_size, 1u);
    EXPECT_EQ(d.subgroup_size & (d.subgroup_size - 1), 0u) << "a power of two";
    EXPECT_GE(d.shared_memory_bytes, 16384u);  // Vulkan's minimum
    EXPECT_GE(d.max_invocations, 128u);
    EXPECT_NE(d.capabilities().find("subgroup " + std::to_string(d.subgroup_size)), std::string::npos);
    if (vulkan->device().starts_with(d.name + " (")) {
      picked = true;
      ir::Graph g = attention_with_weights();
      auto exe = vulkan->compile(g);
      exe->set_profiling(true);
      exe->run(backend::random_inputs(g, {{"N", 4}}, 1));
      EXPECT_EQ(!exe->profile().empty(), d.timestamps);
    }
  }
  EXPECT_TRUE(picked) << vulkan->device();
}

/// Backends that cannot time kernels ignore profiling and report nothing.
TEST(Profile, HostBackendsReportNothing) {
  for (const char* name : {"reference", "cpu"}) {
    auto be = backend::create(name);
    ir::Graph g = attention_with_weights();
    auto exe = be->compile(g);
    exe->set_profiling(true);
    exe->run(backend::random_inputs(g, {{"N", 5}}, 1));
    EXPECT_TRUE(exe->profile().empty()) << name;
  }
}

}  // namespace
}  // namespace qkv
