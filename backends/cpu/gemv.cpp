// Few-row products (gemv.hpp), written once over the vector type and compiled per ISA
// (backends/cpu/isa.hpp).
#include "backends/cpu/gemv.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "backends/cpu/isa.hpp"
#include "backends/cpu/thread_pool.hpp"
#include "backends/cpu/vectors.hpp"
#include "ir/error.hpp"
#include "ir/half.hpp"

namespace qkv::backend::cpu {

namespace {

using simd::Lanes;
using simd::load;
using simd::splat;
using simd::store;
using simd::v16f;
using simd::v8f;

/// Elements [first, first + count) of b in f32: where b holds them, or widened into `buffer`
/// (at least count floats; the vectorised conversions of ir/half.hpp).
const float* f32_run(const void* b, DType stored, std::int64_t first, std::int64_t count, float* buffer) {
  if (stored == DType::f32) return static_cast<const float*>(b) + first;
  if (stored == DType::f16) to_float(static_cast<const Half*>(b) + first, buffer, count);
  else to_float(static_cast<const BFloat16*>(b) + first, buffer, count);
  return buffer;
}

/// Lanes<V>::n elements of B at p in f32: f32 loaded, bf16 widened in registers (its bits are
/// f32's upper half), f16 by the AVX-512 conversion (16 lanes: only the AVX-512 copy reads f16
/// directly; the narrower ones read runs widened into a buffer, as float).
template <class V> [[gnu::always_inline]] inline V load_as_f32(const float* p) { return load<V>(p); }
using u16x8 = std::uint16_t __attribute__((vector_size(16)));
using u16x16 = std::uint16_t __attribute__((vector_size(32)));
using u32x8 = std::uint32_t __attribute__((vector_size(32)));
using u32x16 = std::uint32_t __attribute__((vector_size(64)));
template <class V> [[gnu::always_inline]] inline V load_as_f32(const BFloat16* p) {
  constexpr bool wide16 = Lanes<V>::n == 16;
#if defined(__x86_64__)
  if constexpr (wide16) {
    // One zero-extending load to 16 lanes and a shift: GCC 12 builds the conversion below from two
    // 8-lane halves and an insert, which left a bf16 product at 13 GB/s where f32's reads 19.7.
    V v;
    asm("vpmovzxwd %1, %0\n\tvpslld $16, %0, %0" : "=v"(v) : "m"(*reinterpret_cast<const std::uint16_t(*)[16]>(p)));
    return v;
  }
#endif
  using U16 = std::conditional_t<wide16, u16x16, u16x8>;
  using U32 = std::conditional_t<wide16, u32x16, u32x8>;
  U16 bits;
  std::memcpy(&bits, p, sizeof bits);
  const U32 wide = __builtin_convertvector(bits, U32) << 16;
  V v;
  std::memcpy(&v, &wide, sizeof v);
  return v;
}
#if defined(__x86_64__)
template <class V> [[gnu::always_inline]] inline V load_as_f32(const Half* p) {
  static_assert(Lanes<V>::n == 16, "f16 is read directly by the AVX-512 copy only");
  // The instruction as such: an intrinsic would not inline through the generic templates
  // (their target is the baseline's), and GCC 12 converts _Float16 vectors lane by lane.
  V v;
  asm("vcvtph2ps %1, %0" : "=v"(v) : "m"(*reinterpret_cast<const std::uint16_t(*)[16]>(p)));
  return v;
}
#endif
inline float as_f32(float x) { return x; }
inline float as_f32(BFloat16 x) { return to_float(x); }
inline float as_f32(Half x) { return to_float(x); }

/// Whether a kernel copy of V reads f16 directly (the AVX-512 one) or widens runs into a buffer.
template <class V> constexpr bool kReadsF16 = Lanes<V>::n == 16;

/// The sum of v's lanes as a tree of halves: lane i plus lane i + n/2, then the first quarter's
/// plus the second's, ... (the order lane_sums gives every vector of a group).
template <class V> [[gnu::always_inline]] inline float lane_sum(const V& v) {
  constexpr int L = Lanes<V>::n;
  float s[L];
  for (int l = 0; l < L; ++l) s[l] = v[l];
  for (int w = L / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) s[l] = s[l] + s[l + w];
  return s[0];
}

/// One level of lane_sums: x and y each hold blocks of partial sums, a block per vector; the
/// result holds each block's two halves added, x's blocks first, then y's (lo picks the first
/// halves of x's and y's blocks side by side, hi the second).
template <class V, class I> [[gnu::always_inline]] inline V add_halves(const V& x, const V& y, const I& lo, const I& hi) {
  return __builtin_shuffle(x, y, lo) + __builtin_shuffle(x, y, hi);
}

/// The lane sums of n = Lanes<V>::n vectors: lane i of the result is lane_sum(v[i]), the same bits
/// (each level adds the same pairs: a vector's halves, then its quarters, ...), in log2(n) levels
/// of two shuffles and an add per pair of vectors instead of n scalar adds per vector. The
/// horizontal sums had cost a few-row product's scores as much as its multiplies.
[[gnu::always_inline]] inline v16f lane_sums(const v16f (&v)[16]) {
  using I = simd::v16i;
  const I lo1{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}, hi1{8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
  const I lo2{0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27}, hi2{4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
  const I lo3{0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29}, hi3{2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31};
  const I lo4{0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30}, hi4{1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
  v16f a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i) a[i] = add_halves(v[2 * i], v[2 * i + 1], lo1, hi1);  // [v0's 8 partials, v1's 8], ...
  for (int i = 0; i < 4; ++i) b[i] = add_halves(a[2 * i], a[2 * i + 1], lo2, hi2);  // 4 each of v0..v3, ...
  for (int i = 0; i < 2; ++i) c[i] = add_halves(b[2 * i], b[2 * i + 1], lo3, hi3);  // 2 each of v0..v7, ...
  return add_halves(c[0], c[1], lo4, hi4);
}
[[gnu::always_inline]] inline v8f lane_sums(const v8f (&v)[8]) {
  using I = simd::v8i;
  const I lo1{0, 1, 2, 3, 8, 9, 10, 11}, hi1{4, 5, 6, 7, 12, 13, 14, 15};
  const I lo2{0, 1, 4, 5, 8, 9, 12, 13}, hi2{2, 3, 6, 7, 10, 11, 14, 15};
  const I lo3{0, 2, 4, 6, 8, 10, 12, 14}, hi3{1, 3, 5, 7, 9, 11, 13, 15};
  v8f a[4], b[2];
  for (int i = 0; i < 4; ++i) a[i] = add_halves(v[2 * i], v[2 * i + 1], lo1, hi1);
  for (int i = 0; i < 2; ++i) b[i] = add_halves(a[2 * i], a[2 * i + 1], lo2, hi2);
  return add_halves(b[0], b[1], lo3, hi3);
}

/// Elements of B's rows widened at a time (a half B's runs stay in L1 between conversion and use).
constexpr std::int64_t kRun = 512;

/// C runs of B of `len` elements, run j from element first + j * stride: where B holds them, or
/// (Widen) widened into the j-th kRun slot of `buffer`.
template <bool Widen, class T, int C>
[[gnu::always_inline]] inline void runs_of(const void* b, DType stored, std::int64_t first, std::int64_t stride, std::int64_t len, float* buffer,
                                           const T* (&run)[C]) {
  for (int j = 0; j < C; ++j) {
    if constexpr (Widen) run[j] = f32_run(b, stored, first + j * stride, len, buffer + j * kRun);
    else run[j] = static_cast<const T*>(b) + first + j * stride;
  }
}

/// Elements ahead of the one read that a stream of B in 16 bits asks the cache for (0: none).
/// Hardware prefetching alone left a bf16 product reading 15 GB/s where an f32 one read 20 on a
/// 2-core Xeon: half the bytes per element, half the lines in flight. 512 bytes ahead: 19-22.
template <class T> constexpr std::int64_t kPrefetchDistance = std::is_same_v<T, BFloat16> || std::is_same_v<T, Half> ? 256 : 0;
/// Asks for the line kPrefetchDistance<T> elements past p (an address only, which may lie past
/// the end of B: a prefetch never faults, and the pointer is not formed from p's array).
template <class T> [[gnu::always_inline]] inline void prefetch_ahead(const T* p) {
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<std::uintptr_t>(p) + sizeof(T) * kPrefetchDistance<T>));
}

/// B stored transposed, [n, k]: out[r, c] is a dot product of x's row r with B's row c, both
/// contiguous. C rows of B at a time, each read once for all R rows of x. T: B's elements as
/// read (Widen: runs of an f16 B converted into `buffer` first, read as float).
template <class V, int R, int C, class T, bool Widen>
[[gnu::always_inline]] inline void dot_columns(const float* x, std::int64_t k, const void* b, DType stored, std::int64_t c, float* buffer, float* out,
                                               std::int64_t n) {
  constexpr int L = Lanes<V>::n;
  V acc[R][C];
  float tail[R][C];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j) acc[r][j] = V{}, tail[r][j] = 0.0f;
  for (std::int64_t k0 = 0; k0 < k; k0 += kRun) {
    const std::int64_t len = std::min(kRun, k - k0);
    const T* row[C];
    runs_of<Widen>(b, stored, c * k + k0, k, len, buffer, row);
    std::int64_t i = 0;
    for (; i + L <= len; i += L) {
      V w[C];
      if constexpr ((kPrefetchDistance<T>) > 0)
        for (int j = 0; j < C; ++j) prefetch_ahead(row[j] + i);
      for (int j = 0; j < C; ++j) w[j] = load_as_f32<V>(row[j] + i);
      for (int r = 0; r < R; ++r) {
        const V xv = load<V>(x + r * k + k0 + i);
        for (int j = 0; j < C; ++j) acc[r][j] += xv * w[j];
      }
    }
    for (; i < len; ++i)
      for (int r = 0; r < R; ++r)
        for (int j = 0; j < C; ++j) tail[r][j] += x[r * k + k0 + i] * as_f32(row[j][i]);
  }
  // The R x C dot products' lane sums, a group of L accumulators at a time (the rest one by one:
  // the same bits either way, so a row's result does not depend on how many rows share the call).
  float sums[R * C];
  int done = 0;
  for (; done + L <= R * C; done += L) {
    V group[L];
    for (int i = 0; i < L; ++i) group[i] = acc[(done + i) / C][(done + i) % C];
    const V s = lane_sums(group);
    for (int i = 0; i < L; ++i) sums[done + i] = s[i];
  }
  for (; done < R * C; ++done) sums[done] = lane_sum(acc[done / C][done % C]);
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < C; ++j) out[r * n + c + j] = sums[r * C + j] + tail[r][j];
}

