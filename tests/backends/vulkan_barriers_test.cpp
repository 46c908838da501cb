// Barrier levels: a kernel waits only for the kernels since the last barrier whose memory it
// depends on (read after write, write after read, write after write).
#include <gtest/gtest.h>

#include "backends/vulkan/barriers.hpp"

namespace qkv::backend {
namespace {

KernelAccess access(std::vector<ByteRange> reads, ByteRange write) { return {std::move(reads), {write}}; }

TEST(VulkanBarriers, IndependentKernelsShareALevel) {
  // Three projections of one input into separate buffers, then a kernel reading all three.
  const ByteRange x{0, 64}, q{64, 128}, k{128, 192}, v{192, 256}, out{256, 320};
  const auto wait = barriers_before({access({x}, q), access({x}, k), access({x}, v), access({q, k, v}, out)});
  EXPECT_EQ(wait, (std::vector<bool>{false, false, false, true}));
}

TEST(VulkanBarriers, EachHazardOpensALevel) {
  const ByteRange a{0, 16}, b{16, 32}, c{32, 48};
  // read after write
  EXPECT_EQ(barriers_before({access({a}, b), access({b}, c)}), (std::vector<bool>{false, true}));
  // write after read: the second kernel reuses storage the first still reads
  EXPECT_EQ(barriers_before({access({a}, b), access({c}, {8, 24})}), (std::vector<bool>{false, true}));
  // write after write
  EXPECT_EQ(barriers_before({access({a}, b), access({c}, {20, 28})}), (std::vector<bool>{false, true}));
  // reads of the same bytes and touching (not overlapping) ranges need none
  EXPECT_EQ(barriers_before({access({a}, b), access({a}, c), access({{0, 8}}, {48, 64})}), (std::vector<bool>{false, false, false}));
}

TEST(VulkanBarriers, ALevelEndsAtEachBarrier) {
  const ByteRange a{0, 16}, b{16, 32}, c{32, 48}, d{48, 64};
  // k1 waits for k0; k2 reads what k0 wrote, but that was before k1's barrier: no second wait.
  EXPECT_EQ(barriers_before({access({a}, b), access({b}, c), access({b}, d)}), (std::vector<bool>{false, true, false}));
}

}  // namespace
}  // namespace qkv::backend
