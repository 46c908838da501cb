// Packed register-tile GEMM, compiled per ISA (backends/cpu/isa.hpp).
//
// Debian's OpenBLAS picks its kernels by the CPU's model number, and a CPU newer than its release
// gets an older family's: on an Intel Xeon of 2023 (Emerald Rapids) 0.3.21 runs its Prescott
// (SSE3) kernels, on AMD Zen 4/5 its Haswell (AVX2) ones. The loops below are BLIS's: for each
// block of kc terms, a kc x nc panel of B is packed in strips of NR columns and an mc x kc block of A
// in strips of MR rows, then an MR x NR tile of C is summed in registers over the kc terms, A's
// elements broadcast and B's strip read as vectors. The strips are contiguous in the order the
// tile reads them, a strip of B (kc x NR) stays in L1 while every strip of A's block passes over
// it, and A's block (mc x kc) stays in L2.
#include "backends/cpu/gemm.hpp"

#include <cblas.h>

#include <algorithm>
#include <memory>
#include <new>
#include <vector>

#include "backends/cpu/isa.hpp"
#include "backends/cpu/kernels.hpp"
#include "backends/cpu/thread_pool.hpp"
#include "backends/cpu/tile_gemm.hpp"
#include "backends/cpu/vectors.hpp"

namespace qkv::backend::cpu {

namespace {

using simd::load;
using simd::store;
using simd::v16f;
using simd::v8f;

/// A kernel family: MR rows by NV vectors of V, and the blocking around it.
///
/// AVX-512: 12 x 2 sums of 16 lanes in 24 of the 32 registers, B's two vectors and a broadcast
/// beside them (BLIS's Skylake-X tile, transposed for row-major C). AVX2: 6 x 2 sums of 8 lanes,
/// 12 of 16 registers, with B's two vectors and one broadcast that is all of them. kc = 256 keeps
/// a strip of B (kc x NR floats, 32 KiB on AVX-512) within a 48 KiB L1; mc = 16 strips of A
/// (192 KiB) within L2; nc bounds a packed panel of B at 4 MiB.
template <class V, int R, int NV, std::int64_t KC> struct Family {
  using Vec = V;
  static constexpr int lanes = static_cast<int>(sizeof(V) / sizeof(float));
  static constexpr int mr = R, nv = NV, nr = nv * lanes;
  static constexpr std::int64_t kc = KC, mc = 16 * R, nc = 4096;
};
using Avx512 = Family<v16f, 12, 2, 256>;
using Avx2 = Family<v8f, 6, 2, 256>;

constexpr std::int64_t round_up(std::int64_t x, std::int64_t to) { return (x + to - 1) / to * to; }

/// A thread's packing buffers, 64-byte aligned, grown to the largest block it has packed.
class Buffers {
 public:
  float* a(std::int64_t n) { return a_.at_least(n); }
  float* b(std::int64_t n) { return b_.at_least(n); }
  std::vector<float> row;  // a strip of a transposed half B widened, or the baseline's widened block

