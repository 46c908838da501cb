// The 16-bit float formats: IEEE binary16 (f16: 1 sign, 5 exponent, 10 fraction bits) and
// bfloat16 (bf16: f32's 8 exponent bits with 7 fraction bits). Stored as their bits; converted
// from f32 or f64 with round-to-nearest-even (overflow to infinity, subnormals kept, NaN stays
// NaN), to f32 exactly. What tensors of these dtypes hold and what every backend rounds to.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "ir/dtype.hpp"

namespace qkv {

/// An f16 element: its bits.
struct Half {
  std::uint16_t bits = 0;  ///< IEEE binary16: sign, 5 exponent bits, 10 significand bits
  /// Equal bits (so +0 and -0 differ, and a NaN equals itself).
  friend bool operator==(Half, Half) = default;
};
/// A bf16 element: its bits (the high half of the f32 it rounds).
struct BFloat16 {
  std::uint16_t bits = 0;  ///< sign, 8 exponent bits, 7 significand bits
  /// Equal bits (so +0 and -0 differ, and a NaN equals itself).
  friend bool operator==(BFloat16, BFloat16) = default;
};

namespace detail {
/// A format's significand bits (with the implicit one), smallest normal exponent and largest exponent.
struct Format {
  int digits, emin, emax;
};
constexpr Format kF16{11, -14, 15};
constexpr Format kBF16{8, -126, 127};
}  // namespace detail

/// `x` rounded to the nearest value of a float format with `f`'s significand and exponent range
/// (ties to even), as a double: what a result stored in that format holds. Infinities and NaN
/// pass; a finite value past the largest rounds to infinity.
inline double round_to_format(double x, detail::Format f) {
  if (!std::isfinite(x) || x == 0.0) return x;
  int e = 0;
  (void)std::frexp(x, &e);                           // |x| = m 2^e, m in [0.5, 1): the leading bit is 2^(e-1)
  const int lead = e - 1 < f.emin ? f.emin : e - 1;  // subnormals: the quantum of the smallest normal
  const double quantum = std::ldexp(1.0, lead - (f.digits - 1));
  const double r = std::nearbyint(x / quantum) * quantum;  // exact: x / quantum is a power-of-two scaling
  const double largest = std::ldexp(2.0 - std::ldexp(1.0, 1 - f.digits), f.emax);
  return std::fabs(r) > largest ? std::copysign(HUGE_VAL, x) : r;
}

/// `x` rounded to f16's or bf16's nearest value (f32 and f64: to f32's; others: unchanged).
inline double round_to(DType t, double x) {
  switch (t) {
    case DType::f16: return round_to_format(x, detail::kF16);
    case DType::bf16: return round_to_format(x, detail::kBF16);
    case DType::f32: return static_cast<double>(static_cast<float>(x));
    case DType::f64:
    case DType::boolean:
    case DType::i32: return x;
  }
  return x;
}

/// The f16 nearest `x`.
inline Half to_half(double x) {
  const double r = round_to_format(x, detail::kF16);
  const std::uint16_t sign = std::signbit(r) ? 0x8000 : 0;
  if (std::isnan(r)) return {static_cast<std::uint16_t>(sign | 0x7e00)};
  if (std::isinf(r)) return {static_cast<std::uint16_t>(sign | 0x7c00)};
  const double a = std::fabs(r);
  if (a < std::ldexp(1.0, -14)) return {static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(a * std::ldexp(1.0, 24)))};  // subnormal or zero
  int e = 0;
  const double m = std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
  const auto fraction = static_cast<std::uint16_t>((m * 2.0 - 1.0) * 1024.0);
  return {static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>((e - 1 + 15) << 10) | fraction)};
}

/// The value of an f16, exactly.
inline float to_float(Half h) {
  const bool negative = (h.bits & 0x8000) != 0;
  const int exponent = (h.bits >> 10) & 0x1f, fraction = h.bits & 0x3ff;
  float v;
  if (exponent == 0x1f) v = fraction ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else if (exponent == 0) v = std::ldexp(static_cast<float>(fraction), -24);
  else v = std::ldexp(static_cast<float>(fraction | 0x400), exponent - 25);
  return negative ? -v : v;
}

/// The bf16 nearest `x`: the high half of the f32 holding x rounded to bf16 (exact, as the
/// rounded value is an f32).
inline BFloat16 to_bfloat16(double x) {
  if (std::isnan(x)) return {static_cast<std::uint16_t>(std::signbit(x) ? 0xffc0 : 0x7fc0)};
  const auto f = static_cast<float>(round_to_format(x, detail::kBF16));
  return {static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(f) >> 16)};
}

/// The value of a bf16, exactly.
inline float to_float(BFloat16 b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b.bits) << 16); }

}  // namespace qkv

namespace qkv {

/// Bulk conversions between f32 and the half formats, the same values as the scalar ones above
/// (NaN stays NaN, though its payload bits may differ): F16C for f16 where the CPU has it (one
/// instruction per 8 values), AVX2 integer rounding for bf16.
void to_half(const float* in, Half* out, std::int64_t n);
/// out[i] = in[i] widened from f16 to f32 (exact), for n elements.
void to_float(const Half* in, float* out, std::int64_t n);
/// out[i] = in[i] rounded to the nearest bf16 (ties to even), for n elements.
void to_bfloat16(const float* in, BFloat16* out, std::int64_t n);
/// out[i] = in[i] widened from bf16 to f32 (exact), for n elements.
void to_float(const BFloat16* in, float* out, std::int64_t n);
/// in[i] rounded to `t`'s nearest value (f16 or bf16), kept in f32: what round_f16 and round_bf16
/// compute; `in` and `out` may be the same.
void round_through(DType t, const float* in, float* out, std::int64_t n);

}  // namespace qkv