/// Calls K::run<V, R, T, Widen>(args...) for x's `rows` (R from 1 to kFewRows: the kernels'
/// accumulators in registers) and B's dtype (T and Widen: see dot_columns). Switches, not
/// lambdas, pick them: a lambda would not be compiled for the ISA of the copy calling it.
template <class V, class K, int R, class... Args> [[gnu::always_inline]] inline void by_dtype(DType stored, Args... args) {
  if (stored == DType::bf16) return K::template run<V, R, BFloat16, false>(args...);
#if defined(__x86_64__)
  if constexpr (kReadsF16<V>)
    if (stored == DType::f16) return K::template run<V, R, Half, false>(args...);
#endif
  if (stored == DType::f16) return K::template run<V, R, float, true>(args...);
  K::template run<V, R, float, false>(args...);
}
template <class V, class K, class... Args> [[gnu::always_inline]] inline void by_rows_and_dtype(std::int64_t rows, DType stored, Args... args) {
  switch (rows) {
    case 1: return by_dtype<V, K, 1>(stored, args...);
    case 2: return by_dtype<V, K, 2>(stored, args...);
    case 3: return by_dtype<V, K, 3>(stored, args...);
    default: return by_dtype<V, K, kFewRows>(stored, args...);
  }
}

/// Columns [c0, c1) of the transposed product, for R rows of x.
struct TransposedColumns {
  template <class V, int R, class T, bool Widen>
  [[gnu::always_inline]] static void run(const float* x, std::int64_t k, std::int64_t n, const void* b, DType stored, std::int64_t c0,
                                         std::int64_t c1, float* buffer, float* out) {
    std::int64_t c = c0;
    for (; c + 4 <= c1; c += 4) dot_columns<V, R, 4, T, Widen>(x, k, b, stored, c, buffer, out, n);
    for (; c < c1; ++c) dot_columns<V, R, 1, T, Widen>(x, k, b, stored, c, buffer, out, n);
  }
};

