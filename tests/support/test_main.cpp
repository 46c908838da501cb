// The test programs' main: turns on Vulkan validation and fails any test during which the
// validation layers reported a message.
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
  testing::InitGoogleTest(&argc, argv);
  testing::UnitTest::GetInstance()->listeners().Append(new ValidationListener);
  return RUN_ALL_TESTS();
}