 private:
  struct Aligned {
    struct Free {
      void operator()(float* p) const { ::operator delete[](p, std::align_val_t{64}); }
    };
    std::unique_ptr<float[], Free> data;
    std::int64_t size = 0;
    float* at_least(std::int64_t n) {
      if (n > size) {
        data.reset(static_cast<float*>(::operator new[](static_cast<std::size_t>(n) * sizeof(float), std::align_val_t{64})));
        size = n;
      }
      return data.get();
    }
  };
  Aligned a_, b_;
};
Buffers& buffers() {
  thread_local Buffers b;
  return b;
}

/// A's rows [i0, i0 + rows) and terms [p0, p0 + kc) into strips of F::mr rows: strip s holds, for
/// each term p, the strip's mr elements A(i, p) one after another (rows past the end are zeros).
template <class F>
[[gnu::always_inline]] inline void pack_a(const GemmShape& s, const float* a, std::int64_t i0, std::int64_t rows, std::int64_t p0, std::int64_t kc,
                                          float* to) {
  constexpr int MR = F::mr;
  for (std::int64_t r0 = 0; r0 < rows; r0 += MR, to += MR * kc) {
    const int h = static_cast<int>(std::min<std::int64_t>(MR, rows - r0));
    if (s.a_transposed) {
      for (std::int64_t p = 0; p < kc; ++p) {
        const float* from = a + (p0 + p) * s.lda + i0 + r0;
        float* dst = to + p * MR;
        for (int r = 0; r < h; ++r) dst[r] = from[r];
        for (int r = h; r < MR; ++r) dst[r] = 0.0f;
      }
    } else {
      for (int r = 0; r < h; ++r) {
        const float* from = a + (i0 + r0 + r) * s.lda + p0;
        for (std::int64_t p = 0; p < kc; ++p) to[p * MR + r] = from[p];
      }
      for (int r = h; r < MR; ++r)
        for (std::int64_t p = 0; p < kc; ++p) to[p * MR + r] = 0.0f;
    }
  }
}

/// B's columns [j0, j0 + cols) and terms [p0, p0 + kc) into strips of F::nr columns: strip s
/// holds, for each term p, its nr elements B(p, j) (columns past the end are zeros), widened
/// from f16 or bf16.
template <class F>
[[gnu::always_inline]] inline void pack_b(const GemmShape& s, const void* b, std::int64_t j0, std::int64_t cols, std::int64_t p0, std::int64_t kc,
                                          float* to, std::vector<float>& row) {
  constexpr int NR = F::nr;
  const ConstView whole{static_cast<const float*>(b), {}, b, s.b_dtype};
  const bool f32 = s.b_dtype == DType::f32;
  for (std::int64_t c0 = 0; c0 < cols; c0 += NR, to += NR * kc) {
    const int w = static_cast<int>(std::min<std::int64_t>(NR, cols - c0));
    if (s.b_transposed) {  // B(p, j) = b[j * ldb + p]: the strip's w columns are rows of b, transposed in registers
      const float* from = nullptr;
      std::int64_t ld = s.ldb;
      if (f32) {
        from = static_cast<const float*>(b) + (j0 + c0) * s.ldb + p0;
      } else {  // widened first, the w rows one after another
        if (row.size() < static_cast<std::size_t>(w * kc)) row.resize(static_cast<std::size_t>(w * kc));
        for (int c = 0; c < w; ++c) widen(whole, (j0 + c0 + c) * s.ldb + p0, kc, row.data() + c * kc);
        from = row.data();
        ld = kc;
      }
      transpose_into(from, w, kc, ld, to, NR, NR);
    } else {  // B(p, j) = b[p * ldb + j]: each term's w columns contiguous
      for (std::int64_t p = 0; p < kc; ++p) {
        const std::int64_t first = (p0 + p) * s.ldb + j0 + c0;
        float* dst = to + p * NR;
        if (f32 && w == NR) {  // a whole strip: vectors (a copy_n here was a memcpy call per term)
          const float* from = static_cast<const float*>(b) + first;
          for (int v = 0; v < F::nv; ++v) store(dst + v * F::lanes, load<typename F::Vec>(from + v * F::lanes));
          continue;
        }
        if (f32) std::copy_n(static_cast<const float*>(b) + first, w, dst);
        else widen(whole, first, w, dst);
        std::fill(dst + w, dst + NR, 0.0f);
      }
    }
  }
}

/// The tile: C[rows x cols] (+)= the sum over kc terms of a strip of A times a strip of B, in
/// registers; `add` adds C's values (every block of terms after the first). A partial tile (the
/// last rows or columns) is summed whole (the packed strips are zero-padded) and stored in part.
template <class F>
[[gnu::always_inline]] inline void tile(std::int64_t kc, const float* __restrict ap, const float* __restrict bp, float* c, std::int64_t ldc, bool add,
                                        int rows, int cols) {
  using V = typename F::Vec;
  constexpr int MR = F::mr, NV = F::nv, L = F::lanes;
  V sum[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) sum[r][v] = V{};
  for (int r = 0; r < MR; ++r) __builtin_prefetch(c + r * ldc, 1);
#pragma GCC unroll 4
  for (std::int64_t p = 0; p < kc; ++p, ap += MR, bp += F::nr) {
    V bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = load<V>(bp + v * L);
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) sum[r][v] += ap[r] * bv[v];  // a scalar operand: broadcast
  }
  if (rows == MR && cols == F::nr) {
    for (int r = 0; r < MR; ++r)
      for (int v = 0; v < NV; ++v) {
        float* out = c + r * ldc + v * L;
        store(out, add ? sum[r][v] + load<V>(out) : sum[r][v]);
      }
    return;
  }
  alignas(64) float part[MR][F::nr];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) store(&part[r][v * L], sum[r][v]);
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < cols; ++j) c[r * ldc + j] = add ? c[r * ldc + j] + part[r][j] : part[r][j];
}