template <class V>
[[gnu::always_inline]] inline void transposed_block_impl(const float* x, std::int64_t rows, std::int64_t k, std::int64_t n, const void* b,
                                                         DType stored, std::int64_t c0, std::int64_t c1, float* out) {
  thread_local std::vector<float> buffer;
  if (buffer.size() < 4 * kRun) buffer.resize(4 * kRun);
  by_rows_and_dtype<V, TransposedColumns>(rows, stored, x, k, n, b, stored, c0, c1, buffer.data(), out);
}

/// partial[R, n] += x's columns [j, j + J) times B's rows [j, j + J) (J contiguous streams), each
/// element of B read once for all R rows of x, the partial sums loaded and stored once. T and
/// Widen: as dot_columns.
template <class V, int R, int J, class T, bool Widen>
[[gnu::always_inline]] inline void add_rows_of_b(const float* x, std::int64_t k, std::int64_t n, const void* b, DType stored, std::int64_t j,
                                                 float* buffer, float* partial) {
  constexpr int L = Lanes<V>::n;
  V s[R][J];
  for (int r = 0; r < R; ++r)
    for (int q = 0; q < J; ++q) s[r][q] = splat<V>(x[r * k + j + q]);
  for (std::int64_t c0 = 0; c0 < n; c0 += kRun) {
    const std::int64_t len = std::min(kRun, n - c0);
    const T* w[J];
    runs_of<Widen>(b, stored, j * n + c0, n, len, buffer, w);
    std::int64_t i = 0;
    for (; i + L <= len; i += L) {
      V wv[J];
      if constexpr ((kPrefetchDistance<T>) > 0)
        for (int q = 0; q < J; ++q) prefetch_ahead(w[q] + i);
      for (int q = 0; q < J; ++q) wv[q] = load_as_f32<V>(w[q] + i);
      for (int r = 0; r < R; ++r) {
        float* o = partial + r * n + c0 + i;
        V sum = load<V>(o);
        for (int q = 0; q < J; ++q) sum += s[r][q] * wv[q];
        store(o, sum);
      }
    }
    for (; i < len; ++i)
      for (int r = 0; r < R; ++r)
        for (int q = 0; q < J; ++q) partial[r * n + c0 + i] += x[r * k + j + q] * as_f32(w[q][i]);
  }
}

