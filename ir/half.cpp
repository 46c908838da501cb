// Bulk f16 and bf16 conversions: F16C and AVX2 where the CPU has them, portable loops otherwise.
#include "ir/half.hpp"

#include "ir/host_isa.hpp"

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#define QKV_HAVE_F16C_PATH 1
#endif

namespace qkv {

namespace {

/// bf16's bits of an f32: round to nearest even on the low 16 bits; a NaN stays a (quiet) NaN.
inline std::uint16_t bf16_bits(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

#ifdef QKV_HAVE_F16C_PATH
/// F16C and AVX2 (both in x86-64-v3): where the process's ISA choice (ir/host_isa.hpp, with its
/// QKV_CPU_ISA cap) allows them.
bool has_x86_64_v3() { return host_isa() >= Isa::avx2; }

__attribute__((target("avx,f16c"))) std::int64_t to_half_f16c(const float* in, Half* out, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  return i;
}

__attribute__((target("avx,f16c"))) std::int64_t to_float_f16c(const Half* in, float* out, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  return i;
}

__attribute__((target("avx,f16c"))) std::int64_t round_f16_f16c(const float* in, float* out, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
  return i;
}

/// Eight f32 lanes rounded to bf16 (nearest even), each bf16 in its lane's high half, the low
/// half zero: bf16_bits of each lane, shifted back.
__attribute__((target("avx2"))) inline __m256i bf16_lanes(__m256i u) {
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
  return _mm256_and_si256(_mm256_blendv_epi8(rounded, quiet, nan), _mm256_set1_epi32(static_cast<int>(0xffff0000u)));
}

__attribute__((target("avx2"))) std::int64_t round_bf16_avx2(const float* in, float* out, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), bf16_lanes(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i))));
  return i;
}

__attribute__((target("avx2"))) std::int64_t to_bfloat16_avx2(const float* in, BFloat16* out, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a = _mm256_srli_epi32(bf16_lanes(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i))), 16);
    const __m256i b = _mm256_srli_epi32(bf16_lanes(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i + 8))), 16);
    // packus interleaves 128-bit halves (a0 b0 a1 b1): the permute puts them back in order.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), packed);
  }
  return i;
}

__attribute__((target("avx2"))) std::int64_t bf16_to_float_avx2(const BFloat16* in, float* out, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_slli_epi32(wide, 16));
  }
  return i;
}
#endif

}  // namespace

void to_half(const float* in, Half* out, std::int64_t n) {
  std::int64_t i = 0;
#ifdef QKV_HAVE_F16C_PATH
  if (has_x86_64_v3()) i = to_half_f16c(in, out, n);
#endif
  for (; i < n; ++i) out[i] = to_half(static_cast<double>(in[i]));
}

void to_float(const Half* in, float* out, std::int64_t n) {
  std::int64_t i = 0;
#ifdef QKV_HAVE_F16C_PATH
  if (has_x86_64_v3()) i = to_float_f16c(in, out, n);
#endif
  for (; i < n; ++i) out[i] = to_float(in[i]);
}

void to_bfloat16(const float* in, BFloat16* out, std::int64_t n) {
  std::int64_t i = 0;
#ifdef QKV_HAVE_F16C_PATH
  if (has_x86_64_v3()) i = to_bfloat16_avx2(in, out, n);
#endif
  for (; i < n; ++i) out[i].bits = bf16_bits(in[i]);
}

void to_float(const BFloat16* in, float* out, std::int64_t n) {
  std::int64_t i = 0;
#ifdef QKV_HAVE_F16C_PATH
  if (has_x86_64_v3()) i = bf16_to_float_avx2(in, out, n);
#endif
  for (; i < n; ++i) out[i] = std::bit_cast<float>(static_cast<std::uint32_t>(in[i].bits) << 16);
}

void round_through(DType t, const float* in, float* out, std::int64_t n) {
  std::int64_t i = 0;
  if (t == DType::bf16) {
#ifdef QKV_HAVE_F16C_PATH
    if (has_x86_64_v3()) i = round_bf16_avx2(in, out, n);
#endif
    for (; i < n; ++i) out[i] = std::bit_cast<float>(static_cast<std::uint32_t>(bf16_bits(in[i])) << 16);
    return;
  }
#ifdef QKV_HAVE_F16C_PATH
  if (has_x86_64_v3()) i = round_f16_f16c(in, out, n);
#endif
  for (; i < n; ++i) out[i] = static_cast<float>(round_to(DType::f16, static_cast<double>(in[i])));
}

}  // namespace qkv
