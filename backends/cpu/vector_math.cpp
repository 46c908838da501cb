// Vector math with GCC vector extensions, written once over the vector type (8 or 16 float
// lanes) and compiled for AVX-512, AVX2 + FMA and the baseline ISA (backends/cpu/isa.hpp).
#include "backends/cpu/vector_math.hpp"

#include "backends/cpu/isa.hpp"
#include "backends/cpu/vectors.hpp"
#include "ir/random.hpp"

#include <cstring>
#include <limits>
#include <string_view>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace qkv::backend::cpu {

namespace {

using simd::Lanes;
using simd::load;
using simd::splat;
using simd::store;
using simd::v16f;
using simd::v16i;
using simd::v2f;
using simd::v4d;
using simd::v4f;
using simd::v8d;
using simd::v8f;
using simd::v8i;

/// exp(x) = 2^k exp(r), k = round(x / ln 2), r = x - k ln 2 in [-ln2/2, ln2/2], exp(r) by the
/// Cephes polynomial (about 2 ulp). Below -87.3 (and -inf) gives exactly 0, above 88.72 (where
/// float overflows) +inf; NaN stays NaN (the clamps below may compile to min/max instructions
/// that drop a NaN, so it is restored last).
template <class V> [[gnu::always_inline]] inline V exp_v(const V& in) {
  using I = typename Lanes<V>::I;
  V x = in;
  const I underflow = x < -87.3f;
  const I overflow = x > 88.72283f;
  x = x < -87.3f ? splat<V>(-87.3f) : x;
  x = x > 88.72283f ? splat<V>(88.72283f) : x;
  const V round = splat<V>(12582912.0f);  // 1.5 * 2^23: adding and subtracting rounds to an integer
  V k = (x * 1.44269504088896341f + round) - round;
  V r = x - k * 0.693359375f - k * -2.12194440e-4f;
  V p = splat<V>(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^k as 2^h 2^(k-h), h = k/2: each factor a normal float for every k in [-126, 128] (2^128
  // alone is not, and exp(x) for x up to 88.72 needs it).
  const I ki = __builtin_convertvector(k, I), h = ki >> 1;
  V e = p * __builtin_bit_cast(V, (h + 127) << 23) * __builtin_bit_cast(V, (ki - h + 127) << 23);
  const I nan = in != in;
  return nan ? in : underflow ? splat<V>(0.0f) : overflow ? splat<V>(std::numeric_limits<float>::infinity()) : e;
}

/// Whether any lane of a comparison's mask is set.
template <class I> [[gnu::always_inline]] inline bool any_lane(const I& m) {
  std::uint64_t words[sizeof(I) / 8];
  std::memcpy(words, &m, sizeof m);
  std::uint64_t any = 0;
  for (std::uint64_t w : words) any |= w;
  return any != 0;
}

/// tanh(x): below |x| = 0.25 its odd Taylor series to x^11 (the next term is 2e-10 relative);
/// up to 0.55, (1 - e) / (1 + e) with e = exp(-2|x|); beyond, 1 - 2e / (1 + e), whose small
/// correction carries exp's error at a fraction of an ulp of the result. Never overflows (e <= 1);
/// the sign restored last; NaN stays NaN. The same algorithm as the GLSL qkv_tanh. When every
/// lane is below 0.25 (soft-capping's usual case: scores well inside the cap), the series alone
/// (a NaN lane stays NaN through it): soft-capping ran 0.55 ns per score with the exp computed
/// for every vector.
template <class V> [[gnu::always_inline]] inline V tanh_v(const V& x) {
  using I = typename Lanes<V>::I;
  const I negative = x < 0.0f;
  const V a = negative ? -x : x;
  const V x2 = x * x;
  V p = 0.021869488536155203f + x2 * -0.0088632355299021973f;
  p = 0.13333333333333333f + x2 * (-0.053968253968253971f + x2 * p);
  const V small = x + x * x2 * (-0.33333333333333333f + x2 * p);
  if (!any_lane(a >= 0.25f)) return small;
  const V e = exp_v(-2.0f * a);
  const V r = 1.0f / (1.0f + e);  // one division for both forms
  const V mid = (1.0f - e) * r, large = 1.0f - 2.0f * e * r;
  const V magnitude = a < 0.55f ? mid : large;
  const I nan = x != x;
  return nan ? x : a < 0.25f ? small : negative ? -magnitude : magnitude;
}

/// erf(x): below |x| = 1 its odd Taylor series x * P(x^2) to x^25, beyond
/// Abramowitz and Stegun's 7.1.26, 1 - t Q(t) exp(-x^2) with t = 1 / (1 + 0.3275911 |x|) (an
/// absolute error of 1.5e-7, under 1.8e-7 relative where erf >= 0.84), the sign restored. The
/// same algorithm and coefficients as the GLSL qkv_erf; NaN stays NaN.
template <class V> [[gnu::always_inline]] inline V erf_v(const V& x) {
  using I = typename Lanes<V>::I;
  const V x2 = x * x;
  V p = splat<V>(9.422759065e-11f);
  p = p * x2 + -1.229055530e-09f;
  p = p * x2 + 1.480719282e-08f;
  p = p * x2 + -1.636584469e-07f;
  p = p * x2 + 1.646211437e-06f;
  p = p * x2 + -1.492565036e-05f;
  p = p * x2 + 1.205533298e-04f;
  p = p * x2 + -8.548327023e-04f;
  p = p * x2 + 5.223977625e-03f;
  p = p * x2 + -2.686617065e-02f;
  p = p * x2 + 1.128379167e-01f;
  p = p * x2 + -3.761263890e-01f;
  p = p * x2 + 1.128379167e+00f;
  const V small = x * p;
  const I negative = x < 0.0f;
  const V a = negative ? -x : x;
  if (!any_lane(a >= 1.0f)) return small;
  const V t = 1.0f / (1.0f + 0.3275911f * a);
  const V q = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
  const V magnitude = 1.0f - q * exp_v(-x2);
  const I nan = x != x;
  return nan ? x : a < 1.0f ? small : negative ? -magnitude : magnitude;
}

/// Per-lane sums of a row of floats, in double: each lane adds four vectors' values in float
/// (at most three roundings of a few ulp of the lane's partial sum), then the partial sum joins
/// the lane's double accumulator. Converting every vector to double (two conversions and two
/// adds per 16 lanes) made the sum cost more than the exp before it: 0.64 against 0.29 ns per
/// element at 16 lanes on this EPYC; a float sum over the whole row (256 keys) lost the small
/// weights next to a dominant one.
template <class V> struct WideSum;
template <> struct WideSum<v8f> {
  using D = v4d;
  static D low(const v8f& e) { return __builtin_convertvector(__builtin_shufflevector(e, e, 0, 1, 2, 3), v4d); }
  static D high(const v8f& e) { return __builtin_convertvector(__builtin_shufflevector(e, e, 4, 5, 6, 7), v4d); }
  static double total(const D& d) { return (d[0] + d[1]) + (d[2] + d[3]); }
};
template <> struct WideSum<v16f> {
  using D = v8d;
  static D low(const v16f& e) { return __builtin_convertvector(__builtin_shufflevector(e, e, 0, 1, 2, 3, 4, 5, 6, 7), v8d); }
  static D high(const v16f& e) { return __builtin_convertvector(__builtin_shufflevector(e, e, 8, 9, 10, 11, 12, 13, 14, 15), v8d); }
  static double total(const D& d) { return ((d[0] + d[1]) + (d[2] + d[3])) + ((d[4] + d[5]) + (d[6] + d[7])); }
};
template <class V> struct RowSum {
  typename WideSum<V>::D lo{}, hi{};
  V part{};
  int terms = 0;
  [[gnu::always_inline]] void add(const V& e) {
    part += e;
    if (++terms == 4) flush();
  }
  [[gnu::always_inline]] void flush() {
    lo += WideSum<V>::low(part);
    hi += WideSum<V>::high(part);
    part = V{};
    terms = 0;
  }
  double total() {
    flush();
    return WideSum<V>::total(lo + hi);
  }
};

/// f(x + i, lanes) over [0, n) a vector at a time, the tail through a padded copy of x (padding
/// `pad`) written back to y: the loop every row kernel below runs.
template <class V, class F> [[gnu::always_inline]] inline void rows_of(const float* x, float* y, std::int64_t n, float pad, F f) {
  constexpr int L = Lanes<V>::n;
  std::int64_t i = 0;
  for (; i + L <= n; i += L) store(y + i, f(load<V>(x + i)));
  if (i < n) {
    float tail[L];
    for (int j = 0; j < L; ++j) tail[j] = i + j < n ? x[i + j] : pad;
    const V r = f(load<V>(tail));
    for (std::int64_t j = 0; i + j < n; ++j) y[i + j] = r[j];
  }
}

template <class V> [[gnu::always_inline]] inline float exp_shifted_sum_impl(float* x, std::int64_t n, float shift) {
  // The sum in double: a row dominated by one weight near 1 would otherwise lose its small terms
  // to rounding at every add (softmax on saturating scores was 5x less accurate than a plain
  // float loop with a correctly rounded exp).
  RowSum<V> sum;
  // The tail's padding is -inf after the shift: exp gives 0, which adds nothing.
  rows_of<V>(
      x, x, n, -std::numeric_limits<float>::infinity(), [&](const V& v) __attribute__((always_inline)) {
        const V e = exp_v(v - shift);
        sum.add(e);
        return e;
      });
  return static_cast<float>(sum.total());
}

template <class V> [[gnu::always_inline]] inline void exp_shifted_impl(float* x, std::int64_t n, float shift) {
  rows_of<V>(
      x, x, n, 0.0f, [&](const V& v) __attribute__((always_inline)) { return exp_v(v - shift); });
}

template <class V> [[gnu::always_inline]] inline void times_difference_impl(float* y, const float* p, std::int64_t n, float c) {
  constexpr int L = Lanes<V>::n;
  std::int64_t i = 0;
  for (; i + L <= n; i += L) store(y + i, load<V>(p + i) * (load<V>(y + i) - c));
  for (; i < n; ++i) y[i] = p[i] * (y[i] - c);
}

/// The largest lane of v (x > m ? x : m over halves, then quarters, ...; NaN lanes are the
/// caller's to flag).
[[gnu::always_inline]] inline float halves_max(const v8f& v) {
  const v4f a = __builtin_shufflevector(v, v, 0, 1, 2, 3), b = __builtin_shufflevector(v, v, 4, 5, 6, 7);
  const v4f c = b > a ? b : a;
  const v2f d = __builtin_shufflevector(c, c, 0, 1), e = __builtin_shufflevector(c, c, 2, 3);
  const v2f f = e > d ? e : d;
  return f[1] > f[0] ? f[1] : f[0];
}
[[gnu::always_inline]] inline float halves_max(const v16f& v) {
  const v8f a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7), b = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  return halves_max(b > a ? b : a);
}

template <class V> [[gnu::always_inline]] inline float max_of_impl(const float* x, std::int64_t n, float init) {
  using I = typename Lanes<V>::I;
  constexpr int L = Lanes<V>::n;
  V acc = splat<V>(init);
  I nan = {};
  std::int64_t i = 0;
  for (; i + L <= n; i += L) {
    V v = load<V>(x + i);
    nan |= v != v;
    acc = v > acc ? v : acc;
  }
  // The lanes' maximum as a tree of halves (acc holds init already): a short tile's rows were
  // waiting on sixteen dependent scalar compares.
  float m = halves_max(acc);
  bool any_nan = init != init || any_lane(nan);
  for (; i < n; ++i) {
    any_nan |= x[i] != x[i];
    m = x[i] > m ? x[i] : m;
  }
  return any_nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

template <class V> [[gnu::always_inline]] inline bool all_finite_impl(const float* x, std::int64_t n) {
  // x * 0 is 0 for a finite x and NaN for NaN or an infinity; NaN sticks in the sums.
  V acc{};
  constexpr int L = Lanes<V>::n;
  std::int64_t i = 0;
  for (; i + L <= n; i += L) acc += load<V>(x + i) * 0.0f;
  float tail = 0.0f;
  for (; i < n; ++i) tail += x[i] * 0.0f;
  for (int j = 0; j < L; ++j) tail += acc[j];
  return tail == 0.0f;
}

template <class V> [[gnu::always_inline]] inline void divide_inplace_impl(float* y, std::int64_t n, float d) {
  rows_of<V>(
      y, y, n, 1.0f, [&](const V& v) __attribute__((always_inline)) { return v / d; });
}

template <class V> [[gnu::always_inline]] inline void scale_inplace_impl(float* y, std::int64_t n, float s) {
  rows_of<V>(
      y, y, n, 0.0f, [&](const V& v) __attribute__((always_inline)) { return v * s; });
}

template <class V> [[gnu::always_inline]] inline void tanh_of_impl(const float* x, float* y, std::int64_t n) {
  rows_of<V>(
      x, y, n, 0.0f, [](const V& v) __attribute__((always_inline)) { return tanh_v(v); });
}

template <class V> [[gnu::always_inline]] inline void erf_of_impl(const float* x, float* y, std::int64_t n) {
  rows_of<V>(
      x, y, n, 0.0f, [](const V& v) __attribute__((always_inline)) { return erf_v(v); });
}

template <class V> [[gnu::always_inline]] inline void exp_of_impl(const float* x, float* y, std::int64_t n) {
  rows_of<V>(
      x, y, n, 0.0f, [](const V& v) __attribute__((always_inline)) { return exp_v(v); });
}

template <class V> [[gnu::always_inline]] inline float sum_of_impl(const float* x, std::int64_t n) {
  constexpr int L = Lanes<V>::n;
  RowSum<V> sum;
  std::int64_t i = 0;
  for (; i + L <= n; i += L) sum.add(load<V>(x + i));
  double total = sum.total();
  for (; i < n; ++i) total += x[i];
  return static_cast<float>(total);
}

template <class V> [[gnu::always_inline]] inline void softcap_row_impl(float* s, float* dmod, std::int64_t n, float cap) {
  constexpr int L = Lanes<V>::n;
  const float inverse = 1.0f / cap;  // a product, not a division per score (within an ulp of s / cap)
  std::int64_t i = 0;
  for (; i + L <= n; i += L) {
    const V t = tanh_v(load<V>(s + i) * inverse);
    store(s + i, t * cap);
    if (dmod) store(dmod + i, 1.0f - t * t);
  }
  if (i < n) {  // the tail through one padded vector
    float tail[L] = {};
    for (std::int64_t j = 0; i + j < n; ++j) tail[j] = s[i + j];
    const V t = tanh_v(load<V>(tail) * inverse);
    for (std::int64_t j = 0; i + j < n; ++j) {
      s[i + j] = t[j] * cap;
      if (dmod) dmod[i + j] = 1.0f - t[j] * t[j];
    }
  }
}

template <class V>
[[gnu::always_inline]] inline void online_softmax_rows_impl(float* s, std::int64_t ld, std::int64_t rows, std::int64_t n, const float* top,
                                                            float* max, float* sums) {
  // The maxima first, then the rows' exps and sums in one loop with nothing between them: each
  // row's chain is independent of the next, so the core overlaps them.
  for (std::int64_t r = 0; r < rows; ++r) max[r] = max_of_impl<V>(s + r * ld, n, top[r]);
  for (std::int64_t r = 0; r < rows; ++r) {
    float* row = s + r * ld;
    if (max[r] == -std::numeric_limits<float>::infinity()) {  // every key so far masked
      std::fill_n(row, n, 0.0f);
      sums[r] = 0.0f;
    } else {
      sums[r] = exp_shifted_sum_impl<V>(row, n, max[r]);
    }
  }
}

template <class V> [[gnu::always_inline]] inline float times_and_sum_impl(float* y, const float* x, std::int64_t n) {
  // Sixteen lanes on every ISA (one vector of them, or two): the same bits under any cap. The
  // product is stored as well as added, so it is rounded before the add, never fused into it.
  constexpr int L = Lanes<V>::n, kVectors = kProductLanes / L;
  V acc[kVectors] = {};
  std::int64_t j = 0;
  for (; j + kProductLanes <= n; j += kProductLanes)
    for (int u = 0; u < kVectors; ++u) {
      const V p = load<V>(y + j + u * L) * load<V>(x + j + u * L);
      store(y + j + u * L, p);
      acc[u] += p;
    }
  float lanes[kProductLanes];
  for (int u = 0; u < kVectors; ++u) store(lanes + u * L, acc[u]);
  for (std::int64_t u = 0; j + u < n; ++u) {
    y[j + u] *= x[j + u];
    lanes[u] += y[j + u];
  }
  float sum = 0.0f;
  for (const float v : lanes) sum += v;
  return sum;
}

template <class V>
[[gnu::always_inline]] inline void online_softmax_tangent_rows_impl(float* s, float* t, const float* dmod, std::int64_t ld, std::int64_t rows,
                                                                    std::int64_t n, const float* top, float* max, float* sums, float* products) {
  constexpr int L = Lanes<V>::n;
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  for (std::int64_t r = 0; r < rows; ++r) {  // the chain rule through the modifier; a masked score has no tangent
    const float* row = s + r * ld;
    const float* d = dmod ? dmod + r * ld : nullptr;
    float* trow = t + r * ld;
    std::int64_t j = 0;
    for (; j + L <= n; j += L) {
      V x = load<V>(trow + j);
      if (d) x *= load<V>(d + j);
      store(trow + j, load<V>(row + j) == kMasked ? V{} : x);
    }
    for (; j < n; ++j) trow[j] = row[j] == kMasked ? 0.0f : d ? trow[j] * d[j] : trow[j];
  }
  online_softmax_rows_impl<V>(s, ld, rows, n, top, max, sums);
  for (std::int64_t r = 0; r < rows; ++r) products[r] = max[r] == kMasked ? 0.0f : times_and_sum_impl<V>(t + r * ld, s + r * ld, n);
}

}  // namespace

QKV_ISA_DISPATCH(void, softcap_row, (float* s, float* dmod, std::int64_t n, float cap), (s, dmod, n, cap), v16f, v8f)
QKV_ISA_DISPATCH(float, exp_shifted_sum, (float* x, std::int64_t n, float shift), (x, n, shift), v16f, v8f)
QKV_ISA_DISPATCH(void, online_softmax_rows, (float* s, std::int64_t ld, std::int64_t rows, std::int64_t n, const float* top, float* max, float* sums),
                 (s, ld, rows, n, top, max, sums), v16f, v8f)
QKV_ISA_DISPATCH(void, online_softmax_tangent_rows,
                 (float* s, float* t, const float* dmod, std::int64_t ld, std::int64_t rows, std::int64_t n, const float* top, float* max,
                  float* sums, float* products),
                 (s, t, dmod, ld, rows, n, top, max, sums, products), v16f, v8f)
QKV_ISA_DISPATCH(void, exp_shifted, (float* x, std::int64_t n, float shift), (x, n, shift), v16f, v8f)
QKV_ISA_DISPATCH(void, times_difference, (float* y, const float* p, std::int64_t n, float c), (y, p, n, c), v16f, v8f)
QKV_ISA_DISPATCH(float, max_of, (const float* x, std::int64_t n, float init), (x, n, init), v16f, v8f)
QKV_ISA_DISPATCH(bool, all_finite, (const float* x, std::int64_t n), (x, n), v16f, v8f)
QKV_ISA_DISPATCH(void, divide_inplace, (float* y, std::int64_t n, float d), (y, n, d), v16f, v8f)
QKV_ISA_DISPATCH(void, scale_inplace, (float* y, std::int64_t n, float s), (y, n, s), v16f, v8f)
QKV_ISA_DISPATCH(void, tanh_of, (const float* x, float* y, std::int64_t n), (x, y, n), v16f, v8f)
QKV_ISA_DISPATCH(void, erf_of, (const float* x, float* y, std::int64_t n), (x, y, n), v16f, v8f)
QKV_ISA_DISPATCH(void, exp_of, (const float* x, float* y, std::int64_t n), (x, y, n), v16f, v8f)
QKV_ISA_DISPATCH(float, sum_of, (const float* x, std::int64_t n), (x, n), v16f, v8f)

namespace {

/// Eight elements of dropout_factors at a time with AVX2: Philox's 32 x 32 -> 64-bit products
/// of the even and the odd lanes (vpmuludq), merged back into their high and low words. GCC's
/// vectorisation of the scalar loop ran 6.0 ns per element, this 2.8 (AMD EPYC); Philox's ten
/// rounds are throughput-bound (about 20 instructions per round for eight elements).
#if defined(__x86_64__)
QKV_TARGET_AVX2 void dropout_factors_avx2(std::uint32_t seed, std::uint32_t threshold, float keep, std::uint32_t index, float* z, std::int64_t n) {
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

/// Sixteen at a time with AVX-512: the same rounds, the high and low words merged by masked
/// blends, the tail stored under a mask. (GCC 12's AVX-512 intrinsics start from
/// _mm512_undefined_epi32, which its -Wmaybe-uninitialized misreads: GCC bug 105593.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
QKV_TARGET_AVX512 void dropout_factors_avx512(std::uint32_t seed, std::uint32_t threshold, float keep, std::uint32_t index, float* z,
                                              std::int64_t n) {
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(ir::kPhiloxM0)), m1 = _mm512_set1_epi32(static_cast<int>(ir::kPhiloxM1));
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i below = _mm512_set1_epi32(static_cast<int>(threshold));
  const __m512 kept = _mm512_set1_ps(keep);
  constexpr __mmask16 odd = 0xAAAA;
  for (std::int64_t j = 0; j < n; j += 16) {
    __m512i c0 = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(index + static_cast<std::uint32_t>(j))), lane);
    __m512i c1 = _mm512_setzero_si512(), c2 = _mm512_setzero_si512(), c3 = _mm512_setzero_si512();
    std::uint32_t k0 = seed, k1 = ir::kDropoutKey1;
    for (int round = 0; round < 10; ++round) {  // as ir::philox4x32_10
      const __m512i even0 = _mm512_mul_epu32(c0, m0), odd0 = _mm512_mul_epu32(_mm512_srli_epi64(c0, 32), m0);
      const __m512i even1 = _mm512_mul_epu32(c2, m1), odd1 = _mm512_mul_epu32(_mm512_srli_epi64(c2, 32), m1);
      const __m512i lo0 = _mm512_mask_blend_epi32(odd, even0, _mm512_slli_epi64(odd0, 32));
      const __m512i hi0 = _mm512_mask_blend_epi32(odd, _mm512_srli_epi64(even0, 32), odd0);
      const __m512i lo1 = _mm512_mask_blend_epi32(odd, even1, _mm512_slli_epi64(odd1, 32));
      const __m512i hi1 = _mm512_mask_blend_epi32(odd, _mm512_srli_epi64(even1, 32), odd1);
      c0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), _mm512_set1_epi32(static_cast<int>(k0)));
      c1 = lo1;
      c2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3), _mm512_set1_epi32(static_cast<int>(k1)));
      c3 = lo0;
      k0 += ir::kPhiloxW0;
      k1 += ir::kPhiloxW1;
    }
    const __mmask16 dropped = _mm512_cmplt_epu32_mask(c0, below);  // word < threshold
    const __m512 r = _mm512_mask_blend_ps(dropped, kept, _mm512_setzero_ps());
    const __mmask16 store = j + 16 <= n ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - j)) - 1);
    _mm512_mask_storeu_ps(z + j, store, r);
  }
}
#pragma GCC diagnostic pop
#endif

}  // namespace

void dropout_factors(std::uint32_t seed, std::uint32_t threshold, float keep, std::uint32_t index, float* z, std::int64_t n) {
#if defined(__x86_64__)
  switch (host_isa()) {
    case Isa::avx512: return dropout_factors_avx512(seed, threshold, keep, index, z, n);
    case Isa::avx2: return dropout_factors_avx2(seed, threshold, keep, index, z, n);
    case Isa::baseline: break;
  }
#endif
  for (std::int64_t j = 0; j < n; ++j) z[j] = ir::dropout_keeps(seed, index + static_cast<std::uint32_t>(j), threshold) ? keep : 0.0f;
}

}  // namespace qkv::backend::cpu