/// B stored as [k, n]: B's rows [j0, j1) times x's columns [j0, j1), summed into `partial`
/// [R, n] (zeroed first), four rows of B at a time.
struct RowBlock {
  template <class V, int R, class T, bool Widen>
  [[gnu::always_inline]] static void run(const float* x, std::int64_t k, std::int64_t n, const void* b, DType stored, std::int64_t j0,
                                         std::int64_t j1, float* buffer, float* partial) {
    std::fill_n(partial, R * n, 0.0f);
    std::int64_t j = j0;
    for (; j + 4 <= j1; j += 4) add_rows_of_b<V, R, 4, T, Widen>(x, k, n, b, stored, j, buffer, partial);
    for (; j < j1; ++j) add_rows_of_b<V, R, 1, T, Widen>(x, k, n, b, stored, j, buffer, partial);
  }
};

template <class V>
[[gnu::always_inline]] inline void row_block_impl(const float* x, std::int64_t rows, std::int64_t k, std::int64_t n, const void* b, DType stored,
                                                  std::int64_t j0, std::int64_t j1, float* partial) {
  thread_local std::vector<float> buffer;
  if (buffer.size() < 4 * kRun) buffer.resize(4 * kRun);
  by_rows_and_dtype<V, RowBlock>(rows, stored, x, k, n, b, stored, j0, j1, buffer.data(), partial);
}

}  // namespace

