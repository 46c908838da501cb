// f16 and bf16: every bit pattern decodes exactly, conversions round to nearest even (from f64
// directly, never through f32), overflow goes to infinity, and tensors convert through them.
// GCC's _Float16 is the independent oracle for f16; f32's bits for bf16.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "ir/half.hpp"
#include "ir/tensor.hpp"

namespace qkv {
namespace {

bool same_value(double a, double b) { return (std::isnan(a) && std::isnan(b)) || (a == b && std::signbit(a) == std::signbit(b)); }

#if defined(__FLT16_MAX__)
std::uint16_t oracle_f16(double x) { return std::bit_cast<std::uint16_t>(static_cast<_Float16>(x)); }

TEST(Half, EveryF16DecodesAsTheOracleDoes) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const Half h{static_cast<std::uint16_t>(b)};
    const float want = static_cast<float>(std::bit_cast<_Float16>(h.bits));
    ASSERT_TRUE(same_value(to_float(h), want)) << std::hex << b;
  }
}

TEST(Half, F16RoundsToNearestEvenAsTheOracleDoes) {
  std::vector<double> xs = {0.0, -0.0, 1.0, 65504.0, 65519.99, 65520.0, -65520.0, 1e9, 6e-8, 2.98e-8, 2.99e-8, 1e-10, INFINITY, -INFINITY};
  // Every value, and the midpoints between neighbours (ties: to even) and just beside them.
  for (std::uint32_t b = 0; b < 0x7c00; ++b) {
    const double lo = to_float(Half{static_cast<std::uint16_t>(b)}), hi = to_float(Half{static_cast<std::uint16_t>(b + 1)});
    const double mid = (lo + hi) / 2;
    for (double x : {lo, mid, std::nextafter(mid, 0.0), std::nextafter(mid, 1e9)}) {
      xs.push_back(x);
      xs.push_back(-x);
    }
  }
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> exponent(-30, 17);
  for (int i = 0; i < 100000; ++i) xs.push_back(std::exp2(exponent(rng)) * (rng() % 2 ? 1 : -1));
  for (double x : xs) {
    ASSERT_EQ(to_half(x).bits, oracle_f16(x)) << x;
    ASSERT_TRUE(same_value(round_to(DType::f16, x), to_float(to_half(x)))) << x;
  }
  EXPECT_TRUE(std::isnan(to_float(to_half(NAN))));
}
#endif

/// bf16 from an f32, rounded to nearest even on its bits: the textbook conversion.
std::uint16_t bf16_of_float(float f) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

TEST(Half, Bf16RoundsAsF32BitsDoAndDecodesExactly) {
  std::mt19937 rng(3);
  for (int i = 0; i < 200000; ++i) {
    float f = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
    if (std::isnan(f)) continue;
    ASSERT_EQ(to_bfloat16(f).bits, bf16_of_float(f)) << f;
  }
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const BFloat16 h{static_cast<std::uint16_t>(b)};
    ASSERT_TRUE(same_value(to_float(h), std::bit_cast<float>(b << 16))) << std::hex << b;
  }
  // From f64 directly: 1 + 2^-8 + 2^-40 is above the tie between 1 and 1 + 2^-7, which rounding
  // through f32 (1 + 2^-8, a tie, to even: 1) would miss.
  EXPECT_EQ(to_float(to_bfloat16(1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40))), 1.0f + std::ldexp(1.0f, -7));
  EXPECT_EQ(to_float(to_bfloat16(1.0 + std::ldexp(1.0, -8))), 1.0f);  // the tie itself: to even
  EXPECT_TRUE(std::isinf(to_float(to_bfloat16(3.5e38))));             // past bf16's largest, 3.39e38
  EXPECT_TRUE(std::isnan(to_float(to_bfloat16(NAN))));
}

