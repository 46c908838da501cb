// Vector math with GCC vector extensions (8 float lanes; one AVX register, two SSE registers),
// cloned for x86-64-v3 (AVX2 + FMA) with a portable fallback.
#include "backends/cpu/vector_math.hpp"

#include "ir/random.hpp"

#include <cstring>
#include <limits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

// The helpers below return 32-byte vectors (and take them by reference); they have internal
// linkage and are always inlined into the cloned functions, so GCC's ABI warning for the SSE
// fallback is moot.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace qkv::backend::cpu {

namespace {

using v8f = float __attribute__((vector_size(32)));
using v8i = std::int32_t __attribute__((vector_size(32)));
using v4d = double __attribute__((vector_size(32)));

[[gnu::always_inline]] inline v8f load(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
[[gnu::always_inline]] inline void store(float* p, const v8f& v) { std::memcpy(p, &v, sizeof v); }
[[gnu::always_inline]] inline v8f splat(float x) { return v8f{} + x; }

/// exp(x) = 2^k exp(r), k = round(x / ln 2), r = x - k ln 2 in [-ln2/2, ln2/2], exp(r) by the
/// Cephes polynomial (about 2 ulp). Below -87.3 (and -inf) gives exactly 0, above 88.72 (where
/// float overflows) +inf; NaN stays NaN (the clamps below may compile to min/max instructions
/// that drop a NaN, so it is restored last).
[[gnu::always_inline]] inline v8f exp8(const v8f& in) {
  v8f x = in;
  const v8i underflow = x < -87.3f;
  const v8i overflow = x > 88.72283f;
  x = x < -87.3f ? splat(-87.3f) : x;
  x = x > 88.3f ? splat(88.3f) : x;
  const v8f round = splat(12582912.0f);  // 1.5 * 2^23: adding and subtracting rounds to an integer
  v8f k = (x * 1.44269504088896341f + round) - round;
  v8f r = x - k * 0.693359375f - k * -2.12194440e-4f;
  v8f p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  v8i bits = (__builtin_convertvector(k, v8i) + 127) << 23;
  v8f e = p * __builtin_bit_cast(v8f, bits);
  const v8i nan = in != in;
  return nan ? in : underflow ? splat(0.0f) : overflow ? splat(std::numeric_limits<float>::infinity()) : e;
}

/// tanh(x): below |x| = 0.25 its odd Taylor series to x^11 (the next term is 2e-10 relative);
/// up to 0.55, (1 - e) / (1 + e) with e = exp(-2|x|); beyond, 1 - 2e / (1 + e), whose small
/// correction carries exp's error at a fraction of an ulp of the result. Never overflows (e <= 1);
/// the sign restored last; NaN stays NaN. The same algorithm as the GLSL qkv_tanh.
[[gnu::always_inline]] inline v8f tanh8(const v8f& x) {
  const v8i negative = x < 0.0f;
  const v8f a = negative ? -x : x;
  const v8f x2 = x * x;
  v8f p = 0.021869488536155203f + x2 * -0.0088632355299021973f;
  p = 0.13333333333333333f + x2 * (-0.053968253968253971f + x2 * p);
  const v8f small = x + x * x2 * (-0.33333333333333333f + x2 * p);
  const v8f e = exp8(-2.0f * a);
  const v8f r = 1.0f / (1.0f + e);  // one division for both forms
  const v8f mid = (1.0f - e) * r, large = 1.0f - 2.0f * e * r;
  const v8f magnitude = a < 0.55f ? mid : large;
  const v8i nan = x != x;
  return nan ? x : a < 0.25f ? small : negative ? -magnitude : magnitude;
}

[[gnu::always_inline]] inline float hsum(const v8f& v) {
  float s = 0;
  for (int i = 0; i < 8; ++i) s += v[i];
  return s;
}

}  // namespace

__attribute__((target_clones("arch=x86-64-v3", "default"))) float exp_shifted_sum(float* x, std::int64_t n, float shift) {
  // The sum in double: a row dominated by one weight near 1 would otherwise lose its small terms
  // to rounding at every add (softmax on saturating scores was 5x less accurate than a plain
  // float loop with a correctly rounded exp).
  v4d lo = {}, hi = {};
  auto add = [&](const v8f& e) {
    lo += __builtin_convertvector(__builtin_shufflevector(e, e, 0, 1, 2, 3), v4d);
    hi += __builtin_convertvector(__builtin_shufflevector(e, e, 4, 5, 6, 7), v4d);
  };
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    v8f e = exp8(load(x + i) - shift);
    store(x + i, e);
    add(e);
  }
  if (i < n) {  // the tail, through a padded vector
    float tail[8];
    for (int j = 0; j < 8; ++j) tail[j] = i + j < n ? x[i + j] - shift : -1e30f;
    v8f e = exp8(load(tail));
    for (std::int64_t j = 0; i + j < n; ++j) x[i + j] = e[j];
    add(e);
  }
  const v4d both = lo + hi;
  return static_cast<float>((both[0] + both[1]) + (both[2] + both[3]));
}

__attribute__((target_clones("arch=x86-64-v3", "default"))) void exp_shifted(float* x, std::int64_t n, float shift) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) store(x + i, exp8(load(x + i) - shift));
  if (i < n) {
    float tail[8];
    for (int j = 0; j < 8; ++j) tail[j] = i + j < n ? x[i + j] - shift : 0.0f;
    v8f e = exp8(load(tail));
    for (std::int64_t j = 0; i + j < n; ++j) x[i + j] = e[j];
  }
}