/// One task's block of C: rows [i0, i0 + rows) by columns [j0, j0 + cols) of one entry.
struct Block {
  const GemmOperands* entry;
  std::int64_t i0, rows, j0, cols;
};

template <class F> [[gnu::always_inline]] inline void block_impl(const GemmShape& s, const Block& t) {
  Buffers& buf = buffers();
  const GemmOperands& e = *t.entry;
  float* c = e.c + t.i0 * s.ldc + t.j0;
  if (s.k == 0) {
    for (std::int64_t i = 0; i < t.rows; ++i) std::fill_n(c + i * s.ldc, t.cols, 0.0f);
    return;
  }
  for (std::int64_t p0 = 0; p0 < s.k; p0 += F::kc) {
    const std::int64_t kc = std::min(F::kc, s.k - p0);
    for (std::int64_t jc = 0; jc < t.cols; jc += F::nc) {
      const std::int64_t nc = std::min(F::nc, t.cols - jc);
      float* bp = buf.b(round_up(nc, F::nr) * kc);
      pack_b<F>(s, e.b, t.j0 + jc, nc, p0, kc, bp, buf.row);
      for (std::int64_t ic = 0; ic < t.rows; ic += F::mc) {
        const std::int64_t mc = std::min(F::mc, t.rows - ic);
        float* ap = buf.a(round_up(mc, F::mr) * kc);
        pack_a<F>(s, e.a, t.i0 + ic, mc, p0, kc, ap);
        for (std::int64_t jr = 0; jr < nc; jr += F::nr)
          for (std::int64_t ir = 0; ir < mc; ir += F::mr)
            tile<F>(kc, ap + ir * kc, bp + jr * kc, c + (ic + ir) * s.ldc + jc + jr, s.ldc, p0 > 0,
                    static_cast<int>(std::min<std::int64_t>(F::mr, mc - ir)), static_cast<int>(std::min<std::int64_t>(F::nr, nc - jr)));
      }
    }
  }
}

#if defined(__x86_64__)
QKV_TARGET_AVX512 void block_avx512(const GemmShape& s, const Block& t) { block_impl<Avx512>(s, t); }
QKV_TARGET_AVX2 void block_avx2(const GemmShape& s, const Block& t) { block_impl<Avx2>(s, t); }
#endif

int to_int(std::int64_t v) { return static_cast<int>(v); }

/// The baseline ISA's block: OpenBLAS's sgemm on it; a half B widened 256 terms at a time (each
/// part's product added to the last), never whole.
void block_openblas(const GemmShape& s, const Block& t) {
  const GemmOperands& e = *t.entry;
  const auto trans = [](bool t_) { return t_ ? CblasTrans : CblasNoTrans; };
  float* c = e.c + t.i0 * s.ldc + t.j0;
  const float* a = e.a + (s.a_transposed ? t.i0 : t.i0 * s.lda);
  if (s.b_dtype == DType::f32) {
    const float* b = static_cast<const float*>(e.b) + (s.b_transposed ? t.j0 * s.ldb : t.j0);
    cblas_sgemm(CblasRowMajor, trans(s.a_transposed), trans(s.b_transposed), to_int(t.rows), to_int(t.cols), to_int(s.k), 1.0f, a, to_int(s.lda), b,
                to_int(s.ldb), 0.0f, c, to_int(s.ldc));
    return;
  }
  if (s.k == 0) {
    for (std::int64_t i = 0; i < t.rows; ++i) std::fill_n(c + i * s.ldc, t.cols, 0.0f);
    return;
  }
  constexpr std::int64_t kKc = 256;
  std::vector<float>& wide = buffers().row;
  const ConstView whole{nullptr, {}, e.b, s.b_dtype};
  for (std::int64_t p0 = 0; p0 < s.k; p0 += kKc) {
    const std::int64_t kc = std::min(kKc, s.k - p0);
    wide.resize(static_cast<std::size_t>(t.cols * kc));
    std::int64_t ldb = 0;
    if (s.b_transposed) {  // the block's columns: rows of b, kc terms each
      for (std::int64_t j = 0; j < t.cols; ++j) widen(whole, (t.j0 + j) * s.ldb + p0, kc, wide.data() + j * kc);
      ldb = kc;
    } else {
      for (std::int64_t p = 0; p < kc; ++p) widen(whole, (p0 + p) * s.ldb + t.j0, t.cols, wide.data() + p * t.cols);
      ldb = t.cols;
    }
    cblas_sgemm(CblasRowMajor, trans(s.a_transposed), trans(s.b_transposed), to_int(t.rows), to_int(t.cols), to_int(kc), 1.0f,
                a + (s.a_transposed ? p0 * s.lda : p0), to_int(s.lda), wide.data(), to_int(ldb), p0 > 0 ? 1.0f : 0.0f, c, to_int(s.ldc));
  }
}

