// Products of a few rows with a matrix read once: a decode step's projections, [1, K] x [K, N].
// They are bound by reading the matrix, so the kernel streams it in long contiguous runs over the
// thread pool, converts f16 and bf16 elements as it reads them (half the bytes of f32), and never
// packs or copies it (what sgemm and sgemv do first).
#pragma once

#include <cstdint>

#include "ir/dtype.hpp"

namespace qkv::backend::cpu {

/// Rows of the left operand up to which few_rows_product is the cpu's matmul kernel.
inline constexpr std::int64_t kFewRows = 4;

/// out[r, c] = sum_j x[r, j] * B[j, c] for r < rows, c < n, j < k, where B is `b` [k, n]
/// row-major, or [n, k] when `transposed` (B's transpose stored: nn.Linear's weight, a tied
/// head's embedding), in f32, f16 or bf16 (`stored`). x is [rows, k] f32 and out [rows, n].
/// Runs over the thread pool; the order of the sums depends only on the shapes, not on the
/// number of threads.
void few_rows_product(const float* x, std::int64_t rows, std::int64_t k, std::int64_t n, const void* b, DType stored, bool transposed, float* out);

}  // namespace qkv::backend::cpu
