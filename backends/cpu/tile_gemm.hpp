// The fused attention kernels' matrix products, written for their shapes.
#pragma once

#include <cstdint>

namespace qkv::backend::cpu {

/// c[i * ldc + j] = alpha * sum_p A(i, p) * b[p * ldb + j], plus c[i * ldc + j] itself when
/// `accumulate`, for i < m and j < n, where A(i, p) = a[i * lda + p], or a[p * lda + i] when
/// `a_transposed`. The sum over p runs in order, one fused multiply-add per term.
///
/// Attention multiplies small blocks (K = the head dim, or a key tile) many times over, and
/// OpenBLAS packs both operands on every call: at K = 64 that was a tenth of a fused forward.
/// Here nothing is packed: a register tile of MR rows by two vectors keeps its sums while A's
/// elements are broadcast from where they lie and B is read in rows (a caller that needs Bᵀ
/// transposes it once, see transpose_into). On AVX-512 CPUs; columns past the last whole
/// vector, and CPUs without AVX-512, go to OpenBLAS (see tile_gemm.cpp for why AVX2 does).
void tile_gemm(bool a_transposed, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a, std::int64_t lda, const float* b,
               std::int64_t ldb, bool accumulate, float* c, std::int64_t ldc);

/// y[j * ldy + i] = x[i * ldx + j] for i < rows, j < cols, and y[j * ldy + i] = 0 for
/// rows <= i < padded_rows: x's block transposed, its rows padded with zeros to padded_rows.
void transpose_into(const float* x, std::int64_t rows, std::int64_t cols, std::int64_t ldx, float* y, std::int64_t ldy, std::int64_t padded_rows);

/// The multiple of columns tile_gemm computes in its register tiles on this CPU (two vectors of
/// 16 on AVX-512, else 1): a product whose n is rounded up to it runs without OpenBLAS.
std::int64_t tile_gemm_columns();

}  // namespace qkv::backend::cpu