QKV_ISA_DISPATCH(void, transposed_block,
                 (const float* x, std::int64_t rows, std::int64_t k, std::int64_t n, const void* b, DType stored, std::int64_t c0, std::int64_t c1,
                  float* out),
                 (x, rows, k, n, b, stored, c0, c1, out), v16f, v8f)
QKV_ISA_DISPATCH(void, row_block,
                 (const float* x, std::int64_t rows, std::int64_t k, std::int64_t n, const void* b, DType stored, std::int64_t j0, std::int64_t j1,
                  float* partial),
                 (x, rows, k, n, b, stored, j0, j1, partial), v16f, v8f)

void few_rows_product(const float* x, std::int64_t rows, std::int64_t k, std::int64_t n, const void* b, DType stored, bool transposed, float* out) {
  QKV_ASSERT(rows >= 1 && rows <= kFewRows, "few_rows_product takes 1 to kFewRows rows");
  ThreadPool& pool = ThreadPool::global();
  // A B of up to 256 KiB is one task; a larger one is split into tasks of at most 256 KiB and at
  // least 16 of them (a bf16 projection of 768 x 768 in 256 KiB tasks was 5 tasks on 2 threads).
  // Both depend on the shapes only, so the sums' order does not depend on the threads.
  const std::int64_t element = stored == DType::f32 ? 4 : 2, lines = transposed ? n : k;
  const std::int64_t by_bytes = std::max<std::int64_t>(1, (std::int64_t{1} << 18) / std::max<std::int64_t>(1, element * (transposed ? k : n)));
  const std::int64_t per_task = std::max<std::int64_t>(1, by_bytes >= lines ? lines : std::min(by_bytes, (lines + 15) / 16));
  if (transposed) {
    const std::int64_t columns = (per_task + 3) / 4 * 4, tasks = (n + columns - 1) / columns;
    return pool.parallel_for(tasks,
                             [&](std::int64_t t) { transposed_block(x, rows, k, n, b, stored, t * columns, std::min(n, (t + 1) * columns), out); });
  }
  // Row blocks of B summed into partial products, then added in block order (the same sums
  // whatever the threads).
  const std::int64_t tasks = (k + per_task - 1) / per_task;
  if (tasks <= 1) return row_block(x, rows, k, n, b, stored, 0, k, out);  // k == 0 too: zeros
  std::vector<float> partials(static_cast<std::size_t>(tasks * rows * n));
  pool.parallel_for(tasks, [&](std::int64_t t) {
    row_block(x, rows, k, n, b, stored, t * per_task, std::min(k, (t + 1) * per_task), partials.data() + t * rows * n);
  });
  const std::int64_t size = rows * n;
  const std::int64_t parts = std::min<std::int64_t>(pool.size(), (size + 4095) / 4096), chunk = (size + parts - 1) / parts;
  pool.parallel_for(parts, [&](std::int64_t part) {
    const std::int64_t i0 = part * chunk, i1 = std::min(size, i0 + chunk);
    for (std::int64_t i = i0; i < i1; ++i) {
      float s = partials[static_cast<std::size_t>(i)];
      for (std::int64_t t = 1; t < tasks; ++t) s += partials[static_cast<std::size_t>(t * size + i)];
      out[i] = s;
    }
  });
}

}  // namespace qkv::backend::cpu