__attribute__((target_clones("arch=x86-64-v3", "default"))) void times_difference(float* y, const float* p, std::int64_t n, float c) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) store(y + i, load(p + i) * (load(y + i) - c));
  for (; i < n; ++i) y[i] = p[i] * (y[i] - c);
}

__attribute__((target_clones("arch=x86-64-v3", "default"))) float max_of(const float* x, std::int64_t n, float init) {
  v8f acc = splat(init);
  v8i nan = {};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    v8f v = load(x + i);
    nan |= v != v;
    acc = v > acc ? v : acc;
  }
  float m = init;
  bool any_nan = init != init;
  for (int j = 0; j < 8; ++j) {
    any_nan |= nan[j] != 0;
    m = acc[j] > m ? acc[j] : m;
  }
  for (; i < n; ++i) {
    any_nan |= x[i] != x[i];
    m = x[i] > m ? x[i] : m;
  }
  return any_nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

__attribute__((target_clones("arch=x86-64-v3", "default"))) void divide_inplace(float* y, std::int64_t n, float d) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) store(y + i, load(y + i) / d);
  for (; i < n; ++i) y[i] /= d;
}

__attribute__((target_clones("arch=x86-64-v3", "default"))) void scale_inplace(float* y, std::int64_t n, float s) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) store(y + i, load(y + i) * s);
  for (; i < n; ++i) y[i] *= s;
}

__attribute__((target_clones("arch=x86-64-v3", "default"))) void tanh_of(const float* x, float* y, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) store(y + i, tanh8(load(x + i)));
  if (i < n) {
    float tail[8] = {};
    for (std::int64_t j = 0; i + j < n; ++j) tail[j] = x[i + j];
    const v8f t = tanh8(load(tail));
    for (std::int64_t j = 0; i + j < n; ++j) y[i + j] = t[j];
  }
}

namespace {

/// Eight elements of dropout_factors at a time with AVX2: Philox's 32 x 32 -> 64-bit products
/// of the even and the odd lanes (vpmuludq), merged back into their high and low words. GCC's
/// vectorisation of the scalar loop ran 6.0 ns per element, this 2.8 (AMD EPYC); Philox's ten
/// rounds are throughput-bound (about 20 instructions per round for eight elements).
#if defined(__x86_64__)
__attribute__((target("avx2"))) void dropout_factors_avx2(std::uint32_t seed, std::uint32_t threshold, float keep, std::uint32_t index,
                                                          float* z, std::int64_t n) {
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(ir::kPhiloxM0)), m1 = _mm256_set1_epi32(static_cast<int>(ir::kPhiloxM1));
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i sign = _mm256_set1_epi32(static_cast<int>(0x80000000u));  // unsigned order through signed compares
  const __m256i below = _mm256_xor_si256(_mm256_set1_epi32(static_cast<int>(threshold)), sign);
  const __m256 kept = _mm256_set1_ps(keep);
  for (std::int64_t j = 0; j < n; j += 8) {
    __m256i c0 = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(index + static_cast<std::uint32_t>(j))), lane);
    __m256i c1 = _mm256_setzero_si256(), c2 = _mm256_setzero_si256(), c3 = _mm256_setzero_si256();
    std::uint32_t k0 = seed, k1 = ir::kDropoutKey1;
    for (int round = 0; round < 10; ++round) {  // as ir::philox4x32_10
      const __m256i even0 = _mm256_mul_epu32(c0, m0), odd0 = _mm256_mul_epu32(_mm256_srli_epi64(c0, 32), m0);
      const __m256i even1 = _mm256_mul_epu32(c2, m1), odd1 = _mm256_mul_epu32(_mm256_srli_epi64(c2, 32), m1);
      const __m256i lo0 = _mm256_blend_epi32(even0, _mm256_slli_epi64(odd0, 32), 0xAA);
      const __m256i hi0 = _mm256_blend_epi32(_mm256_srli_epi64(even0, 32), odd0, 0xAA);
      const __m256i lo1 = _mm256_blend_epi32(even1, _mm256_slli_epi64(odd1, 32), 0xAA);
      const __m256i hi1 = _mm256_blend_epi32(_mm256_srli_epi64(even1, 32), odd1, 0xAA);
      c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32(static_cast<int>(k0)));
      c1 = lo1;
      c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32(static_cast<int>(k1)));
      c3 = lo0;
      k0 += ir::kPhiloxW0;
      k1 += ir::kPhiloxW1;
    }
    const __m256i dropped = _mm256_cmpgt_epi32(below, _mm256_xor_si256(c0, sign));  // threshold > word
    const __m256 r = _mm256_andnot_ps(_mm256_castsi256_ps(dropped), kept);
    if (j + 8 <= n) {
      _mm256_storeu_ps(z + j, r);
    } else {
      float tail[8];
      _mm256_storeu_ps(tail, r);
      std::memcpy(z + j, tail, static_cast<std::size_t>(n - j) * sizeof(float));
    }
  }
}
#endif

}  // namespace

void dropout_factors(std::uint32_t seed, std::uint32_t threshold, float keep, std::uint32_t index, float* z, std::int64_t n) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return dropout_factors_avx2(seed, threshold, keep, index, z, n);
#endif
  for (std::int64_t j = 0; j < n; ++j) z[j] = ir::dropout_keeps(seed, index + static_cast<std::uint32_t>(j), threshold) ? keep : 0.0f;
}

}  // namespace qkv::backend::cpu
