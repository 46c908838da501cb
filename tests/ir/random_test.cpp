// The Philox generator behind dropout masks: the published known-answer vectors of Random123
// (Salmon et al. 2011) and the statistics of the masks it makes.
#include <gtest/gtest.h>

#include "ir/random.hpp"

namespace qkv::ir {
namespace {

TEST(Philox, KnownAnswers) {
  using W = std::array<std::uint32_t, 4>;
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}), (W{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}),
            (W{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
            (W{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
  static_assert(philox4x32_10({0, 0, 0, 0}, {0, 0})[0] == 0x6627e8d5u, "usable in constant expressions");
}

TEST(Philox, DropoutKeepsAboutOneMinusP) {
  for (double p : {0.1, 0.5, 0.9}) {
    const std::uint32_t threshold = dropout_threshold(p);
    int kept = 0;
    constexpr int n = 200000;
    for (std::uint32_t i = 0; i < n; ++i) kept += dropout_keeps(17, i, threshold);
    EXPECT_NEAR(kept / static_cast<double>(n), 1.0 - p, 0.005) << p;  // ~5 standard deviations
  }
  EXPECT_EQ(dropout_threshold(0.0), 0u);
  EXPECT_TRUE(dropout_keeps(3, 12345, dropout_threshold(0.0)));
}

TEST(Philox, SeedsGiveDifferentMasks) {
  const std::uint32_t threshold = dropout_threshold(0.5);
  int same = 0;
  for (std::uint32_t i = 0; i < 1000; ++i) same += dropout_keeps(1, i, threshold) == dropout_keeps(2, i, threshold);
  EXPECT_GT(same, 400);
  EXPECT_LT(same, 600);
}

}  // namespace
}  // namespace qkv::ir
