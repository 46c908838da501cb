// The cpu backend's general matrix products: both operands packed into panels, a register tile
// per instruction set (BLIS's loop structure), the work split over the backend's thread pool.
#pragma once

#include <cstdint>
#include <span>

#include "ir/dtype.hpp"

namespace qkv::backend::cpu {

/// C[m x n] = A[m x k] B[k x n] for every entry of a batch, all of this shape. A(i, p) is
/// a[i * lda + p], or a[p * lda + i] when `a_transposed`; B(p, j) is b[p * ldb + j], or
/// b[j * ldb + p] when `b_transposed`, its elements f32, f16 or bf16 (`b_dtype`: a half
/// checkpoint's weights, widened as they are packed, never whole). C is row-major with ldc.
struct GemmShape {
  std::int64_t m = 0, n = 0, k = 0;
  bool a_transposed = false, b_transposed = false;
  std::int64_t lda = 0, ldb = 0, ldc = 0;
  DType b_dtype = DType::f32;
};

/// One batch entry's operands: `b` points at B's first element in b_dtype.
struct GemmOperands {
  const float* a;
  const void* b;
  float* c;
};

/// Whether this CPU runs qkv's own GEMM (AVX2 with FMA, or AVX-512; QKV_CPU_ISA caps it). On the
/// baseline ISA gemm() hands each product to OpenBLAS.
bool own_gemm_available();

/// The kernel family gemm() runs on this CPU, e.g. "packed AVX-512 12x32 register tile".
const char* gemm_kernel_name();

/// Computes every entry's product, spread over ThreadPool::global() (an entry's rows and columns
/// split into blocks when the batch alone leaves threads idle). With qkv's kernels each element of
/// C is summed by one thread in a fixed order whatever the split (each block of 256 terms in
/// registers, p ascending, one fused multiply-add per term, then added to C): the result is the
/// same with 1 thread or 16. (OpenBLAS's order, on the baseline ISA, follows each block's shape.)
void gemm(const GemmShape& s, std::span<const GemmOperands> entries);

}  // namespace qkv::backend::cpu