using BlockFn = void (*)(const GemmShape&, const Block&);

struct Kernel {
  BlockFn run;
  std::int64_t mr, nr, nc;
  const char* name;
};

const Kernel& kernel() {
  static const Kernel chosen = []() -> Kernel {
    switch (host_isa()) {
#if defined(__x86_64__)
      case Isa::avx512: return {&block_avx512, Avx512::mr, Avx512::nr, Avx512::nc, "packed AVX-512 12x32 register tile"};
      case Isa::avx2: return {&block_avx2, Avx2::mr, Avx2::nr, Avx2::nc, "packed AVX2 6x16 register tile"};
#else
      case Isa::avx512:
      case Isa::avx2:
#endif
      case Isa::baseline: break;
    }
    return {&block_openblas, 16, 16, 4096, "OpenBLAS sgemm"};
  }();
  return chosen;
}

}  // namespace

bool own_gemm_available() { return host_isa() != Isa::baseline; }

const char* gemm_kernel_name() { return kernel().name; }

void gemm(const GemmShape& s, std::span<const GemmOperands> entries) {
  if (s.m <= 0 || s.n <= 0 || entries.empty()) return;
  const Kernel& kern = kernel();
  ThreadPool& pool = ThreadPool::global();
  const auto batch = static_cast<std::int64_t>(entries.size());
  const std::int64_t threads = pool.size();
  // Blocks of columns at most one packed panel of B wide, then more blocks until every thread has
  // the same number of them or each has several. Each block packs its rows of A and its columns
  // of B once, so splitting columns packs A once more per block and splitting rows packs B once
  // more: the split is along the dimension whose other operand is the smaller (columns when
  // m <= n), never narrower than four strips of B or shorter than four strips of A.
  std::int64_t row_blocks = 1, column_blocks = (s.n + kern.nc - 1) / kern.nc;
  const bool small = s.m * s.n * s.k < (1 << 15);
  const bool rows_first = s.m > s.n;
  while (!small && batch * row_blocks * column_blocks % threads != 0 && batch * row_blocks * column_blocks < 8 * threads) {
    const bool more_columns = s.n / (column_blocks + 1) >= 4 * kern.nr, more_rows = s.m / (row_blocks + 1) >= 4 * kern.mr;
    if (more_rows && (rows_first || !more_columns)) ++row_blocks;
    else if (more_columns) ++column_blocks;
    else break;
  }
  const std::int64_t rows = round_up((s.m + row_blocks - 1) / row_blocks, kern.mr);
  const std::int64_t cols = round_up((s.n + column_blocks - 1) / column_blocks, kern.nr);
  row_blocks = (s.m + rows - 1) / rows;
  column_blocks = (s.n + cols - 1) / cols;
  const std::int64_t per_entry = row_blocks * column_blocks;
  auto task = [&](std::int64_t t) {
    const std::int64_t e = t / per_entry, rb = t % per_entry / column_blocks, cb = t % column_blocks;
    const std::int64_t i0 = rb * rows, j0 = cb * cols;
    kern.run(s, Block{&entries[static_cast<std::size_t>(e)], i0, std::min(rows, s.m - i0), j0, std::min(cols, s.n - j0)});
  };
  if (small) {
    for (std::int64_t t = 0; t < batch * per_entry; ++t) task(t);
  } else {
    pool.parallel_for(batch * per_entry, task);
  }
}

}  // namespace qkv::backend::cpu
