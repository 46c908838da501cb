// The test programs' main: turns on Vulkan validation and fails any test during which the
// validation layers reported a message; compiles kernels without spirv-opt's passes (at test
// sizes compiling a kernel is the cost, not running it; codegen's tests compile every kernel
// with them). The environment may say otherwise.
#include <gtest/gtest.h>

#include <cstdlib>

#include "backends/vulkan/vulkan_backend.hpp"

namespace {

class ValidationListener : public testing::EmptyTestEventListener {
  std::uint64_t before_ = 0;
  void OnTestStart(const testing::TestInfo&) override { before_ = qkv::backend::vulkan_validation_messages(); }
  void OnTestEnd(const testing::TestInfo&) override {
    auto after = qkv::backend::vulkan_validation_messages();
    EXPECT_EQ(after, before_) << "the Vulkan validation layers reported " << (after - before_) << " message(s) during this test";
  }
};

}  // namespace

int main(int argc, char** argv) {
  setenv("QKV_VULKAN_VALIDATION", "1", 0);
  setenv("QKV_VULKAN_OPTIMIZE_SPIRV", "0", 0);
  testing::InitGoogleTest(&argc, argv);
  testing::UnitTest::GetInstance()->listeners().Append(new ValidationListener);
  return RUN_ALL_TESTS();
}