TEST(Half, TensorsConvertThroughHalfPrecision) {
  const Tensor x = Tensor::from<float>({4}, {1.0f, 1.0f / 3.0f, 70000.0f, -2.5e-8f});
  const Tensor h = x.to(DType::f16);
  EXPECT_EQ(h.type_string(), "f16[4]");
  EXPECT_EQ(h.nbytes(), 8u);
  EXPECT_EQ(h.at(0), 1.0);
  EXPECT_EQ(h.at(1), 0.333251953125);  // 1/3 to 11 bits
  EXPECT_TRUE(std::isinf(h.at(2)));
  EXPECT_EQ(h.at(3), 0.0);  // below half the smallest subnormal (2^-24): a zero, keeping its sign
  EXPECT_TRUE(std::signbit(h.at(3)));
  const Tensor b = x.to(DType::bf16);
  EXPECT_EQ(b.type_string(), "bf16[4]");
  EXPECT_EQ(b.at(1), 0.333984375);  // 1/3 to 8 bits
  EXPECT_EQ(b.at(2), 70144.0);
  EXPECT_EQ(b.to(DType::f32).at(1), 0.333984375);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(parse_dtype("bf16"), DType::bf16);
  EXPECT_EQ(parse_dtype("f16"), DType::f16);
}

// The bulk conversions (F16C and AVX2 where the CPU has them) give the scalar ones' values for
// every f16 and bf16, for f32 values at and around every tie, subnormals, overflow, infinities
// and NaN, at lengths that leave a tail after the vector loop.
TEST(Half, BulkConversionsAreTheScalarOnes) {
  std::vector<float> xs;
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const float f16 = to_float(Half{static_cast<std::uint16_t>(b)});
    const float bf16 = std::bit_cast<float>(b << 16);
    for (float v : {f16, bf16}) xs.insert(xs.end(), {v, std::nextafter(v, 0.0f), std::nextafter(v, INFINITY)});
    // Halfway between neighbouring bf16 values, and one f32 ulp either side: the ties.
    const float tie = std::bit_cast<float>((b << 16) | 0x8000u);
    xs.insert(xs.end(), {tie, std::nextafter(tie, 0.0f), std::nextafter(tie, INFINITY)});
  }
  xs.insert(xs.end(), {65504.0f, 65520.0f, 65519.99f, 1e-8f, -1e-8f, 3e38f, std::numeric_limits<float>::quiet_NaN(), -INFINITY});
  xs.push_back(1.0f);  // an odd length: a tail after every vector loop
  const auto n = static_cast<std::int64_t>(xs.size());
  std::vector<Half> h(xs.size());
  std::vector<BFloat16> bf(xs.size());
  std::vector<float> back(xs.size()), rounded(xs.size());
  to_half(xs.data(), h.data(), n);
  to_bfloat16(xs.data(), bf.data(), n);
  auto same = [](double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; };
  int wrong = 0;
  for (std::size_t i = 0; i < xs.size() && wrong < 10; ++i) {
    const double x = xs[i];
    if (!same(to_float(h[i]), to_float(to_half(x))))
      ADD_FAILURE() << "f16 of " << x << ": " << to_float(h[i]) << ", scalar " << to_float(to_half(x)), ++wrong;
    if (!same(to_float(bf[i]), to_float(to_bfloat16(x))))
      ADD_FAILURE() << "bf16 of " << x << ": " << to_float(bf[i]) << ", scalar " << to_float(to_bfloat16(x)), ++wrong;
  }
  to_float(h.data(), back.data(), n);
  for (std::size_t i = 0; i < xs.size(); ++i) ASSERT_TRUE(same(back[i], to_float(h[i]))) << i;
  to_float(bf.data(), back.data(), n);
  for (std::size_t i = 0; i < xs.size(); ++i) ASSERT_TRUE(same(back[i], to_float(bf[i]))) << i;
  for (DType t : {DType::f16, DType::bf16}) {
    round_through(t, xs.data(), rounded.data(), n);
    for (std::size_t i = 0; i < xs.size(); ++i) ASSERT_TRUE(same(rounded[i], round_to(t, xs[i]))) << dtype_name(t) << " " << xs[i];
  }
}

}  // namespace
}  // namespace qkv
