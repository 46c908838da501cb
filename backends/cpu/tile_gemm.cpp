// Register-tiled products for the fused attention kernels, compiled per ISA (backends/cpu/isa.hpp).
#include "backends/cpu/tile_gemm.hpp"

#include <cblas.h>

#include <algorithm>

#include "backends/cpu/isa.hpp"
#include "backends/cpu/vectors.hpp"

namespace qkv::backend::cpu {

namespace {

using simd::load;
using simd::store;
using simd::v16f;
using simd::v8f;
using simd::v8i;

/// A register tile: `rows` rows of A by two vectors V of columns. AVX-512 holds 8 x 2 sums in
/// its 32 registers with room for B's two vectors and the broadcasts (measured on an AMD EPYC
/// (Zen 4) at the attention shapes: 8 rows ran 3% faster than 12, and both 10-15% faster than
/// OpenBLAS's sgemm on one core).
///
/// AVX2 has 16 registers, and GCC did not fit 6 x 2 sums, two vectors of B and a broadcast in
/// them: it kept one of B's vectors on the stack, and fewer rows left too few sums in flight to
/// cover the FMA's latency (the AVX2 forward ran at 42-66% of sgemm against 75% with OpenBLAS's
/// hand-written kernel), so AVX2 and the baseline ISA keep OpenBLAS.
template <class V, int R> struct Tile {
  using Vec = V;
  static constexpr int rows = R;
  static constexpr int lanes = static_cast<int>(sizeof(V) / sizeof(float));
};
using Wide = Tile<v16f, 8>;
/// Eight columns left after AVX-512's wide strips (a head dim of 8, 24, 40, ...): one 8-lane
/// vector per row, 8 rows, rather than a call into OpenBLAS for a product of a few hundred FLOPs.
using Narrow = Tile<v8f, 8>;

/// C[R x NV vectors] = alpha * A[R x k] B[k x NV vectors] (+ C): the sums stay in registers for
/// the whole depth k.
template <class V, int R, int NV, bool TA>
[[gnu::always_inline]] inline void micro(std::int64_t k, float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb,
                                         bool accumulate, float* c, std::int64_t ldc) {
  constexpr int L = static_cast<int>(sizeof(V) / sizeof(float));
  V sum[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) sum[r][v] = V{};
  for (std::int64_t p = 0; p < k; ++p) {
    V bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = load<V>(b + p * ldb + v * L);
    for (int r = 0; r < R; ++r) {
      const float x = TA ? a[p * lda + r] : a[r * lda + p];
      for (int v = 0; v < NV; ++v) sum[r][v] += x * bv[v];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) {
      float* out = c + r * ldc + v * L;
      V x = sum[r][v] * alpha;
      if (accumulate) x += load<V>(out);
      store(out, x);
    }
}

/// The last `rows` (< R) rows of a column strip, in a register tile of exactly that height.
template <class V, int R, int NV, bool TA>
[[gnu::always_inline]] inline void tail_rows(int rows, std::int64_t k, float alpha, const float* a, std::int64_t lda, const float* b,
                                             std::int64_t ldb, bool accumulate, float* c, std::int64_t ldc) {
  if constexpr (R > 0) {
    if (rows == R) micro<V, R, NV, TA>(k, alpha, a, lda, b, ldb, accumulate, c, ldc);
    else tail_rows<V, R - 1, NV, TA>(rows, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
  }
}

/// One strip of NV vectors of columns, all m rows.
template <class T, int NV, bool TA>
[[gnu::always_inline]] inline void strip(std::int64_t m, std::int64_t k, float alpha, const float* a, std::int64_t lda, const float* b,
                                         std::int64_t ldb, bool accumulate, float* c, std::int64_t ldc) {
  constexpr int R = T::rows;
  const auto row = [&](std::int64_t i) { return TA ? a + i : a + i * lda; };
  std::int64_t i = 0;
  for (; i + R <= m; i += R) micro<typename T::Vec, R, NV, TA>(k, alpha, row(i), lda, b, ldb, accumulate, c + i * ldc, ldc);
  if (i < m) tail_rows<typename T::Vec, R - 1, NV, TA>(static_cast<int>(m - i), k, alpha, row(i), lda, b, ldb, accumulate, c + i * ldc, ldc);
}

/// The columns in whole vectors; returns how many that is.
template <class T, bool TA>
[[gnu::always_inline]] inline std::int64_t columns(std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a, std::int64_t lda,
                                                   const float* b, std::int64_t ldb, bool accumulate, float* c, std::int64_t ldc) {
  constexpr int L = T::lanes;
  std::int64_t j = 0;
  for (; j + 2 * L <= n; j += 2 * L) strip<T, 2, TA>(m, k, alpha, a, lda, b + j, ldb, accumulate, c + j, ldc);
  if (j + L <= n) {
    strip<T, 1, TA>(m, k, alpha, a, lda, b + j, ldb, accumulate, c + j, ldc);
    j += L;
  }
  return j;
}

template <class T>
[[gnu::always_inline]] inline std::int64_t vector_columns_impl(bool a_transposed, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                                                               const float* a, std::int64_t lda, const float* b, std::int64_t ldb, bool accumulate,
                                                               float* c, std::int64_t ldc) {
  return a_transposed ? columns<T, true>(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc)
                      : columns<T, false>(m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
}

#if defined(__x86_64__)
QKV_TARGET_AVX512 std::int64_t vector_columns(bool a_transposed, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
                                              std::int64_t lda, const float* b, std::int64_t ldb, bool accumulate, float* c, std::int64_t ldc) {
  const std::int64_t j = vector_columns_impl<Wide>(a_transposed, m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
  if (n - j < Narrow::lanes) return j;
  return j + vector_columns_impl<Narrow>(a_transposed, m, Narrow::lanes, k, alpha, a, lda, b + j, ldb, accumulate, c + j, ldc);
}
#endif

/// y[j * ldy + i] = x[i * ldx + j] in blocks of 8 x 8 transposed in registers (unpacks, then
/// shuffles of pairs, then of halves: AVX's eight-instruction pattern), the edges one by one.
/// Every ISA's copy works on 8-lane vectors (T is only the dispatch macro's parameter).
template <class T>
[[gnu::always_inline]] inline void transpose_blocks_impl(const float* x, std::int64_t rows, std::int64_t cols, std::int64_t ldx, float* y,
                                                         std::int64_t ldy) {
  using I = v8i;
  const auto mix = [](v8f a, v8f b, I m) { return __builtin_shuffle(a, b, m); };
  const std::int64_t rows8 = rows / 8 * 8, cols8 = cols / 8 * 8;
  for (std::int64_t i = 0; i < rows8; i += 8)
    for (std::int64_t j = 0; j < cols8; j += 8) {
      v8f r[8], t[8], u[8];
      for (int e = 0; e < 8; ++e) r[e] = load<v8f>(x + (i + e) * ldx + j);
      for (int e = 0; e < 8; e += 2) {
        t[e] = mix(r[e], r[e + 1], I{0, 8, 1, 9, 4, 12, 5, 13});
        t[e + 1] = mix(r[e], r[e + 1], I{2, 10, 3, 11, 6, 14, 7, 15});
      }
      for (int e = 0; e < 8; e += 4) {
        u[e] = mix(t[e], t[e + 2], I{0, 1, 8, 9, 4, 5, 12, 13});
        u[e + 1] = mix(t[e], t[e + 2], I{2, 3, 10, 11, 6, 7, 14, 15});
        u[e + 2] = mix(t[e + 1], t[e + 3], I{0, 1, 8, 9, 4, 5, 12, 13});
        u[e + 3] = mix(t[e + 1], t[e + 3], I{2, 3, 10, 11, 6, 7, 14, 15});
      }
      for (int e = 0; e < 4; ++e) {
        store(y + (j + e) * ldy + i, mix(u[e], u[e + 4], I{0, 1, 2, 3, 8, 9, 10, 11}));
        store(y + (j + e + 4) * ldy + i, mix(u[e], u[e + 4], I{4, 5, 6, 7, 12, 13, 14, 15}));
      }
    }
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = i < rows8 ? cols8 : 0; j < cols; ++j) y[j * ldy + i] = x[i * ldx + j];
}

QKV_ISA_DISPATCH(void, transpose_blocks, (const float* x, std::int64_t rows, std::int64_t cols, std::int64_t ldx, float* y, std::int64_t ldy),
                 (x, rows, cols, ldx, y, ldy), Wide, Wide)

int to_int(std::int64_t v) { return static_cast<int>(v); }

}  // namespace

void tile_gemm(bool a_transposed, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a, std::int64_t lda, const float* b,
               std::int64_t ldb, bool accumulate, float* c, std::int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  std::int64_t done = 0;
#if defined(__x86_64__)
  if (host_isa() == Isa::avx512) done = vector_columns(a_transposed, m, n, k, alpha, a, lda, b, ldb, accumulate, c, ldc);
#endif
  if (done < n)
    cblas_sgemm(CblasRowMajor, a_transposed ? CblasTrans : CblasNoTrans, CblasNoTrans, to_int(m), to_int(n - done), to_int(k), alpha, a, to_int(lda),
                b + done, to_int(ldb), accumulate ? 1.0f : 0.0f, c + done, to_int(ldc));
}

void transpose_into(const float* x, std::int64_t rows, std::int64_t cols, std::int64_t ldx, float* y, std::int64_t ldy, std::int64_t padded_rows) {
  transpose_blocks(x, rows, cols, ldx, y, ldy);
  for (std::int64_t j = 0; j < cols; ++j) std::fill(y + j * ldy + rows, y + j * ldy + padded_rows, 0.0f);
}

std::int64_t tile_gemm_columns() { return host_isa() == Isa::avx512 ? 2 * Wide::lanes : 1; }

}  // namespace qkv::backend::cpu
